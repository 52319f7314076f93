// The socket where workers on this host hand the shard their sealed
// regions (common/region_handoff.h): an abstract Unix socket under a
// random name, served by one thread that polls every connection, so that
// no connection holds a thread of its own.
//
// Bounds, against any local process that connects: a peer of another user
// is refused as it connects (SO_PEERCRED: the PS's effective uid only; a
// process of the same user could read the worker's memory anyway); at most
// `max_pending` connections wait for their message, and one more is
// refused at once; each has `deadline` from its connection to send it. A
// connection carries one handoff and is closed once answered; descriptors
// that come with a malformed message are closed unread.
#ifndef PST_PS_SERVER_SHM_REGION_INBOX_H_
#define PST_PS_SERVER_SHM_REGION_INBOX_H_

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pst {

class RegionInbox {
 public:
  // What the shard makes of descriptor `fd` (which it then owns) that came
  // with `nonce`: the region's handle, or why it is refused. Runs on the
  // inbox's thread, so must not block.
  using Adopt = std::function<absl::StatusOr<uint64_t>(absl::string_view nonce, int fd)>;

  struct Limits {
    int max_pending = 16;
    absl::Duration deadline = absl::Seconds(5);
  };

  // Listening, and its thread started. Unavailable if no socket can be made.
  static absl::StatusOr<std::unique_ptr<RegionInbox>> Start(Adopt adopt, Limits limits);
  static absl::StatusOr<std::unique_ptr<RegionInbox>> Start(Adopt adopt) {
    return Start(std::move(adopt), Limits{});
  }
  // Stops the thread and closes every connection.
  ~RegionInbox();
  RegionInbox(const RegionInbox&) = delete;
  RegionInbox& operator=(const RegionInbox&) = delete;

  // The socket's abstract name (without the leading NUL), announced in
  // ShmAttach's answer.
  const std::string& name() const { return name_; }
  // Connections refused: another user, over max_pending, past the
  // deadline, malformed.
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  RegionInbox(Adopt adopt, Limits limits, std::string name, int listener, int wake)
      : adopt_(std::move(adopt)),
        limits_(limits),
        name_(std::move(name)),
        listener_(listener),
        wake_(wake) {}
  struct Connection {
    int fd;
    absl::Time deadline;
  };
  void Run();
  // Answers the connections whose `polled` entry (one each, in order) is
  // ready, and those past their deadline at `now`; keeps the rest.
  void Serve(std::vector<Connection>* connections, const pollfd* polled, absl::Time now);
  // The same, for what is ready at this instant.
  void ServeReadyNow(std::vector<Connection>* connections);

  const Adopt adopt_;
  const Limits limits_;
  const std::string name_;
  const int listener_;
  const int wake_;  // an eventfd that ends Run
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SHM_REGION_INBOX_H_
