#include "ps_server/service/worker_sessions.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pst {

WorkerSessions::WorkerSessions(int num_workers, std::function<bool(int worker)> live)
    : live_(std::move(live)),
      holders_(static_cast<size_t>(std::max(num_workers, 0)), 0),
      held_(static_cast<size_t>(std::max(num_workers, 0)), false) {}

absl::Status WorkerSessions::Admit(int worker, uint64_t session) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= static_cast<int>(holders_.size())) return absl::OkStatus();
  const size_t w = static_cast<size_t>(worker);
  if (!held_[w] || holders_[w] == session || !live_(worker)) {
    held_[w] = true;
    holders_[w] = session;
    return absl::OkStatus();
  }
  ++refused_;
  return absl::UnavailableError(absl::StrCat(
      "worker:", worker, " is held by another process whose lease is live; a second process "
      "acting as the same worker is refused until that lease runs out (training.lease_seconds "
      "after it was last heard from)"));
}

int64_t WorkerSessions::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

}  // namespace pst
