// Which StreamedUpdate (ps_server/core/streamed_update.h) holds a shard's
// staging while its push streams in. Other updates wait for their turn
// until it is released; one whose stream stalls is cancelled, so that they
// can go on.
//
// Not thread-safe: the shard calls it under its lock, which also guards the
// holder's cancellation state.
#ifndef PST_PS_SERVER_CORE_STREAMED_STAGING_H_
#define PST_PS_SERVER_CORE_STREAMED_STAGING_H_

#include "absl/time/time.h"

namespace pst {

class StreamedUpdate;

class StreamedStaging {
 public:
  bool held() const { return holder_ != nullptr; }
  // `update` holds the staging until Release; it must not be held already.
  void Hold(StreamedUpdate* update) { holder_ = update; }
  void Release() { holder_ = nullptr; }
  // While held: cancels the holder if it has sent nothing for `timeout`
  // (the stream's next read fails and drops the update), and returns how
  // long until it may have (at least a little, for a holder already
  // cancelled). `shard` names the shard in the log.
  absl::Duration CancelIfStalled(absl::Duration timeout, int shard);

 private:
  StreamedUpdate* holder_ = nullptr;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_STREAMED_STAGING_H_
