#include "ps_server/core/shard_requests.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/transient_refusal.h"
#include "ps_server/core/update_settings.h"

namespace pst {

absl::Status CheckWorkerIndex(int worker, int num_workers) {
  if (worker < 0 || worker >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker index ", worker,
                                                   " is out of range; this cluster has ",
                                                   num_workers, " worker(s)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPullFields(const PullRequest& pull, int num_workers) {
  if (absl::Status s = CheckWorkerIndex(pull.worker(), num_workers); !s.ok()) return s;
  if (DTypeBytes(pull.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown wire dtype ", static_cast<int>(pull.dtype()), " in a pull"));
  }
  return absl::OkStatus();
}

absl::Status PushBeforeInit() {
  return absl::FailedPreconditionError(
      "push before Init: the variables of this shard have not been initialized yet");
}

absl::Status PushAheadOfARestartedShard(int shard, int64_t claimed, int64_t version) {
  return MarkTransient(
      absl::UnavailableError(absl::StrCat(
          "gradient claims version ", claimed, " but shard ", shard, " is at version ", version,
          ": the shard went back to its checkpoint since this worker last registered; register "
          "again and run the step anew")),
      TransientRefusal::kRestarting);
}

absl::Status CheckPushClaims(const PushRequest& push, int shard, int64_t version) {
  if (push.computed_at_version() > version || push.computed_at_version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient claims version ",
                                                   push.computed_at_version(), " but shard ",
                                                   shard, " is at version ", version));
  }
  if (push.gradients().empty() && push.rows().empty()) {
    return absl::InvalidArgumentError(
        "the push carries no gradients and no embedding rows; nothing was applied");
  }
  return push.has_rates() ? CheckUpdateRates(push.rates()) : absl::OkStatus();
}

bool PushCarriesAnUpdate(const PushRequest& push) {
  if (!push.gradients().empty()) return true;
  for (const EmbeddingRows& rows : push.rows()) {
    if (!rows.ids().empty()) return true;
  }
  return false;
}

absl::Status PullTimedOut(const PullRequest& pull, int shard, bool initialized, int64_t version,
                          int staleness) {
  if (!initialized) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", shard, " is still waiting for a worker to Init its variables"));
  }
  if (version < pull.min_version()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", shard, " is at version ", version, "; version ", pull.min_version(),
        " did not arrive in time (are all workers alive?)"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker:", pull.worker(), " is more than ", staleness,
      " steps ahead of the slowest live worker and it did not catch up in time"));
}

absl::Status CheckAwaitWorkersDone(const AwaitWorkersDoneRequest& request) {
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AwaitWorkersDone's timeout_ms is ",
                                                   request.timeout_ms(), "; it must be 0 or more"));
  }
  if (request.known_changes() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AwaitWorkersDone's known_changes is ", request.known_changes(),
                     "; pass -1, or the worker_changes of an earlier answer"));
  }
  return absl::OkStatus();
}

bool GradientsFinite(const PushRequest& push) {
  return std::all_of(push.gradients().begin(), push.gradients().end(), [](const Tensor& g) {
    return DTypeBytes(g.dtype()) > 0 && EncodedFinite(g.data(), g.dtype());
  });
}

bool RowsFinite(const PushRequest& push) {
  return std::all_of(push.rows().begin(), push.rows().end(), [](const EmbeddingRows& r) {
    return DTypeBytes(r.dtype()) > 0 && EncodedFinite(r.data(), r.dtype());
  });
}

}  // namespace pst
