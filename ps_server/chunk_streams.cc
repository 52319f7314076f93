#include "ps_server/chunk_streams.h"

#include <array>
#include <atomic>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"

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
absl::Status NonFinitePiece(const std::string& name, DType dtype, int64_t offset,
                            absl::string_view data) {
  std::vector<float> values(data.size() / DTypeBytes(dtype));
  DecodeValues(data, dtype, values);
  const int64_t first = offset / DTypeBytes(dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient for \"", name, "\" has a non-finite value (", values[i], ") at element ",
          first + static_cast<int64_t>(i), "; nothing was applied"));
    }
  }
  return absl::OkStatus();
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
    const absl::string_view copied(data, piece.size);
    if (!EncodedFinite(copied, gradient->dtype())) {
      return NonFinitePiece(gradient->name(), gradient->dtype(), piece.offset, copied);
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
      if (!EncodedFinite(data, gradient.dtype())) {
        return NonFinitePiece(gradient.name(), gradient.dtype(), offset, data);
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

absl::Status ServePushStream(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                             std::function<void()> cancel, ParameterShard* shard,
                             PushRequest* buffer, PushResponse* response, ReceivedPush* received) {
  // The shard counts the refusals of a header it checks; the rest are counted here.
  auto refuse = [shard](absl::Status status) {
    shard->CountRejectedPush();
    return status;
  };
  *received = ReceivedPush{};
  grpc::ByteBuffer message;
  ReceivedChunk chunk;
  PushRequest header;
  std::optional<PieceSequence> sequence;
  std::unique_ptr<StreamedUpdate> update;  // null: buffered
  while (reader->Read(&message)) {
    if (update != nullptr) update->Progressed();
    received->bytes += static_cast<int64_t>(message.Length());
    if (absl::Status s = chunk.Parse(&message); !s.ok()) return refuse(s);
    if (!sequence) {
      if (!chunk.has_header()) {
        return refuse(absl::InvalidArgumentError("a push stream must start with its header"));
      }
      if (!chunk.ParseHeader(&header)) {
        return refuse(absl::InvalidArgumentError("a push stream's header is not a PushRequest"));
      }
      received->computed_at_version = header.computed_at_version();
      absl::StatusOr<ParameterShard::StreamedPush> push = shard->BeginStreamedPush(header);
      if (!push.ok()) return push.status();
      update = std::move(push->update);
      if (update != nullptr) update->SetCancel(std::move(cancel));
      if (update == nullptr) {
        sequence.emplace(BeginPush(header, std::move(push->bytes), buffer));
      } else {
        sequence.emplace(std::move(push->bytes), ElementBytes(header));
      }
    } else if (chunk.has_header()) {
      return refuse(absl::InvalidArgumentError("a push stream carries a second header"));
    }
    absl::Status added = update != nullptr ? ApplyPieces(chunk, header, &*sequence, update.get())
                                           : AddPieces(chunk, &*sequence, buffer);
    if (!added.ok()) return refuse(added);
  }
  if (!sequence) return refuse(absl::InvalidArgumentError("the push stream was empty: no header"));
  if (absl::Status s = sequence->Finish(); !s.ok()) return refuse(s);
  if (update != nullptr) return shard->CommitStreamedPush(std::move(update), response);
  return shard->Push(*buffer, response, {.values_finite = true});
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

int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write) {
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
    grpc::ByteBuffer message = builder.Finish();
    sent += static_cast<int64_t>(message.Length());
    grpc::WriteOptions options;
    if (c + 1 == plan.size()) options.set_last_message();
    if (!write(message, options)) return -1;
  }
  return sent;
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
  payloads_.push_back(std::make_shared<PullPayload>());
  return payloads_.back();
}

}  // namespace pst
