#include "ps_server/service/chunk_streams.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "ps_server/core/streamed_update.h"
#include "ps_server/core/update_settings.h"
#include "rpc/chunk_wire.h"

namespace pst {
namespace {

// Each gradient's element size, in header order.
std::vector<int> ElementBytes(const PushRequest& header) {
  std::vector<int> sizes;
  for (const Tensor& g : header.gradients()) sizes.push_back(DTypeBytes(g.dtype()));
  return sizes;
}

// Sets up `request` from the stream's header, with every gradient's buffer
// sized as `bytes` (what the shard expects); returns the sequence the pieces
// must follow. The buffers keep their old bytes: the pieces overwrite every
// one of them before the stream is accepted.
PieceSequence BeginPush(const PushRequest& header, std::vector<int64_t> bytes,
                        PushRequest* request) {
  request->set_worker(header.worker());
  request->set_computed_at_version(header.computed_at_version());
  if (header.has_sequence()) {
    request->set_sequence(header.sequence());
  } else {
    request->clear_sequence();
  }
  // Rows and rates travel inline in the header.
  *request->mutable_rows() = header.rows();
  CopyRates(header, request);
  auto* gradients = request->mutable_gradients();
  if (gradients->size() > header.gradients_size()) {
    gradients->DeleteSubrange(header.gradients_size(),
                              gradients->size() - header.gradients_size());
  }
  while (gradients->size() < header.gradients_size()) gradients->Add();
  for (int i = 0; i < header.gradients_size(); ++i) {
    const Tensor& announced = header.gradients(i);
    Tensor* gradient = gradients->Mutable(i);
    gradient->set_name(announced.name());
    gradient->mutable_shape()->CopyFrom(announced.shape());
    gradient->set_dtype(announced.dtype());
    gradient->mutable_data()->resize(bytes[i]);
  }
  return PieceSequence(std::move(bytes), ElementBytes(header));
}

// InvalidArgument naming the first non-finite value in `data`, the bytes
// of gradient `name` from byte `offset` on.
absl::Status CheckPieceFinite(const std::string& name, DType dtype, int64_t offset,
                              absl::string_view data) {
  return CheckGradientFinite(data, dtype, offset / DTypeBytes(dtype), name);
}

// Copies the chunk's pieces into `request`, checking each as it lands (in
// cache) for a non-finite value, which refuses the whole push.
absl::Status AddPieces(const ReceivedChunk& chunk, PieceSequence* sequence,
                       PushRequest* request) {
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor, piece.offset, piece.size); !s.ok()) {
      return s;
    }
    Tensor* gradient = request->mutable_gradients(piece.tensor);
    char* data = gradient->mutable_data()->data() + piece.offset;
    chunk.CopyData(piece, data);
    if (absl::Status s = CheckPieceFinite(gradient->name(), gradient->dtype(), piece.offset,
                                          absl::string_view(data, piece.size));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Applies the chunk's pieces to `update` a cache-sized block at a time:
// copied out of gRPC's buffers, checked for non-finite values and staged
// while in L1. A non-finite value refuses the whole push.
absl::Status ApplyPieces(const ReceivedChunk& chunk, const PushRequest& header,
                         PieceSequence* sequence, StreamedUpdate* update) {
  constexpr int64_t kBlockElements = 4096;
  alignas(64) std::array<char, kBlockElements * sizeof(float)> wire;
  alignas(64) std::array<float, kBlockElements> block;
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor, piece.offset, piece.size); !s.ok()) {
      return s;
    }
    const Tensor& gradient = header.gradients(piece.tensor);
    const int element_bytes = DTypeBytes(gradient.dtype());
    ReceivedChunk::PieceReader reader(chunk, piece);
    int64_t offset = piece.offset;
    // float32 lands in `block` as it is; 16-bit types are decoded into it.
    char* landing = element_bytes == sizeof(float) ? reinterpret_cast<char*>(block.data())
                                                   : wire.data();
    while (reader.left() >= element_bytes) {  // pieces hold whole elements (Accept)
      const int64_t elements = std::min(kBlockElements, reader.left() / element_bytes);
      const absl::string_view data(landing, elements * element_bytes);
      reader.Read(static_cast<int64_t>(data.size()), landing);
      if (absl::Status s = CheckPieceFinite(gradient.name(), gradient.dtype(), offset, data);
          !s.ok()) {
        return s;
      }
      const std::span<float> values(block.data(), elements);
      if (landing == wire.data()) DecodeValues(data, gradient.dtype(), values);
      update->Apply(piece.tensor, offset / element_bytes, values);
      offset += static_cast<int64_t>(data.size());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PushIntake::Refuse(absl::Status status) {
  shard_->CountRejectedPush();
  return status;
}

absl::Status PushIntake::Begin(const PushRequest& header, const Admit& admit,
                               std::function<void()> cancel) {
  header_ = header;
  absl::StatusOr<ParameterShard::StreamedPush> push = shard_->BeginStreamedPush(header_);
  if (!push.ok()) return push.status();  // counted by the shard
  update_ = std::move(push->update);
  if (admit) {
    int64_t buffered = 0;
    // Rows are not counted: they came whole in the header, one message
    // that gRPC's bounds (--max_message_bytes) hold, and the budget is a
    // multiple of the rows the shard holds, which a push's rows may pass
    // before the first rows are trained.
    if (update_ == nullptr) {
      for (int64_t bytes : push->bytes) buffered += bytes;
    }
    if (absl::Status s = admit(header_, buffered); !s.ok()) {
      update_.reset();
      return s;
    }
  }
  if (update_ != nullptr) {
    update_->SetCancel(std::move(cancel));
    sequence_.emplace(std::move(push->bytes), ElementBytes(header_));
  } else {
    sequence_.emplace(BeginPush(header_, std::move(push->bytes), buffer_));
  }
  return absl::OkStatus();
}

absl::Status PushIntake::Take(const ReceivedChunk& chunk) {
  if (update_ != nullptr) update_->Progressed();
  absl::Status added = update_ != nullptr ? ApplyPieces(chunk, header_, &*sequence_, update_.get())
                                          : AddPieces(chunk, &*sequence_, buffer_);
  if (!added.ok()) {
    update_.reset();  // nothing of it lands
    return Refuse(added);
  }
  return absl::OkStatus();
}

std::optional<absl::Status> PushIntake::Finish(PushResponse* response) {
  if (absl::Status s = sequence_->Finish(); !s.ok()) {
    update_.reset();
    return Refuse(s);
  }
  if (update_ != nullptr) return shard_->CommitStreamedPush(std::move(update_), response);
  return shard_->TryPush(*buffer_, response, {.values_finite = true});
}

void CapturePull(int64_t version, const std::vector<const Variable*>& variables, DType dtype,
                 PullPayload* out) {
  out->header.Clear();
  out->header.set_version(version);
  out->dtype = dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype;
  out->values.clear();
  for (const Variable* v : variables) {
    Tensor* tensor = out->header.add_variables();
    tensor->set_name(v->name);
    tensor->mutable_shape()->Assign(v->shape.begin(), v->shape.end());
    tensor->set_dtype(out->dtype);
    out->values.push_back(v->values);
  }
}

int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write,
                        const google::protobuf::MessageLite* last_extra) {
  const int element_bytes = DTypeBytes(payload->dtype);
  const bool referenced = element_bytes == sizeof(float);  // float32 bytes are the values
  std::vector<int64_t> tensor_bytes;
  std::vector<const char*> wire;  // where each tensor's wire bytes are
  std::vector<PayloadPin> pins;
  int64_t encoded_bytes = 0;
  for (const Values& values : payload->values) {
    tensor_bytes.push_back(static_cast<int64_t>(values->size()) * element_bytes);
    encoded_bytes += referenced ? 0 : tensor_bytes.back();
  }
  payload->encoded.resize(encoded_bytes);
  char* next = payload->encoded.data();
  for (const Values& values : payload->values) {
    if (referenced) {
      wire.push_back(reinterpret_cast<const char*>(values->data()));
      pins.push_back(values);
    } else {
      EncodeValuesTo(*values, payload->dtype, next);
      wire.push_back(next);
      pins.push_back(payload);
      next += values->size() * element_bytes;
    }
  }
  // From here the slices' pins hold the buffers; the payload need not.
  payload->values.clear();
  const std::vector<std::vector<PieceRef>> plan =
      PlanChunks(tensor_bytes, std::vector<int>(tensor_bytes.size(), element_bytes));
  ChunkBuilder builder;
  int64_t sent = 0;
  for (size_t c = 0; c < plan.size(); ++c) {
    if (c == 0) builder.SetHeader(payload->header);
    for (const PieceRef& ref : plan[c]) {
      builder.AddPiece(ref.tensor, ref.offset,
                       {wire[ref.tensor] + ref.offset, static_cast<size_t>(ref.bytes)},
                       pins[ref.tensor]);
    }
    const bool last = c + 1 == plan.size();
    if (last && last_extra != nullptr) builder.SetExtra(*last_extra);
    grpc::ByteBuffer message = builder.Finish();
    sent += static_cast<int64_t>(message.Length());
    if (!write(message, last)) return -1;
  }
  return sent;
}

void AskForPushedVariables(const PushRequest& push, PullRequest* pull) {
  pull->set_worker(push.worker());
  if (pull->names_size() == push.gradients_size()) {
    // The worker's own order (the order its next forward pass needs the
    // values in), if it names exactly the pushed variables.
    std::vector<absl::string_view> pushed, asked(pull->names().begin(), pull->names().end());
    for (const Tensor& gradient : push.gradients()) pushed.push_back(gradient.name());
    std::sort(pushed.begin(), pushed.end());
    std::sort(asked.begin(), asked.end());
    if (pushed == asked) return;
  }
  pull->clear_names();
  for (const Tensor& gradient : push.gradients()) pull->add_names(gradient.name());
}

PullResponse PushedVariablesHeader(const PushRequest& push, DType dtype) {
  PullResponse header;
  for (const Tensor& gradient : push.gradients()) {
    Tensor* variable = header.add_variables();
    variable->set_name(gradient.name());
    variable->mutable_shape()->CopyFrom(gradient.shape());
    variable->set_dtype(dtype);
  }
  return header;
}

StagedAnswer::StagedAnswer(const PushRequest& header, DType dtype,
                           std::shared_ptr<PullPayload> payload)
    : dtype_(dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype),
      payload_(std::move(payload)),
      answer_(PushedVariablesHeader(header, dtype_)),
      gradient_element_bytes_(ElementBytes(header)) {}

void StagedAnswer::Add(const ReceivedChunk& chunk, const StreamedUpdate& update) {
  if (!header_sent_) {
    header_sent_ = true;
    builder_.SetHeader(answer_);
    PrepareEncoding(update);
  }
  const int element_bytes = DTypeBytes(dtype_);
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    const int64_t first = piece.offset / gradient_element_bytes_[piece.tensor];
    const int64_t count = piece.size / gradient_element_bytes_[piece.tensor];
    const Values& staged = update.staged_values(piece.tensor);
    const std::span<const float> values(staged->data() + first, count);
    const int64_t offset = first * element_bytes;
    if (element_bytes == sizeof(float)) {  // float32: the staged values are the wire bytes
      builder_.AddPiece(piece.tensor, offset,
                        {reinterpret_cast<const char*>(values.data()), values.size_bytes()},
                        staged);
    } else {
      char* wire = encoded_[piece.tensor] + offset;
      EncodeValuesTo(values, dtype_, wire);
      builder_.AddPiece(piece.tensor, offset, {wire, static_cast<size_t>(count * element_bytes)},
                        payload_);
    }
  }
}

grpc::ByteBuffer StagedAnswer::Take(const ExchangeDone* done) {
  if (done != nullptr) builder_.SetExtra(*done);
  return builder_.Finish();
}

void StagedAnswer::PrepareEncoding(const StreamedUpdate& update) {
  const int element_bytes = DTypeBytes(dtype_);
  if (element_bytes == sizeof(float)) return;
  int64_t total = 0;
  for (int i = 0; i < answer_.variables_size(); ++i) {
    total += static_cast<int64_t>(update.staged_values(i)->size()) * element_bytes;
  }
  payload_->encoded.resize(total);
  char* next = payload_->encoded.data();
  for (int i = 0; i < answer_.variables_size(); ++i) {
    encoded_.push_back(next);
    next += update.staged_values(i)->size() * element_bytes;
  }
}

std::shared_ptr<PullPayload> PullPayloadPool::Take() {
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<PullPayload>& payload : payloads_) {
    if (payload.use_count() == 1) {
      // gRPC's last read of its bytes happened before it dropped its pin.
      std::atomic_thread_fence(std::memory_order_acquire);
      return payload;
    }
  }
  if (payloads_.size() >= max_kept_) return std::make_shared<PullPayload>();
  payloads_.push_back(std::make_shared<PullPayload>());
  return payloads_.back();
}

}  // namespace pst
