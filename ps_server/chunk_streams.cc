#include "ps_server/chunk_streams.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"

namespace pst {
namespace {

// Sets up `request` from the stream's header, with every gradient's buffer
// sized as `bytes` (what the shard expects); returns the sequence the pieces
// must follow.
PieceSequence BeginPush(const PushRequest& header, std::vector<int64_t> bytes,
                        PushRequest* request) {
  request->set_worker(header.worker());
  request->set_computed_at_version(header.computed_at_version());
  std::vector<int> element_bytes;
  for (int i = 0; i < header.gradients_size(); ++i) {
    const Tensor& announced = header.gradients(i);
    Tensor* gradient = request->add_gradients();
    CopyHeader(announced, gradient);
    gradient->mutable_data()->resize(bytes[i]);
    element_bytes.push_back(DTypeBytes(announced.dtype()));
  }
  return PieceSequence(std::move(bytes), std::move(element_bytes));
}

absl::Status AddPieces(const PushChunk& chunk, PieceSequence* sequence, PushRequest* request) {
  for (const TensorPiece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor(), piece.offset(),
                                          static_cast<int64_t>(piece.data().size()));
        !s.ok()) {
      return s;
    }
    std::string* data = request->mutable_gradients(piece.tensor())->mutable_data();
    std::memcpy(data->data() + piece.offset(), piece.data().data(), piece.data().size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReceivePushStream(grpc::ServerReaderInterface<PushChunk>* reader,
                               ParameterShard* shard, PushRequest* request) {
  // The shard counts the refusals of a header it checks; the rest are counted here.
  auto refuse = [shard](absl::Status status) {
    shard->CountRejectedPush();
    return status;
  };
  PushChunk chunk;
  std::optional<PieceSequence> sequence;
  while (reader->Read(&chunk)) {
    if (!sequence) {
      if (!chunk.has_header()) {
        return refuse(absl::InvalidArgumentError("a push stream must start with its header"));
      }
      absl::StatusOr<std::vector<int64_t>> bytes = shard->StreamedPushBytes(chunk.header());
      if (!bytes.ok()) return bytes.status();
      sequence.emplace(BeginPush(chunk.header(), std::move(*bytes), request));
    } else if (chunk.has_header()) {
      return refuse(absl::InvalidArgumentError("a push stream carries a second header"));
    }
    if (absl::Status s = AddPieces(chunk, &*sequence, request); !s.ok()) return refuse(s);
  }
  if (!sequence) return refuse(absl::InvalidArgumentError("the push stream was empty: no header"));
  if (absl::Status s = sequence->Finish(); !s.ok()) return refuse(s);
  return absl::OkStatus();
}

void EncodePullChunks(int64_t version, const std::vector<const Variable*>& variables,
                      DType dtype, PullChunks* out) {
  const int element_bytes = DTypeBytes(dtype);
  std::vector<int64_t> tensor_bytes;
  for (const Variable* v : variables) {
    tensor_bytes.push_back(static_cast<int64_t>(v->values.size()) * element_bytes);
  }
  const std::vector<std::vector<PieceRef>> plan =
      PlanChunks(tensor_bytes, std::vector<int>(variables.size(), element_bytes));
  out->Clear();
  if (out->messages.size() < plan.size()) out->messages.resize(plan.size());
  out->used = plan.size();
  PullResponse* header = out->messages[0].mutable_header();
  header->set_version(version);
  for (const Variable* v : variables) {
    Tensor* tensor = header->add_variables();
    tensor->set_name(v->name);
    tensor->mutable_shape()->Assign(v->shape.begin(), v->shape.end());
    tensor->set_dtype(dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype);
  }
  for (size_t c = 0; c < plan.size(); ++c) {
    for (const PieceRef& ref : plan[c]) {
      TensorPiece* piece = out->messages[c].add_pieces();
      piece->set_tensor(ref.tensor);
      piece->set_offset(ref.offset);
      const std::span<const float> values(variables[ref.tensor]->values);
      EncodeValues(values.subspan(ref.offset / element_bytes, ref.bytes / element_bytes), dtype,
                   piece->mutable_data());
    }
  }
}

bool SendPullChunks(const PullChunks& chunks, grpc::ServerWriterInterface<PullChunk>* writer) {
  for (size_t c = 0; c < chunks.used; ++c) {
    grpc::WriteOptions options;
    if (c + 1 == chunks.used) options.set_last_message();
    if (!writer->Write(chunks.messages[c], options)) return false;
  }
  return true;
}

}  // namespace pst
