// ShardChannel::BeginExchange: a step's exchange fed layer by layer
// (worker/client/step_exchange.h), as one Exchange call per shard.
#include <algorithm>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "rpc/chunk_wire.h"
#include "worker/client/shard_channel.h"
#include "worker/client/worker_metrics.h"

namespace pst {

class LayerwiseExchange final : public StepExchange {
 public:
  LayerwiseExchange(ShardChannel* client, std::vector<int64_t> computed_at,
                    std::vector<std::span<const float>> gradients, const std::vector<int>& push_order,
                    std::vector<int64_t> min_versions, absl::Duration timeout,
                    std::vector<std::span<float>> out, std::optional<RowSplit> rows);
  ~LayerwiseExchange() override;

  // Opens every shard's call; its answer is read as the client's queue is
  // driven: by Push (without waiting), AwaitValues and Finish.
  void Start();

  absl::Status Push(std::span<const int> variables) override;
  absl::Status AwaitValues(int variable) override;
  absl::Status Finish(std::vector<int64_t>* versions,
                      std::vector<PushResponse>* responses) override;

 private:
  struct Call {
    std::vector<size_t> push_slices;  // the exchange's header: slice indices in push order
    size_t pushed = 0;                // push_slices written so far
    bool opened = false;              // the header has gone out
    PayloadPin sent = std::make_shared<char>(0);
    PullRequest pull;
    // Written by the answer's events; read by Finish once the call is over.
    ShardChannel::StreamedAnswer answer;
    std::unique_ptr<ShardCall> call;
  };

  // Takes one message of shard s's answer, marking values final as they are.
  absl::Status TakeAnswer(int s, grpc::ByteBuffer* message);
  // Shard s's call is over, with `status`: its answer must be whole.
  void Ended(int s, const absl::Status& status);
  // The slice at `position` of shard s's slices holds final values.
  void MarkFinal(int s, size_t position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every call still open and waits for them.
  void Cancel();

  ShardChannel* const client_;
  const std::vector<int64_t> computed_at_;
  const std::vector<std::span<const float>> gradients_;
  const std::vector<int64_t> min_versions_;
  const absl::Duration timeout_;
  const std::vector<std::span<float>> out_;
  std::optional<RowSplit> rows_;
  std::vector<Call> calls_;  // per shard
  bool finished_ = false;

  absl::Mutex write_mu_;  // one Push at a time, in push order

  absl::Mutex mu_;
  std::vector<int> slices_left_ ABSL_GUARDED_BY(mu_);  // per variable: slices not yet final
  std::vector<std::vector<bool>> final_ ABSL_GUARDED_BY(mu_);  // per shard, per slice position
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

LayerwiseExchange::LayerwiseExchange(ShardChannel* client, std::vector<int64_t> computed_at,
                                     std::vector<std::span<const float>> gradients,
                                     const std::vector<int>& push_order,
                                     std::vector<int64_t> min_versions, absl::Duration timeout,
                                     std::vector<std::span<float>> out,
                                     std::optional<RowSplit> rows)
    : client_(client),
      computed_at_(std::move(computed_at)),
      gradients_(std::move(gradients)),
      min_versions_(std::move(min_versions)),
      timeout_(timeout),
      out_(std::move(out)),
      rows_(std::move(rows)),
      calls_(client->shards_.size()) {
  absl::MutexLock lock(&mu_);
  slices_left_.assign(out_.size(), 0);
  for (const ShardChannel::Shard& shard : client->shards_) final_.emplace_back(shard.slices.size(), false);
  for (int variable : push_order) {
    for (size_t i = 0; i < client_->slices_.size(); ++i) {
      const VariableSlice& slice = client_->slices_[i];
      if (slice.variable != static_cast<size_t>(variable)) continue;
      calls_[slice.shard].push_slices.push_back(i);
      ++slices_left_[variable];
    }
  }
}

LayerwiseExchange::~LayerwiseExchange() {
  if (!finished_) Cancel();
}

void LayerwiseExchange::Start() {
  for (size_t s = 0; s < calls_.size(); ++s) {
    Call& call = calls_[s];
    ShardChannel::Shard& shard = client_->shards_[s];
    // The answer in the shard's own slice order: the model's, first layer first.
    call.pull = client_->MakePullRequest(s, min_versions_[s], timeout_);
    for (size_t i : shard.slices) call.pull.add_names(client_->slices_[i].name);
    if (rows_) rows_->MovePullRows(static_cast<int>(s), /*part=*/0, &call.pull);
    const int shard_index = static_cast<int>(s);
    call.call = std::make_unique<ShardCall>(
        client_->endpoint(shard_index).generic.get(), &client_->driver_,
        timeout_ + ShardChannel::kRpcDeadline,
        [this, shard_index](grpc::ByteBuffer* message) { return TakeAnswer(shard_index, message); },
        [this, shard_index](const absl::Status& status) { Ended(shard_index, status); });
    call.call->Start();
  }
}

absl::Status LayerwiseExchange::TakeAnswer(int s, grpc::ByteBuffer* message) {
  Call& call = calls_[s];
  std::vector<size_t> completed;
  absl::Status taken = client_->TakeAnswer(s, message, /*shared=*/false, &out_, &call.answer,
                                           &completed);
  if (!taken.ok()) {
    return absl::Status(taken.code(), absl::StrCat("ps:", s, " (", client_->address(s),
                                                   "): exchange: ", taken.message()));
  }
  absl::MutexLock lock(&mu_);
  if (call.answer.done && call.answer.sequence && call.answer.sequence->Finish().ok()) {
    // Committed: every value of the answer counts now.
    for (size_t position = 0; position < final_[s].size(); ++position) MarkFinal(s, position);
  } else if (call.answer.version > 0) {
    // Sent after the push was in: final as it arrives.
    for (size_t position : completed) MarkFinal(s, position);
  }
  return absl::OkStatus();
}

void LayerwiseExchange::Ended(int s, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    Fail(NamesItsShard(status) ? status : client_->ShardError(s, status));
  } else if (std::find(final_[s].begin(), final_[s].end(), false) != final_[s].end()) {
    Fail(absl::UnavailableError(
        absl::StrCat("ps:", s, " (", client_->address(s), ") ended an exchange's answer early")));
  }
}

void LayerwiseExchange::MarkFinal(int s, size_t position) {
  std::vector<bool>& marked = final_[s];
  if (marked[position]) return;  // `done` marks again those that arrived final
  marked[position] = true;
  const VariableSlice& slice = client_->slices_[client_->shards_[s].slices[position]];
  --slices_left_[slice.variable];
}

void LayerwiseExchange::Fail(const absl::Status& status) {
  if (failure_.ok()) failure_ = status;
}

absl::Status LayerwiseExchange::Push(std::span<const int> variables) {
  absl::MutexLock write_lock(&write_mu_);
  for (size_t s = 0; s < calls_.size(); ++s) {
    Call& call = calls_[s];
    const size_t first = call.pushed;
    size_t end = first;
    while (end < call.push_slices.size() &&
           std::find(variables.begin(), variables.end(),
                     static_cast<int>(client_->slices_[call.push_slices[end]].variable)) !=
               variables.end()) {
      ++end;
    }
    // A shard that holds only rows gets its header with the first Push.
    if (end == first && (call.opened || !call.push_slices.empty())) continue;
    call.pushed = end;
    call.opened = true;
    EmbeddingRowsList* rows =
        rows_ && rows_->pushes() ? rows_->push_rows(static_cast<int>(s)) : nullptr;
    const bool written = client_->WritePushChunks(
        static_cast<int>(s), computed_at_[s], gradients_, call.push_slices, first, end, &call.pull,
        rows, call.sent, [&call](grpc::ByteBuffer message, bool last) {
          return call.call->Write(std::move(message), last);
        });
    if (!written) {
      // The shard ended the call; its end says why.
      absl::Status ended = call.call->Wait();
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return failure_;
      return ended.ok() ? absl::UnavailableError(absl::StrCat(
                              "ps:", s, " (", client_->address(static_cast<int>(s)),
                              ") ended an exchange while it was being written"))
                        : client_->ShardError(static_cast<int>(s), ended);
    }
  }
  // The messages go out before the caller computes on: a write is issued
  // only as the one before it completes, which takes the queue's events,
  // and between pushes no thread drives the queue. Leaving them queued
  // (polling for what was ready) measured half the samples per second:
  // the push then moved only once the next forward pass waited for
  // values. Answers that come meanwhile are taken too.
  client_->driver_.WaitUntil([this] {
    for (Call& call : calls_) {
      if (call.call != nullptr && !call.call->Sent()) return false;
    }
    return true;
  });
  // Every slice of `variables` must have gone out now: later ones were
  // pushed first, or the variables were not given in push order.
  for (int variable : variables) {
    for (size_t s = 0; s < calls_.size(); ++s) {
      const Call& call = calls_[s];
      for (size_t p = call.pushed; p < call.push_slices.size(); ++p) {
        if (client_->slices_[call.push_slices[p]].variable == static_cast<size_t>(variable)) {
          return absl::InternalError(absl::StrCat(
              "variable ", variable, " was pushed out of the exchange's push order"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LayerwiseExchange::AwaitValues(int variable) {
  client_->driver_.WaitUntil([this, variable] {
    absl::MutexLock lock(&mu_);
    return slices_left_[variable] == 0 || !failure_.ok();
  });
  absl::MutexLock lock(&mu_);
  return slices_left_[variable] > 0 ? failure_ : absl::OkStatus();
}

absl::Status LayerwiseExchange::Finish(std::vector<int64_t>* versions,
                                       std::vector<PushResponse>* responses) {
  finished_ = true;
  for (Call& call : calls_) {
    if (call.pushed < call.push_slices.size() || !call.opened) {
      call.call->Cancel();  // never completed
    }
  }
  // As ShardChannel::RunExchanges: once one shard's part has failed, the
  // others' are cancelled, not awaited, and the failed part says why.
  client_->driver_.WaitUntil([this] {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return true;
    return std::all_of(calls_.begin(), calls_.end(),
                       [](Call& call) { return call.call == nullptr || call.call->Answered(); });
  });
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    failed = failure_;
  }
  if (!failed.ok()) {
    for (Call& call : calls_) {
      if (call.call != nullptr && !call.call->Answered()) call.call->Cancel();
    }
  }
  absl::Status first_problem = failed;
  versions->resize(calls_.size());
  responses->resize(calls_.size());
  for (size_t s = 0; s < calls_.size(); ++s) {
    Call& call = calls_[s];
    absl::Status status = call.call->Wait();
    client_->AwaitPushReleased(static_cast<int>(s), call.sent);
    if (!status.ok() && !NamesItsShard(status)) {
      status = client_->ShardError(static_cast<int>(s), status);
    }
    if (status.ok() && (call.pushed < call.push_slices.size() || !call.opened)) {
      status = absl::InternalError("the exchange finished before every variable was pushed");
    }
    if (status.ok() && (!call.answer.sequence || !call.answer.done)) {
      status = absl::UnavailableError(absl::StrCat("ps:", s, " (", client_->address(static_cast<int>(s)),
                                                   ") ended an exchange's answer early"));
    }
    if (status.ok()) {
      if (absl::Status complete = call.answer.sequence->Finish(); !complete.ok()) {
        status = absl::InternalError(absl::StrCat("ps:", s, " exchange: ", complete.message()));
      }
    }
    if (status.ok() && rows_ && rows_->pulls()) {
      if (absl::Status taken =
              rows_->TakeAnswer(static_cast<int>(s), /*part=*/0, call.answer.header);
          !taken.ok()) {
        status = client_->ShardError(static_cast<int>(s), taken);
      }
    }
    if (status.ok()) {
      (*versions)[s] = call.answer.done->version();
      (*responses)[s] = call.answer.done->push();
      const int64_t bytes = client_->WireBytes(static_cast<int>(s));
      GetWorkerMetrics().bytes_out.Increment(bytes);
      GetWorkerMetrics().bytes_in.Increment(bytes);
    } else if (first_problem.ok()) {
      first_problem = status;
    }
  }
  if (!first_problem.ok() || !rows_) return client_->PushesAnswered(first_problem);
  return client_->PushesAnswered(client_->PullRemainingRows(&*rows_, *versions, timeout_));
}

void LayerwiseExchange::Cancel() {
  for (Call& call : calls_) {
    if (call.call != nullptr) call.call->Cancel();
  }
  for (size_t s = 0; s < calls_.size(); ++s) {
    Call& call = calls_[s];
    if (call.call == nullptr) continue;
    call.call->Wait().IgnoreError();
    client_->AwaitPushReleased(static_cast<int>(s), call.sent);
  }
}

absl::StatusOr<std::unique_ptr<StepExchange>> ShardChannel::BeginExchange(
    const std::vector<int64_t>& computed_at, const std::vector<std::span<const float>>& gradients,
    const std::vector<int>& push_order, const std::vector<int64_t>& min_versions,
    absl::Duration timeout, const std::vector<std::span<float>>& out, const StepRows& rows) {
  std::vector<bool> seen(out.size(), false);
  for (int variable : push_order) {
    if (variable < 0 || static_cast<size_t>(variable) >= out.size() || seen[variable]) {
      return absl::InvalidArgumentError("an exchange's push order must name every variable once");
    }
    seen[variable] = true;
  }
  if (push_order.size() != out.size() || gradients.size() != out.size()) {
    return absl::InvalidArgumentError("an exchange's push order must name every variable once");
  }
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split,
                       SplitRows(rows.push, rows.pull, /*pushes=*/true));
  auto exchange = std::make_unique<LayerwiseExchange>(this, computed_at, gradients, push_order,
                                                      min_versions, timeout, out, std::move(split));
  exchange->Start();
  return exchange;
}

}  // namespace pst
