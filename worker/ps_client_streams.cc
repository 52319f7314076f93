// PsClient's streamed Pull, Push and PushPull (PullStream / PushStream /
// PushPull), for a shard whose share of the model is larger than one chunk.
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

absl::Status PsClient::TakePullChunk(int s, const ReceivedChunk& chunk,
                                     const std::vector<std::span<float>>& out,
                                     std::optional<PieceSequence>* sequence, int64_t* version) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  if (!sequence->has_value()) {
    PullResponse header;
    if (!chunk.has_header()) return absl::InternalError("the stream did not start with a header");
    if (!chunk.ParseHeader(&header)) {
      return absl::InternalError("the stream's header is not a PullResponse");
    }
    if (absl::Status checked = CheckPullHeader(s, header); !checked.ok()) return checked;
    std::vector<int64_t> bytes;
    for (size_t i : shard.slices) bytes.push_back(slices_[i].count * element_bytes);
    std::vector<int> element_sizes(bytes.size(), element_bytes);
    sequence->emplace(std::move(bytes), std::move(element_sizes));
    *version = header.version();
  } else if (chunk.has_header()) {
    return absl::InternalError("the stream carried a second header");
  }
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status accepted = (*sequence)->Accept(piece.tensor, piece.offset, piece.size);
        !accepted.ok()) {
      return accepted;
    }
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
  return absl::OkStatus();
}

absl::Status PsClient::PullStreamed(int s, const PullRequest& request, absl::Duration timeout,
                                    const std::vector<std::span<float>>& out, int64_t* version) {
  Shard& shard = shards_[s];
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
    if (problem.ok()) problem = TakePullChunk(s, chunk, out, &sequence, version);
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

bool PsClient::WritePushChunks(int s, int64_t computed_at,
                               const std::vector<std::span<const float>>& gradients,
                               const PullRequest* pull, const PayloadPin& sent,
                               absl::FunctionRef<bool(grpc::ByteBuffer, grpc::WriteOptions)> write) {
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
  ChunkBuilder builder;
  for (size_t c = 0; c < chunks.size(); ++c) {
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
    if (c == 0 && pull != nullptr) builder.SetExtra(*pull);
    grpc::WriteOptions options;
    if (c + 1 == chunks.size()) options.set_last_message();
    if (!write(builder.Finish(), options)) return false;
  }
  return true;
}

void PsClient::AwaitPushReleased(int s, const PayloadPin& sent) const {
  if (!AwaitRelease(sent, kReleaseTimeout)) {
    // Only bytes of a call that has ended can be left: nothing reads them
    // into a model, whatever the caller writes there now.
    spdlog::warn("ps:{} ({}): gRPC still held a push's gradients {} after the call ended", s,
                 shards_[s].address, absl::FormatDuration(kReleaseTimeout));
  }
}

absl::Status PsClient::PushStreamed(int s, int64_t computed_at,
                                    const std::vector<std::span<const float>>& gradients,
                                    PushResponse* response) {
  grpc::ClientContext context;
  SetDeadline(&context, kRpcDeadline);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          shards_[s].channel.get(), *shards_[s].push_stream, &context, response));
  // The pieces reference the wire bytes, pinning `sent`. Once the shard has
  // answered, every byte has left, and gRPC drops its references at once; a
  // call that failed part way may leave some queued a moment longer. Either
  // way the call returns only when they are gone, so the caller may change
  // or free its gradients (and the next call reuse `encoded`) as soon as it
  // returns.
  const PayloadPin sent = std::make_shared<char>(0);
  // A false write means the shard ended the call early; Finish says why.
  WritePushChunks(s, computed_at, gradients, nullptr, sent,
                  [&](grpc::ByteBuffer message, grpc::WriteOptions options) {
                    return writer->Write(message, options);
                  });
  grpc::Status rpc = writer->Finish();
  writer.reset();
  AwaitPushReleased(s, sent);
  return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
}

absl::Status PsClient::PushPullStreamed(int s, int64_t computed_at,
                                        const std::vector<std::span<const float>>& gradients,
                                        const PullRequest& pull, absl::Duration timeout,
                                        const std::vector<std::span<float>>& out,
                                        int64_t* version, PushResponse* response) {
  Shard& shard = shards_[s];
  grpc::ClientContext context;
  SetDeadline(&context, timeout + kRpcDeadline);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          shard.channel.get(), *shard.push_pull, &context));
  // The answer is read while the push is written: the shard sends values
  // back while the rest of the push is still arriving, and neither side's
  // writes may wait on the other's reads.
  absl::Status problem;
  std::optional<PieceSequence> sequence;
  std::optional<PushPullDone> done;
  ThreadPool::Task reader = threads_.Start([&] {
    grpc::ByteBuffer message;
    ReceivedChunk chunk;
    int64_t header_version = 0;  // 0 in a PushPull: `done` has the version
    while (problem.ok() && stream->Read(&message)) {
      problem = chunk.Parse(&message);
      if (problem.ok() && done) problem = absl::InternalError("the answer went on after its end");
      if (problem.ok()) problem = TakePullChunk(s, chunk, out, &sequence, &header_version);
      if (problem.ok() && chunk.has_extra()) {
        done.emplace();
        if (!chunk.ParseExtra(&*done)) problem = absl::InternalError("malformed PushPullDone");
      }
    }
    if (!problem.ok()) context.TryCancel();
  });
  const PayloadPin sent = std::make_shared<char>(0);  // as in PushStreamed
  WritePushChunks(s, computed_at, gradients, &pull, sent,
                  [&](grpc::ByteBuffer message, grpc::WriteOptions options) {
                    return stream->Write(message, options);
                  });
  reader.Wait();
  grpc::Status rpc = stream->Finish();
  stream.reset();
  AwaitPushReleased(s, sent);
  if (!problem.ok()) {
    return absl::Status(problem.code(), absl::StrCat("ps:", s, " (", shard.address,
                                                     "): push-pull: ", problem.message()));
  }
  if (!rpc.ok()) return ShardError(s, rpc);
  if (!sequence || !done) {
    return absl::InternalError(absl::StrCat("ps:", s, " ended a push-pull's answer early"));
  }
  if (absl::Status finished = sequence->Finish(); !finished.ok()) {
    return absl::InternalError(absl::StrCat("ps:", s, " push-pull: ", finished.message()));
  }
  *response = done->push();
  *version = done->version();
  return absl::OkStatus();
}

}  // namespace pst
