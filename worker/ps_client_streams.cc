// PsClient's streamed Pull, Push and PushPull (PullStream / PushStream /
// PushPull), for a shard whose share of the model is larger than one chunk.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "rpc/chunk_wire.h"
#include "spdlog/spdlog.h"
#include "worker/ps_client.h"

namespace pst {

absl::Status PsClient::CheckPullHeader(int s, const PullResponse& header,
                                       std::vector<size_t>* order) const {
  const Shard& shard = shards_[s];
  if (header.variables_size() != static_cast<int>(shard.slices.size())) {
    return absl::InternalError(absl::StrCat("ps:", s, " answered a pull with ",
                                            header.variables_size(), " variables, expected ",
                                            shard.slices.size()));
  }
  order->clear();
  std::vector<bool> seen(shard.slices.size(), false);
  for (const Tensor& tensor : header.variables()) {
    size_t position = 0;
    while (position < shard.slices.size() &&
           (seen[position] || slices_[shard.slices[position]].name != tensor.name())) {
      ++position;
    }
    if (position == shard.slices.size()) {
      return absl::InternalError(absl::StrCat("ps:", s, " returned \"", tensor.name(),
                                              "\", which was not asked for (or twice)"));
    }
    seen[position] = true;
    order->push_back(position);
    const VariableSlice& slice = slices_[shard.slices[position]];
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
                                     StreamedAnswer* answer, std::vector<size_t>* completed) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  if (!answer->sequence.has_value()) {
    PullResponse header;
    if (!chunk.has_header()) return absl::InternalError("the stream did not start with a header");
    if (!chunk.ParseHeader(&header)) {
      return absl::InternalError("the stream's header is not a PullResponse");
    }
    if (absl::Status checked = CheckPullHeader(s, header, &answer->order); !checked.ok()) {
      return checked;
    }
    std::vector<int64_t> bytes;
    for (size_t position : answer->order) {
      bytes.push_back(slices_[shard.slices[position]].count * element_bytes);
    }
    std::vector<int> element_sizes(bytes.size(), element_bytes);
    answer->sequence.emplace(std::move(bytes), std::move(element_sizes));
    answer->received.assign(answer->order.size(), 0);
    answer->version = header.version();
  } else if (chunk.has_header()) {
    return absl::InternalError("the stream carried a second header");
  }
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status accepted = answer->sequence->Accept(piece.tensor, piece.offset, piece.size);
        !accepted.ok()) {
      return accepted;
    }
    const size_t position = answer->order[piece.tensor];
    const VariableSlice& slice = slices_[shard.slices[position]];
    std::span<float> values = out[slice.variable].subspan(
        slice.offset + piece.offset / element_bytes, piece.size / element_bytes);
    if (element_bytes == sizeof(float)) {
      chunk.CopyData(piece, reinterpret_cast<char*>(values.data()));  // float32: the wire bytes
    } else {
      shard.received.resize(piece.size);
      chunk.CopyData(piece, shard.received.data());
      DecodeValues(shard.received, wire_dtype_, values);
    }
    answer->received[piece.tensor] += piece.size;
    if (completed != nullptr && answer->received[piece.tensor] == slice.count * element_bytes) {
      completed->push_back(position);
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
  StreamedAnswer answer;
  absl::Status problem;
  while (problem.ok() && reader->Read(&message)) {
    problem = chunk.Parse(&message);
    if (problem.ok()) problem = TakePullChunk(s, chunk, out, &answer);
  }
  if (!problem.ok()) context.TryCancel();
  grpc::Status rpc = reader->Finish();
  if (!problem.ok()) {
    return absl::Status(problem.code(), absl::StrCat("ps:", s, " (", shard.address,
                                                     "): pull stream: ", problem.message()));
  }
  if (!rpc.ok()) return ShardError(s, rpc);
  if (!answer.sequence) {
    return absl::InternalError(absl::StrCat("ps:", s, " sent an empty pull stream"));
  }
  if (absl::Status done = answer.sequence->Finish(); !done.ok()) {
    return absl::InternalError(absl::StrCat("ps:", s, " pull stream: ", done.message()));
  }
  *version = answer.version;
  return absl::OkStatus();
}

bool PsClient::WritePushChunks(int s, int64_t computed_at,
                               const std::vector<std::span<const float>>& gradients,
                               const std::vector<size_t>& header_order, size_t first, size_t end,
                               const PullRequest* pull, const PayloadPin& sent,
                               absl::FunctionRef<bool(grpc::ByteBuffer, grpc::WriteOptions)> write) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  std::vector<int64_t> bytes;
  for (size_t p = first; p < end; ++p) bytes.push_back(slices_[header_order[p]].count * element_bytes);
  // Where each slice's wire bytes are: float32 gradients are sent from the
  // caller's memory as they are; 16-bit ones are encoded first, each into
  // its own region of shard.encoded (laid out in header order).
  std::vector<const char*> wire;
  if (element_bytes == sizeof(float)) {
    for (size_t p = first; p < end; ++p) {
      const VariableSlice& slice = slices_[header_order[p]];
      wire.push_back(reinterpret_cast<const char*>(gradients[slice.variable].data() + slice.offset));
    }
  } else {
    int64_t offset = 0, total = 0;
    for (size_t p = 0; p < header_order.size(); ++p) {
      if (p < first) offset += slices_[header_order[p]].count * element_bytes;
      total += slices_[header_order[p]].count * element_bytes;
    }
    if (first == 0) shard.encoded.resize(total);
    char* next = shard.encoded.data() + offset;
    for (size_t p = first; p < end; ++p) {
      const VariableSlice& slice = slices_[header_order[p]];
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
    const bool opens_stream = c == 0 && first == 0;
    if (opens_stream) {
      PushRequest header;
      header.set_worker(worker_);
      header.set_computed_at_version(computed_at);
      for (size_t i : header_order) {
        Tensor* tensor = header.add_gradients();
        tensor->set_name(slices_[i].name);
        tensor->mutable_shape()->Assign(slices_[i].shape.begin(), slices_[i].shape.end());
        tensor->set_dtype(wire_dtype_);
      }
      builder.SetHeader(header);
    }
    for (const PieceRef& ref : chunks[c]) {
      builder.AddPiece(static_cast<int>(first) + ref.tensor, ref.offset,
                       {wire[ref.tensor] + ref.offset, static_cast<size_t>(ref.bytes)}, sent);
    }
    if (opens_stream && pull != nullptr) builder.SetExtra(*pull);
    grpc::WriteOptions options;
    if (c + 1 == chunks.size() && end == header_order.size()) options.set_last_message();
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
  WritePushChunks(s, computed_at, gradients, shards_[s].slices, 0, shards_[s].slices.size(),
                  nullptr, sent,
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
  StreamedAnswer answer;  // its version is 0 in a PushPull: `done` has the version
  std::optional<PushPullDone> done;
  ThreadPool::Task reader = threads_.Start([&] {
    grpc::ByteBuffer message;
    ReceivedChunk chunk;
    while (problem.ok() && stream->Read(&message)) {
      problem = chunk.Parse(&message);
      if (problem.ok() && done) problem = absl::InternalError("the answer went on after its end");
      if (problem.ok()) problem = TakePullChunk(s, chunk, out, &answer);
      if (problem.ok() && chunk.has_extra()) {
        done.emplace();
        if (!chunk.ParseExtra(&*done)) problem = absl::InternalError("malformed PushPullDone");
      }
    }
    if (!problem.ok()) context.TryCancel();
  });
  const PayloadPin sent = std::make_shared<char>(0);  // as in PushStreamed
  WritePushChunks(s, computed_at, gradients, shard.slices, 0, shard.slices.size(), &pull, sent,
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
  if (!answer.sequence || !done) {
    return absl::InternalError(absl::StrCat("ps:", s, " ended a push-pull's answer early"));
  }
  if (absl::Status finished = answer.sequence->Finish(); !finished.ok()) {
    return absl::InternalError(absl::StrCat("ps:", s, " push-pull: ", finished.message()));
  }
  *response = done->push();
  *version = done->version();
  return absl::OkStatus();
}

}  // namespace pst
