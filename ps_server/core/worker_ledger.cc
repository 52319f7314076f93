#include "ps_server/core/worker_ledger.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "spdlog/spdlog.h"

namespace pst {

WorkerLedger::WorkerLedger(int num_workers, int shard, absl::Duration lease, absl::Mutex* mu,
                           std::function<void()> left, const LeaseClock& clock)
    : shard_(shard),
      lease_duration_(lease),
      left_(std::move(left)),
      progress_(num_workers),
      workers_(num_workers),
      lease_(
          num_workers, lease, mu,
          [this, mu](const std::vector<int>& workers) {
            mu->AssertHeld();
            LeasesExpired(workers);
          },
          clock) {}

bool WorkerLedger::Heard(int worker) {
  switch (lease_.Touch(worker)) {
    case LeaseTracker::Heard::kAgain:
      return false;
    case LeaseTracker::Heard::kBack:
      progress_[worker].live = true;
      spdlog::info("shard {}: worker:{} is back in the live set", shard_, worker);
      break;
    case LeaseTracker::Heard::kFirstTime:
      break;
  }
  ++changes_;
  return true;
}

void WorkerLedger::RenewAll() {
  const std::vector<int> back = lease_.RenewAll();
  for (int worker : back) progress_[worker].live = true;
  if (!back.empty()) {
    spdlog::info("shard {}: {} worker(s) back in the live set for a whole lease from now", shard_,
                 back.size());
    ++changes_;
  }
}

void WorkerLedger::LeasesExpired(const std::vector<int>& workers) {
  for (int worker : workers) {
    progress_[worker].live = false;
    spdlog::warn("shard {}: worker:{} silent for {}; dropped from the live set", shard_, worker,
                 absl::FormatDuration(lease_.SinceSeen(worker).value_or(lease_duration_)));
  }
  ++changes_;
  left_();
}

bool WorkerLedger::Finish(int worker) {
  if (progress_[worker].done) return false;
  progress_[worker].done = true;
  ++changes_;
  return true;
}

bool WorkerLedger::Rejoin(int worker) {
  if (!progress_[worker].done) return false;
  progress_[worker].done = false;
  ++changes_;
  return true;
}

std::vector<int> WorkerLedger::DoneWorkers() const {
  std::vector<int> done;
  for (int w = 0; w < static_cast<int>(progress_.size()); ++w) {
    if (progress_[w].done) done.push_back(w);
  }
  return done;
}

void WorkerLedger::SetDoneWorkers(std::span<const int> workers) {
  std::vector<bool> done(progress_.size(), false);
  for (int w : workers) done[w] = true;
  for (int w = 0; w < static_cast<int>(progress_.size()); ++w) {
    if (done[w]) {
      Finish(w);
    } else {
      Rejoin(w);
    }
  }
}

bool WorkerLedger::AllDone() const {
  return std::all_of(progress_.begin(), progress_.end(),
                     [](const WorkerProgress& w) { return w.done; });
}

int WorkerLedger::done_count() const {
  return static_cast<int>(std::count_if(progress_.begin(), progress_.end(),
                                        [](const WorkerProgress& w) { return w.done; }));
}

WorkerLedger::Mark WorkerLedger::RecordPush(int worker, int64_t computed_at, int64_t staleness) {
  Figures& w = workers_[worker];
  const Mark mark{.worker = worker,
                  .clock = progress_[worker].clock,
                  .last_step = w.last_step,
                  .last_staleness = w.last_staleness,
                  .max_staleness = w.max_staleness,
                  .staleness_sum = staleness_sum_};
  ++progress_[worker].clock;
  w.last_step = computed_at;
  w.last_staleness = staleness;
  w.max_staleness = std::max(w.max_staleness, staleness);
  staleness_sum_ += staleness;
  return mark;
}

void WorkerLedger::Undo(const Mark& mark) {
  Figures& w = workers_[mark.worker];
  progress_[mark.worker].clock = mark.clock;
  w.last_step = mark.last_step;
  w.last_staleness = mark.last_staleness;
  w.max_staleness = mark.max_staleness;
  staleness_sum_ = mark.staleness_sum;
}

void WorkerLedger::StepCompleted() {
  for (WorkerProgress& w : progress_) w.pushed = false;
}

void WorkerLedger::FillStats(StatsResponse* response) const {
  int64_t pushes = 0, fastest = 0, slowest = std::numeric_limits<int64_t>::max();
  int done = 0, live = 0, waited_for = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Figures& w = workers_[i];
    const WorkerProgress& p = progress_[i];
    WorkerStats* stats = response->add_workers();
    stats->set_worker(static_cast<int>(i));
    stats->set_last_step(w.last_step);
    stats->set_pushes(p.clock);
    stats->set_clock(p.clock);
    stats->set_last_staleness(w.last_staleness);
    stats->set_max_staleness(w.max_staleness);
    stats->set_done(p.done);
    stats->set_dropped(w.dropped);
    const std::optional<absl::Duration> since_seen = lease_.SinceSeen(static_cast<int>(i));
    stats->set_seconds_since_seen(since_seen ? absl::ToDoubleSeconds(*since_seen) : -1.0);
    // The policy waits for a worker it has not heard from yet (it may be
    // starting), but Stats calls live only one that has called in.
    const bool heard_and_live = p.live && since_seen.has_value();
    stats->set_live(heard_and_live);
    pushes += p.clock;
    done += p.done ? 1 : 0;
    live += heard_and_live ? 1 : 0;
    if (p.live) {
      ++waited_for;
      fastest = std::max(fastest, p.clock);
      slowest = std::min(slowest, p.clock);
    }
  }
  response->set_workers_done(done);
  response->set_live_workers(live);
  response->set_clock_spread(waited_for > 0 ? fastest - slowest : 0);
  response->set_mean_staleness(pushes == 0 ? 0.0 : static_cast<double>(staleness_sum_) / pushes);
  response->set_worker_changes(changes_);
}

void WorkerLedger::ExportClocks(ShardCheckpoint* checkpoint) const {
  for (const WorkerProgress& w : progress_) checkpoint->add_worker_clocks(w.clock);
}

void WorkerLedger::RestoreClocks(const ShardCheckpoint& checkpoint) {
  const int workers = static_cast<int>(progress_.size());
  for (int i = 0; i < checkpoint.worker_clocks_size() && i < workers; ++i) {
    progress_[i].clock = checkpoint.worker_clocks(i);
  }
}

}  // namespace pst
