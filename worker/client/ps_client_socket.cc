// ShardChannel's exchanges (Pull, Push and PushPull, one Exchange call per
// shard): starting them all, reading their answers, and the messages of an
// exchange over the socket.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "common/transient_refusal.h"
#include "rpc/chunk_wire.h"
#include "spdlog/spdlog.h"
#include "worker/client/shard_channel.h"
#include "worker/client/worker_metrics.h"

namespace pst {

absl::Status ShardChannel::CheckPullHeader(int s, const PullResponse& header, bool rows_only,
                                       std::vector<size_t>* order) const {
  const Shard& shard = shards_[s];
  const size_t expected = rows_only ? 0 : shard.slices.size();
  if (header.variables_size() != static_cast<int>(expected)) {
    return absl::InternalError(absl::StrCat("ps:", s, " answered a pull with ",
                                            header.variables_size(), " variables, expected ",
                                            expected));
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

absl::Status ShardChannel::TakePullChunk(int s, const ReceivedChunk& chunk,
                                     const std::vector<std::span<float>>& out,
                                     StreamedAnswer* answer, std::vector<size_t>* completed) {
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  if (!answer->sequence.has_value()) {
    PullResponse& header = answer->header;  // kept: its rows are taken once the answer is whole
    if (!chunk.has_header()) return absl::InternalError("the stream did not start with a header");
    if (!chunk.ParseHeader(&header)) {
      return absl::InternalError("the stream's header is not a PullResponse");
    }
    if (absl::Status checked = CheckPullHeader(s, header, answer->rows_only, &answer->order);
        !checked.ok()) {
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

bool ShardChannel::WritePushChunks(int s, int64_t computed_at,
                               const std::vector<std::span<const float>>& gradients,
                               const std::vector<size_t>& header_order, size_t first, size_t end,
                               const PullRequest* pull, EmbeddingRowsList* rows,
                               const PayloadPin& sent,
                               absl::FunctionRef<bool(grpc::ByteBuffer, bool last)> write) {
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
  std::vector<std::vector<PieceRef>> chunks =
      PlanChunks(bytes, std::vector<int>(bytes.size(), element_bytes));
  // A shard that holds only embedding rows is sent the header alone.
  if (chunks.empty()) chunks.emplace_back();
  ChunkBuilder builder;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const bool opens_stream = c == 0 && first == 0;
    if (opens_stream) {
      PushRequest header;
      header.set_worker(worker_);
      TagPush(s, computed_at, &header);
      if (shards_[s].rates.has_value()) *header.mutable_rates() = *shards_[s].rates;
      for (size_t i : header_order) {
        Tensor* tensor = header.add_gradients();
        tensor->set_name(slices_[i].name);
        tensor->mutable_shape()->Assign(slices_[i].shape.begin(), slices_[i].shape.end());
        tensor->set_dtype(wire_dtype_);
      }
      // The rows are lent to the header while it is serialized.
      if (rows != nullptr) header.mutable_rows()->Swap(rows);
      builder.SetHeader(header);
      if (rows != nullptr) header.mutable_rows()->Swap(rows);
    }
    for (const PieceRef& ref : chunks[c]) {
      builder.AddPiece(static_cast<int>(first) + ref.tensor, ref.offset,
                       {wire[ref.tensor] + ref.offset, static_cast<size_t>(ref.bytes)}, sent);
    }
    if (opens_stream && pull != nullptr) builder.SetExtra(*pull);
    if (!write(builder.Finish(), c + 1 == chunks.size() && end == header_order.size())) {
      return false;
    }
  }
  return true;
}

void ShardChannel::AwaitPushReleased(int s, const PayloadPin& sent) {
  const absl::Time deadline = absl::Now() + kReleaseTimeout;
  auto released = [&sent] { return sent.use_count() == 1; };
  // A release is no event of the queue: it is looked for after each one,
  // and at least every millisecond.
  while (!released() && absl::Now() < deadline) {
    driver_.WaitUntil(released, std::min(deadline, absl::Now() + absl::Milliseconds(1)));
  }
  if (!AwaitRelease(sent, absl::ZeroDuration())) {
    // Only bytes of a call that has ended can be left: nothing reads them
    // into a model, whatever the caller writes there now.
    spdlog::warn("ps:{} ({}): gRPC still held a push's gradients {} after the call ended", s,
                 address(s), absl::FormatDuration(kReleaseTimeout));
  }
}

absl::Status ShardChannel::TakeAnswer(int s, grpc::ByteBuffer* message, bool shared,
                                  const std::vector<std::span<float>>* out,
                                  StreamedAnswer* answer, std::vector<size_t>* completed) {
  ReceivedChunk chunk;
  if (absl::Status parsed = chunk.Parse(message); !parsed.ok()) return parsed;
  if (answer->done) return absl::InternalError("the answer went on after its end");
  if (shared) {
    if (chunk.has_header() && !chunk.ParseHeader(&answer->header)) {
      return absl::InternalError("the answer's header is not a PullResponse");
    }
    if (!chunk.pieces().empty()) return absl::InternalError("a shared answer carried pieces");
  } else if (out != nullptr && (chunk.has_header() || !chunk.pieces().empty())) {
    if (absl::Status taken = TakePullChunk(s, chunk, *out, answer, completed); !taken.ok()) {
      return taken;
    }
  } else if (chunk.has_header() || !chunk.pieces().empty()) {
    return absl::InternalError("values came back for an exchange that pulled nothing");
  }
  if (chunk.has_extra()) {
    answer->done.emplace();
    if (!chunk.ParseExtra(&*answer->done)) return absl::InternalError("malformed ExchangeDone");
  }
  return absl::OkStatus();
}

namespace {

// Whether a part's outcome fails the whole exchange: any error but a
// region-lost refusal, which FinishExchange answers by sending it again.
bool FailsTheExchange(const absl::Status& status) {
  return !status.ok() && MarkedTransient(status) != TransientRefusal::kRegionLost;
}

}  // namespace

absl::Status ShardChannel::RunExchanges(const std::vector<ShardExchange>& exchanges) {
  std::vector<std::unique_ptr<OpenExchange>> open(exchanges.size());
  std::vector<absl::Status> results(exchanges.size());
  // Every shard's call is started before any is waited for: they all run
  // at once, driven by whichever thread waits on the client's queue.
  for (size_t i = 0; i < exchanges.size(); ++i) {
    absl::StatusOr<bool> shared = UseSharedMemory(exchanges[i].shard);
    if (!shared.ok()) {
      results[i] = shared.status();
      continue;
    }
    open[i] = StartExchange(exchanges[i], *shared);
  }
  // A failed part fails the whole exchange, which is sent again whole. The
  // other parts are not awaited: a read at another shard may wait for a
  // step that other workers complete only with their next push, while they
  // wait for this worker at the failed shard (a shard restarted from its
  // checkpoint waits for every worker's push of the step it is at). Their
  // pushes, where they landed, are answered as repeats when sent again.
  // Each part is taken as soon as it is answered, while the others are
  // still on their way.
  std::optional<size_t> failed;
  for (size_t i = 0; i < results.size() && !failed.has_value(); ++i) {
    if (FailsTheExchange(results[i])) failed = i;
  }
  bool cancelled = false;
  for (size_t i = 0; i < exchanges.size(); ++i) {
    if (open[i] == nullptr) continue;
    if (!failed.has_value()) failed = AwaitPartOrFailure(open, i);
    if (failed.has_value() && !cancelled) {
      for (const std::unique_ptr<OpenExchange>& part : open) {
        // (FinishExchange moved a taken part's call to the shard's `finishing`.)
        if (part != nullptr && part->call != nullptr && !part->call->Answered()) {
          part->call->Cancel();
        }
      }
      cancelled = true;
    }
    results[i] = FinishExchange(exchanges[i], open[i].get());
    // Taking the answer can fail too (or sending again after a lost region).
    if (!failed.has_value() && !results[i].ok()) failed = i;
  }
  // The part that failed says why, not a part cancelled for it.
  if (failed.has_value() && !results[*failed].ok()) return results[*failed];
  for (size_t i = 0; i < exchanges.size(); ++i) {
    if (!results[i].ok()) return results[i];
    const int64_t bytes = WireBytes(exchanges[i].shard);
    if (exchanges[i].gradients != nullptr) GetWorkerMetrics().bytes_out.Increment(bytes);
    if (exchanges[i].pull && !exchanges[i].pull->rows_only()) {
      GetWorkerMetrics().bytes_in.Increment(bytes);
    }
  }
  // Rows are counted once per exchange, with the call that carried part 0.
  if (!exchanges.empty() && exchanges[0].rows != nullptr && exchanges[0].rows_part == 0) {
    GetWorkerMetrics().bytes_out.Increment(exchanges[0].rows->push_bytes());
    GetWorkerMetrics().bytes_in.Increment(exchanges[0].rows->pull_bytes());
  }
  return absl::OkStatus();
}

std::optional<size_t> ShardChannel::AwaitPartOrFailure(
    const std::vector<std::unique_ptr<OpenExchange>>& open, size_t part) {
  std::optional<size_t> failed;
  driver_.WaitUntil([&] {
    for (size_t i = 0; i < open.size(); ++i) {
      // A part FinishExchange took has no call here any more.
      if (open[i] == nullptr || open[i]->call == nullptr) continue;
      const std::optional<absl::Status> outcome = open[i]->call->Outcome();
      if (outcome.has_value() && FailsTheExchange(*outcome)) {
        failed = i;
        return true;
      }
    }
    return open[part]->call->Answered();
  });
  return failed;
}

std::unique_ptr<ShardChannel::OpenExchange> ShardChannel::StartExchange(const ShardExchange& exchange,
                                                                 bool shared) {
  const int s = exchange.shard;
  Shard& shard = shards_[s];
  auto open = std::make_unique<OpenExchange>();
  open->shared = shared;
  open->answer.rows_only = exchange.pull && exchange.pull->rows_only();
  EmbeddingRowsList* rows =
      exchange.rows != nullptr && exchange.rows->pushes() && exchange.rows_part == 0
          ? exchange.rows->push_rows(s)
          : nullptr;
  const absl::Duration wait =
      exchange.pull ? absl::Milliseconds(exchange.pull->timeout_ms()) : absl::ZeroDuration();
  OpenExchange* taking = open.get();
  // A shared exchange, or a share of at most one chunk, is one message
  // each way (the push's, and the pull's answer).
  const ShardCall::Shape shape = shared || WireBytes(s) <= kChunkBytes
                                     ? ShardCall::Shape::kOneEachWay
                                     : ShardCall::Shape::kStreams;
  open->call = std::make_unique<ShardCall>(
      endpoint(s).generic.get(), &driver_, wait + kRpcDeadline,
      [this, s, taking, out = exchange.out](grpc::ByteBuffer* message) {
        absl::Status taken = TakeAnswer(s, message, taking->shared, out, &taking->answer);
        if (taken.ok() && taking->answer.done) taking->call->AnswerComplete();
        return taken.ok() || NamesItsShard(taken) ? taken : ShardError(s, taken);
      },
      ShardCall::OnEnd(), shape);
  open->call->Start();
  if (shared) {
    open->call->Write(SharedRequest(exchange, open.get()), /*last=*/true);
  } else if (exchange.gradients != nullptr) {
    // A false write means the shard ended the call early; Wait says why.
    WritePushChunks(s, exchange.computed_at, *exchange.gradients, shard.slices, 0,
                    shard.slices.size(), exchange.pull ? &*exchange.pull : nullptr, rows,
                    open->sent, [&](grpc::ByteBuffer message, bool last) {
                      return open->call->Write(std::move(message), last);
                    });
  } else {
    // No dense gradients: the exchange pulls, or pushes rows alone.
    PushRequest header;
    header.set_worker(worker_);
    ChunkBuilder builder;
    if (rows != nullptr) {
      TagPush(exchange.shard, exchange.computed_at, &header);
      if (shard.rates.has_value()) *header.mutable_rates() = *shard.rates;
      header.mutable_rows()->Swap(rows);
      builder.SetHeader(header);
      header.mutable_rows()->Swap(rows);
    } else {
      builder.SetHeader(header);
    }
    if (exchange.pull) builder.SetExtra(*exchange.pull);
    open->call->Write(builder.Finish(), /*last=*/true);
  }
  return open;
}

absl::Status ShardChannel::FinishExchange(const ShardExchange& exchange, OpenExchange* open,
                                      bool may_attach_again) {
  const int s = exchange.shard;
  absl::Status status = open->call->Wait();
  // The pieces referenced the caller's gradients (or shard.encoded), pinning
  // `sent`. Once the shard has answered every byte has left, and gRPC drops
  // its references at once; a call that failed part way may leave some
  // queued a moment longer. Either way the call returns only when they are
  // gone, so the caller may change or free its gradients (and the next call
  // reuse `encoded`) as soon as it returns.
  AwaitPushReleased(s, open->sent);
  if (open->shared && MarkedTransient(status) == TransientRefusal::kRegionLost &&
      may_attach_again) {
    // The shard no longer knows the region (it restarted): it refused the
    // call before reading anything, so attach a new one and call again.
    shards_[s].region_attached = false;
    absl::StatusOr<bool> shared = UseSharedMemory(s);
    if (!shared.ok()) return shared.status();
    if (!*shared) {
      return absl::UnavailableError(
          absl::StrCat("ps:", s, " (", address(s), "): lost its shared region"));
    }
    std::unique_ptr<OpenExchange> again = StartExchange(exchange, /*shared=*/true);
    return FinishExchange(exchange, again.get(), /*may_attach_again=*/false);
  }
  if (!status.ok()) {
    // An answer this end refused already names the shard.
    status = NamesItsShard(status) ? status : ShardError(s, status);
    return open->shared ? LeaveRegionAfterFailure(s, std::move(status)) : status;
  }
  StreamedAnswer& answer = open->answer;
  if (!answer.done) {
    return absl::InternalError(absl::StrCat("ps:", s, " ended an exchange's answer early"));
  }
  if (exchange.response != nullptr) *exchange.response = answer.done->push();
  // gRPC finishes the call after its answer: it is waited for (destroyed)
  // by the shard's next exchange, not by this one.
  shards_[s].finishing = std::move(open->call);
  if (!exchange.pull) return absl::OkStatus();
  if (open->shared) {
    if (absl::Status taken = TakeSharedAnswer(exchange, *open); !taken.ok()) return taken;
  } else if (!answer.sequence) {
    return absl::InternalError(absl::StrCat("ps:", s, " answered a pull with no values"));
  } else if (absl::Status finished = answer.sequence->Finish(); !finished.ok()) {
    return absl::InternalError(absl::StrCat("ps:", s, " exchange: ", finished.message()));
  }
  if (exchange.rows != nullptr && exchange.rows->pulls()) {
    // Rows the shard wrote into the region lie in its rows room, from
    // where SharedRequest asked for them.
    std::optional<std::span<const char>> in_region;
    if (open->rows_in_region) {
      in_region = shards_[s].region->bytes().subspan(open->rows_answer_offset);
    }
    if (absl::Status taken =
            exchange.rows->TakeAnswer(s, exchange.rows_part, answer.header, in_region);
        !taken.ok()) {
      return ShardError(s, taken);
    }
  }
  *exchange.version = answer.done->version();
  return absl::OkStatus();
}

}  // namespace pst
