// The exchanges (Exchange calls) a shard has open, and the bounds they are
// held to (rpc_limits.h): how many may be open in total and per worker,
// how long one may wait on its client, and how many bytes the pushes being
// reassembled may hold in total.
//
// An exchange is unnamed from its arrival until its header names its
// worker (ClaimWorker); only then does it count against max_streams and
// its worker's max_streams_per_worker. Unnamed exchanges have a cap of
// their own (max_streams too); an arrival beyond it ends the oldest unnamed
// one instead of being refused. A worker's exchange names its worker in its
// first message, at once, so a client that opens exchanges and never sends
// a header displaces only its own kind and cannot keep a worker out.
//
// gRPC has no per-message deadline: a client that opens an exchange and
// sends nothing more would hold the call, and whatever it had buffered,
// until its own deadline, if it set one. So a watchdog thread ends every
// exchange that has waited on its client for the idle timeout, and every
// push holding budget that arrives slower than the minimum rate, with
// DEADLINE_EXCEEDED; the call then ends and frees what it held.
#ifndef PST_PS_SERVER_SERVICE_OPEN_STREAMS_H_
#define PST_PS_SERVER_SERVICE_OPEN_STREAMS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps_server/service/rpc_limits.h"

namespace pst {

class OpenStreams {
 public:
  // `push_buffer_budget` gives the bound on bytes held by pushes being
  // reassembled, asked each time a push reserves some (it may follow the
  // shard's size, known only after Init).
  OpenStreams(const RpcLimits& limits, std::function<int64_t()> push_buffer_budget);
  // Stops the watchdog. Every Stream must have been destroyed.
  ~OpenStreams();

  OpenStreams(const OpenStreams&) = delete;
  OpenStreams& operator=(const OpenStreams&) = delete;

  // One admitted exchange. Destroying it gives back its place, its
  // worker's and the bytes it reserved; it must be destroyed before the
  // OpenStreams.
  class Stream {
   public:
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    // While one of these lives, the call waits on its client: a read, or a
    // write that the client must read to let through. Several may live at
    // once (an exchange reads and writes at once); the stream is idle once
    // none has started or ended for the idle timeout.
    class ClientWait {
     public:
      explicit ClientWait(Stream* stream);
      ~ClientWait();
      ClientWait(const ClientWait&) = delete;
      ClientWait& operator=(const ClientWait&) = delete;

     private:
      Stream* const stream_;
    };

    // Names the stream's worker (once; later calls do nothing): it then
    // counts against max_streams and `worker`'s streams.
    // ResourceExhausted if max_streams named ones are open, or that worker
    // already has max_streams_per_worker.
    absl::Status ClaimWorker(int worker);
    // Reserves `bytes` of the push buffer budget for this stream until it
    // ends. ResourceExhausted if the budget would be exceeded while other
    // streams hold some of it. From then on the push is held to
    // min_push_bytes_per_second until ReceivedAll.
    absl::Status ReservePushBuffer(int64_t bytes);
    // `bytes` more of the request have arrived.
    void Received(int64_t bytes) { received_.fetch_add(bytes, std::memory_order_relaxed); }
    // The request is whole: whatever it waits for now (its turn, other
    // workers) is no longer the client's to speed up.
    void ReceivedAll();
    // The status the watchdog ended the call with, if it did.
    absl::Status ended() const;
    // Gives back the stream's place (in the total and its worker's) and its
    // push buffer reservation before it is destroyed: for a call whose
    // outcome is decided while gRPC is still ending it. The watchdog still
    // watches it until then. Idempotent.
    void Release();

   private:
    friend class OpenStreams;
    Stream(OpenStreams* owner, std::function<void(const absl::Status&)> end_call)
        : owner_(owner), end_call_(std::move(end_call)) {}

    OpenStreams* const owner_;
    const std::function<void(const absl::Status&)> end_call_;
    std::atomic<int> waiting_{0};     // ClientWaits alive
    std::atomic<int64_t> since_{0};   // steady ns of the last start or end of one
    std::atomic<int64_t> received_{0};  // request bytes so far
    // Guarded by owner_->mu_.
    // A push holding budget, still arriving. Atomic so that the end of
    // every request clears it without the owner's lock.
    std::atomic<bool> metered_{false};
    int64_t window_start_ = 0;      // steady ns the current rate window began
    int64_t window_received_ = 0;   // received_ then
    uint64_t arrival_ = 0;          // order of Admit
    int worker_ = -1;
    bool claimed_worker_ = false;
    bool released_ = false;
    int64_t reserved_bytes_ = 0;
    absl::Status ended_;
  };

  // Admits a new exchange, unnamed; if max_streams unnamed ones are open
  // already, the oldest of them is ended (ResourceExhausted, counted as a
  // refusal). `end_call` ends the call with the given status; the watchdog
  // and a later Admit call it from their own thread, without the lock, so
  // possibly just after the Stream has been destroyed: it must stay safe
  // to call.
  std::unique_ptr<Stream> Admit(std::function<void(const absl::Status&)> end_call);

  int open() const;
  // Of open(): those that have not named their worker yet.
  int unnamed() const;
  int64_t push_buffer_bytes() const;  // reserved by open streams
  // Exchanges refused so far for these bounds (ResourceExhausted).
  int64_t refused() const;

 private:
  void Watch();
  // Why `stream`, a push arriving, is to be ended for its rate at `now`
  // (steady ns); nullopt if it brought enough in its window, which then
  // starts again.
  std::optional<absl::Status> TooSlow(Stream* stream, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRefusal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stream::Release's work.
  void ReleaseLocked(Stream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int64_t SteadyNanos();

  const RpcLimits limits_;
  const std::function<int64_t()> push_buffer_budget_;
  mutable absl::Mutex mu_;
  absl::CondVar stop_signal_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  // Of streams_, not released: those without a worker, and those with one.
  int unnamed_ ABSL_GUARDED_BY(mu_) = 0;
  int named_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, int> per_worker_ ABSL_GUARDED_BY(mu_);
  int64_t push_buffer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread watchdog_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_OPEN_STREAMS_H_
