// PsClient's streamed Pull and Push (PullStream / PushStream), for a shard
// whose share of the model is larger than one chunk.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "worker/ps_client.h"

namespace pst {

absl::Status PsClient::CheckPullHeader(int s, const PullResponse& header) const {
  const Shard& shard = shards_[s];
  if (header.variables_size() != static_cast<int>(shard.slices.size())) {
    return absl::InternalError(absl::StrCat("ps:", s, " answered a pull with ",
                                            header.variables_size(), " variables, expected ",
                                            shard.slices.size()));
  }
  for (size_t i = 0; i < shard.slices.size(); ++i) {
    const Slice& slice = slices_[shard.slices[i]];
    const Tensor& tensor = header.variables(static_cast<int>(i));
    if (tensor.name() != slice.name) {
      return absl::InternalError(absl::StrCat("ps:", s, " returned \"", tensor.name(),
                                              "\" where \"", slice.name, "\" was asked for"));
    }
    absl::StatusOr<int64_t> bytes = AnnouncedBytes(tensor);
    if (!bytes.ok() || DTypeBytes(tensor.dtype()) != DTypeBytes(wire_dtype_) ||
        *bytes != slice.count * DTypeBytes(wire_dtype_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ps:", s, " holds a different model: \"", slice.name, "\" has another shape or dtype",
          " (was it initialized by a job with another config?)"));
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::PullStreamed(int s, const PullRequest& request, absl::Duration timeout,
                                    const std::vector<std::span<float>>& out, int64_t* version) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  grpc::ClientContext context;
  SetDeadline(&context, timeout + kRpcDeadline);
  std::unique_ptr<grpc::ClientReader<PullChunk>> reader = shard.stub->PullStream(&context, request);
  PullChunk& chunk = *shard.pull_chunk;
  std::optional<PieceSequence> sequence;
  absl::Status problem;
  while (problem.ok() && reader->Read(&chunk)) {
    if (!sequence) {
      problem = chunk.has_header() ? CheckPullHeader(s, chunk.header())
                                   : absl::InternalError(absl::StrCat(
                                         "ps:", s, " started a pull stream without a header"));
      if (!problem.ok()) break;
      std::vector<int64_t> bytes;
      for (size_t i : shard.slices) bytes.push_back(slices_[i].count * element_bytes);
      std::vector<int> element_sizes(bytes.size(), element_bytes);
      sequence.emplace(std::move(bytes), std::move(element_sizes));
      *version = chunk.header().version();
    }
    for (const TensorPiece& piece : chunk.pieces()) {
      problem = sequence->Accept(piece.tensor(), piece.offset(),
                                 static_cast<int64_t>(piece.data().size()));
      if (!problem.ok()) break;
      const Slice& slice = slices_[shard.slices[piece.tensor()]];
      const int64_t first = slice.offset + piece.offset() / element_bytes;
      DecodeValues(piece.data(), wire_dtype_,
                   out[slice.variable].subspan(first, piece.data().size() / element_bytes));
    }
  }
  if (!problem.ok()) context.TryCancel();
  grpc::Status rpc = reader->Finish();
  if (!problem.ok()) {
    return absl::Status(problem.code(), absl::StrCat("ps:", s, " (", shard.address,
                                                     "): pull stream: ", problem.message()));
  }
  if (!rpc.ok()) return ShardError(s, rpc);
  if (!sequence) return absl::InternalError(absl::StrCat("ps:", s, " sent an empty pull stream"));
  if (absl::Status done = sequence->Finish(); !done.ok()) {
    return absl::InternalError(absl::StrCat("ps:", s, " pull stream: ", done.message()));
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushStreamed(int s, int64_t computed_at,
                                    const std::vector<std::span<const float>>& gradients,
                                    PushResponse* response) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  std::vector<int64_t> bytes;
  for (size_t i : shard.slices) bytes.push_back(slices_[i].count * element_bytes);
  const std::vector<std::vector<PieceRef>> chunks =
      PlanChunks(bytes, std::vector<int>(bytes.size(), element_bytes));
  grpc::ClientContext context;
  SetDeadline(&context, kRpcDeadline);
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer =
      shard.stub->PushStream(&context, response);
  PushChunk& chunk = *shard.push_chunk;
  bool open = true;
  for (size_t c = 0; c < chunks.size() && open; ++c) {
    chunk.Clear();  // keeps the pieces' buffers for this message
    if (c == 0) {
      PushRequest* header = chunk.mutable_header();
      header->set_worker(worker_);
      header->set_computed_at_version(computed_at);
      for (size_t i : shard.slices) {
        Tensor* tensor = header->add_gradients();
        tensor->set_name(slices_[i].name);
        tensor->mutable_shape()->Assign(slices_[i].shape.begin(), slices_[i].shape.end());
        tensor->set_dtype(wire_dtype_);
      }
    }
    for (const PieceRef& ref : chunks[c]) {
      const Slice& slice = slices_[shard.slices[ref.tensor]];
      TensorPiece* piece = chunk.add_pieces();
      piece->set_tensor(ref.tensor);
      piece->set_offset(ref.offset);
      EncodeValues(gradients[slice.variable].subspan(slice.offset + ref.offset / element_bytes,
                                                      ref.bytes / element_bytes),
                   wire_dtype_, piece->mutable_data());
    }
    grpc::WriteOptions options;
    if (c + 1 == chunks.size()) options.set_last_message();
    // A false write means the shard ended the call early; Finish says why.
    open = writer->Write(chunk, options);
  }
  grpc::Status rpc = writer->Finish();
  return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
}

}  // namespace pst
