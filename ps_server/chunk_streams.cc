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

bool SendPullStream(const PullResponse& response, grpc::ServerWriterInterface<PullChunk>* writer) {
  std::vector<int64_t> tensor_bytes;
  std::vector<int> element_bytes;
  for (const Tensor& tensor : response.variables()) {
    tensor_bytes.push_back(static_cast<int64_t>(tensor.data().size()));
    element_bytes.push_back(DTypeBytes(tensor.dtype()));
  }
  const std::vector<std::vector<PieceRef>> chunks = PlanChunks(tensor_bytes, element_bytes);
  PullChunk chunk;
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunk.Clear();  // keeps the pieces' buffers for the next message
    if (c == 0) {
      PullResponse* header = chunk.mutable_header();
      header->set_version(response.version());
      for (const Tensor& tensor : response.variables()) CopyHeader(tensor, header->add_variables());
    }
    for (const PieceRef& ref : chunks[c]) {
      TensorPiece* piece = chunk.add_pieces();
      piece->set_tensor(ref.tensor);
      piece->set_offset(ref.offset);
      piece->mutable_data()->assign(response.variables(ref.tensor).data(), ref.offset, ref.bytes);
    }
    grpc::WriteOptions options;
    if (c + 1 == chunks.size()) options.set_last_message();
    if (!writer->Write(chunk, options)) return false;
  }
  return true;
}

}  // namespace pst
