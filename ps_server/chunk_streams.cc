#include "ps_server/chunk_streams.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"

namespace pst {
namespace {

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
  std::vector<int> element_bytes;
  for (int i = 0; i < header.gradients_size(); ++i) {
    const Tensor& announced = header.gradients(i);
    Tensor* gradient = gradients->Mutable(i);
    gradient->set_name(announced.name());
    gradient->mutable_shape()->CopyFrom(announced.shape());
    gradient->set_dtype(announced.dtype());
    gradient->mutable_data()->resize(bytes[i]);
    element_bytes.push_back(DTypeBytes(announced.dtype()));
  }
  return PieceSequence(std::move(bytes), std::move(element_bytes));
}

absl::Status AddPieces(const ReceivedChunk& chunk, PieceSequence* sequence,
                       PushRequest* request) {
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor, piece.offset, piece.size); !s.ok()) {
      return s;
    }
    std::string* data = request->mutable_gradients(piece.tensor)->mutable_data();
    chunk.CopyData(piece, data->data() + piece.offset);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReceivePushStream(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                               ParameterShard* shard, PushRequest* request) {
  // The shard counts the refusals of a header it checks; the rest are counted here.
  auto refuse = [shard](absl::Status status) {
    shard->CountRejectedPush();
    return status;
  };
  grpc::ByteBuffer message;
  ReceivedChunk chunk;
  PushRequest header;
  std::optional<PieceSequence> sequence;
  while (reader->Read(&message)) {
    if (absl::Status s = chunk.Parse(&message); !s.ok()) return refuse(s);
    if (!sequence) {
      if (!chunk.has_header()) {
        return refuse(absl::InvalidArgumentError("a push stream must start with its header"));
      }
      if (!header.ParseFromString(chunk.header())) {
        return refuse(absl::InvalidArgumentError("a push stream's header is not a PushRequest"));
      }
      absl::StatusOr<std::vector<int64_t>> bytes = shard->StreamedPushBytes(header);
      if (!bytes.ok()) return bytes.status();
      sequence.emplace(BeginPush(header, std::move(*bytes), request));
    } else if (chunk.has_header()) {
      return refuse(absl::InvalidArgumentError("a push stream carries a second header"));
    }
    if (absl::Status s = AddPieces(chunk, &*sequence, request); !s.ok()) return refuse(s);
  }
  if (!sequence) return refuse(absl::InvalidArgumentError("the push stream was empty: no header"));
  if (absl::Status s = sequence->Finish(); !s.ok()) return refuse(s);
  return absl::OkStatus();
}

void EncodePullPayload(int64_t version, const std::vector<const Variable*>& variables,
                       DType dtype, PullPayload* out) {
  const int element_bytes = DTypeBytes(dtype);
  out->header.Clear();
  out->header.set_version(version);
  out->tensor_bytes.clear();
  int64_t total = 0;
  for (const Variable* v : variables) {
    Tensor* tensor = out->header.add_variables();
    tensor->set_name(v->name);
    tensor->mutable_shape()->Assign(v->shape.begin(), v->shape.end());
    tensor->set_dtype(dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype);
    out->tensor_bytes.push_back(static_cast<int64_t>(v->values.size()) * element_bytes);
    total += out->tensor_bytes.back();
  }
  out->bytes.resize(total);
  char* next = out->bytes.data();
  for (const Variable* v : variables) {
    EncodeValuesTo(v->values, dtype, next);
    next += v->values.size() * element_bytes;
  }
}

int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write) {
  const PayloadPin pin = payload;
  std::vector<int> element_bytes;
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (size_t t = 0; t < payload->tensor_bytes.size(); ++t) {
    element_bytes.push_back(DTypeBytes(payload->header.variables(static_cast<int>(t)).dtype()));
    starts.push_back(start);
    start += payload->tensor_bytes[t];
  }
  const std::vector<std::vector<PieceRef>> plan = PlanChunks(payload->tensor_bytes, element_bytes);
  ChunkBuilder builder;
  int64_t sent = 0;
  for (size_t c = 0; c < plan.size(); ++c) {
    if (c == 0) builder.SetHeader(payload->header);
    for (const PieceRef& ref : plan[c]) {
      builder.AddPiece(ref.tensor, ref.offset,
                       {payload->bytes.data() + starts[ref.tensor] + ref.offset,
                        static_cast<size_t>(ref.bytes)},
                       pin);
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
    if (payload.use_count() == 1) return payload;
  }
  payloads_.push_back(std::make_shared<PullPayload>());
  return payloads_.back();
}

}  // namespace pst
