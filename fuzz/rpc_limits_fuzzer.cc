// The request checks of ps_server/service/rpc_limits.h, with small limits, and the
// shard's pull behind them, on requests parsed from the fuzzer's input
// (first byte: what to do and the limits; the rest: a serialized
// PullRequest or PushRequest). Whatever the request:
//  - a pull that passes CheckPullNames names at most max_names_per_request
//    variables, each once;
//  - a pull the shard answers under a reply limit is no larger than the
//    limit (PullReplyBytes bounds the real size), and names each variable
//    once;
//  - a pull's wait never ends past now + max_pull_wait or the call's own
//    deadline;
//  - a push that passes CheckPushSize carries at most max_names_per_request
//    gradients, and a push the shard accepts carried at least one and moved
//    the version exactly when its outcome says so.
// A broken promise is reported on stderr and ends the run with a trap.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/push_outcome.h"
#include "common/tensor_codec.h"
#include "fuzz/small_shard.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/rpc_limits.h"
#include "spdlog/spdlog.h"

namespace pst::fuzz {
namespace {

void FuzzPull(const RpcLimits& limits, ParameterShard* shard, const PullRequest& request) {
  const absl::Time now = absl::Now();
  const absl::Time call_deadline = now + absl::Milliseconds(request.worker() & 0xffff);
  const absl::Time wait = PullWaitDeadline(now, request, call_deadline, limits);
  FUZZ_INVARIANT(wait <= now + limits.max_pull_wait && wait <= call_deadline);
  if (!CheckPullNames(request, limits).ok()) return;
  FUZZ_INVARIANT(request.names_size() <= limits.max_names_per_request);
  std::set<std::string> names(request.names().begin(), request.names().end());
  FUZZ_INVARIANT(static_cast<int>(names.size()) == request.names_size());
  PullRequest no_wait = request;
  no_wait.set_worker(0);  // the shard's only worker; the wait ends at once
  PullResponse response;
  const absl::Status status =
      pst::Pull(*shard, no_wait, absl::Now(), &response,
                {.max_reply_bytes = limits.max_reply_bytes});
  if (!status.ok()) return;
  FUZZ_INVARIANT(static_cast<int64_t>(response.ByteSizeLong()) <= limits.max_reply_bytes);
  std::set<std::string> answered;
  for (const Tensor& t : response.variables()) FUZZ_INVARIANT(answered.insert(t.name()).second);
}

void FuzzPush(const RpcLimits& limits, ParameterShard* shard, PushRequest request) {
  if (!CheckPushSize(request, limits).ok()) return;
  FUZZ_INVARIANT(request.gradients_size() <= limits.max_names_per_request);
  request.set_worker(0);
  const int64_t before = shard->version();
  PushResponse response;
  if (!pst::Push(*shard, request, &response).ok()) {
    FUZZ_INVARIANT(shard->version() == before);
    return;
  }
  // Applied: it carried gradients or, the shard holding tables, rows alone.
  FUZZ_INVARIANT(request.gradients_size() > 0 || request.rows_size() > 0);
  FUZZ_INVARIANT(shard->version() - before == (AdvancedTheVersion(response.outcome()) ? 1 : 0));
}

}  // namespace
}  // namespace pst::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pst;
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const RpcLimits limits{
      .max_names_per_request = 1 + ((control >> 1) & 3),
      .max_reply_bytes = 64 << ((control >> 3) & 3),  // 64 B .. 512 B: around the variables' sizes
      .max_pull_wait = absl::Milliseconds(1 + ((control >> 5) & 7)),
  };
  static std::unique_ptr<ParameterShard> shard = fuzz::MakeSmallShard();
  if (control & 1) {
    PushRequest request;
    if (request.ParseFromArray(data + 1, static_cast<int>(size - 1))) {
      fuzz::FuzzPush(limits, shard.get(), request);
    }
  } else {
    PullRequest request;
    if (request.ParseFromArray(data + 1, static_cast<int>(size - 1))) {
      fuzz::FuzzPull(limits, shard.get(), request);
    }
  }
  return 0;
}
