#include "ps_server/core/streamed_staging.h"

#include <algorithm>

#include "ps_server/core/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst {

absl::Duration StreamedStaging::CancelIfStalled(absl::Duration timeout, int shard) {
  const absl::Duration idle = holder_->Idle();
  if (idle < timeout || holder_->cancelled_) {
    return std::max(timeout - idle, absl::Milliseconds(10));
  }
  spdlog::warn("shard {}: worker:{}'s push stream sent nothing for {}; cancelling it so that "
               "other updates can go on",
               shard, holder_->worker_, absl::FormatDuration(idle));
  holder_->cancelled_ = true;
  if (holder_->cancel_) holder_->cancel_();
  return absl::Milliseconds(10);
}

}  // namespace pst
