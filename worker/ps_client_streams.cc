// PsClient's streamed Pull and Push (PullStream / PushStream), for a shard
// whose share of the model is larger than one chunk.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "spdlog/spdlog.h"
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
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          shard.channel.get(), *shard.pull_stream, &context, request));
  grpc::ByteBuffer message;
  ReceivedChunk chunk;
  std::optional<PieceSequence> sequence;
  absl::Status problem;
  while (problem.ok() && reader->Read(&message)) {
    problem = chunk.Parse(&message);
    if (!problem.ok()) break;
    if (!sequence) {
      PullResponse header;
      if (!chunk.has_header()) {
        problem = absl::InternalError("the stream did not start with a header");
      } else if (!chunk.ParseHeader(&header)) {
        problem = absl::InternalError("the stream's header is not a PullResponse");
      } else {
        problem = CheckPullHeader(s, header);
      }
      if (!problem.ok()) break;
      std::vector<int64_t> bytes;
      for (size_t i : shard.slices) bytes.push_back(slices_[i].count * element_bytes);
      std::vector<int> element_sizes(bytes.size(), element_bytes);
      sequence.emplace(std::move(bytes), std::move(element_sizes));
      *version = header.version();
    }
    for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
      problem = sequence->Accept(piece.tensor, piece.offset, piece.size);
      if (!problem.ok()) break;
      const Slice& slice = slices_[shard.slices[piece.tensor]];
      std::span<float> values = out[slice.variable].subspan(
          slice.offset + piece.offset / element_bytes, piece.size / element_bytes);
      if (element_bytes == sizeof(float)) {
        chunk.CopyData(piece, reinterpret_cast<char*>(values.data()));  // float32: the wire bytes
      } else {
        shard.received.resize(piece.size);
        chunk.CopyData(piece, shard.received.data());
        DecodeValues(shard.received, wire_dtype_, values);
      }
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
  // Where each slice's wire bytes are: float32 gradients are sent from the
  // caller's memory as they are; 16-bit ones are encoded first.
  std::vector<const char*> wire;
  if (element_bytes == sizeof(float)) {
    for (size_t i : shard.slices) {
      const Slice& slice = slices_[i];
      wire.push_back(reinterpret_cast<const char*>(gradients[slice.variable].data() + slice.offset));
    }
  } else {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    shard.encoded.resize(total);
    char* next = shard.encoded.data();
    for (size_t i : shard.slices) {
      const Slice& slice = slices_[i];
      EncodeValuesTo(gradients[slice.variable].subspan(slice.offset, slice.count), wire_dtype_,
                     next);
      wire.push_back(next);
      next += slice.count * element_bytes;
    }
  }
  const std::vector<std::vector<PieceRef>> chunks =
      PlanChunks(bytes, std::vector<int>(bytes.size(), element_bytes));
  grpc::ClientContext context;
  SetDeadline(&context, kRpcDeadline);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          shard.channel.get(), *shard.push_stream, &context, response));
  // The pieces reference the wire bytes above, pinning `sent`. Once the
  // shard has answered, every byte has left, and gRPC drops its references
  // at once; a call that failed part way may leave some queued a moment
  // longer. Either way the call returns only when they are gone, so the
  // caller may change or free its gradients (and the next call reuse
  // `encoded`) as soon as it returns.
  const PayloadPin sent = std::make_shared<char>(0);
  ChunkBuilder builder;
  bool open = true;
  for (size_t c = 0; c < chunks.size() && open; ++c) {
    if (c == 0) {
      PushRequest header;
      header.set_worker(worker_);
      header.set_computed_at_version(computed_at);
      for (size_t i : shard.slices) {
        Tensor* tensor = header.add_gradients();
        tensor->set_name(slices_[i].name);
        tensor->mutable_shape()->Assign(slices_[i].shape.begin(), slices_[i].shape.end());
        tensor->set_dtype(wire_dtype_);
      }
      builder.SetHeader(header);
    }
    for (const PieceRef& ref : chunks[c]) {
      builder.AddPiece(ref.tensor, ref.offset,
                       {wire[ref.tensor] + ref.offset, static_cast<size_t>(ref.bytes)}, sent);
    }
    grpc::WriteOptions options;
    if (c + 1 == chunks.size()) options.set_last_message();
    // A false write means the shard ended the call early; Finish says why.
    open = writer->Write(builder.Finish(), options);
  }
  grpc::Status rpc = writer->Finish();
  writer.reset();
  if (!AwaitRelease(sent, kReleaseTimeout)) {
    // Only bytes of a call that has ended can be left: nothing reads them
    // into a model, whatever the caller writes there now.
    spdlog::warn("ps:{} ({}): gRPC still held a push's gradients {} after the call ended",
                 s, shard.address, absl::FormatDuration(kReleaseTimeout));
  }
  return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
}

}  // namespace pst
