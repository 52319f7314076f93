// The gRPC side of one Exchange call, on gRPC's completion-queue API
// (rpc/completion_tag.h): its reads, the answer's messages going out one
// at a time and then the status, its end (by the exchange, by the client
// going away, or by the idle watchdog of ps_server/service/open_streams.h), the
// waits the exchange leaves (shard waiters, a parked claim of a region),
// and when the call may be freed. What the exchange does with its
// messages is its subclass's (ExchangeCall, exchange_call.cc); this class
// knows nothing of pushes and pulls.
//
// The call is freed exactly once: after gRPC has reported every operation
// it started (its end included) and no pool task runs for it (OnOver has
// then run), and no waiter refers to it (each holds a reference).
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_RPC_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_RPC_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "ps_server/service/exchange_call.h"
#include "ps_server/service/exchange_phase.h"
#include "ps_server/service/open_streams.h"
#include "rpc/completion_tag.h"

namespace pst {

class ExchangeRpc {
 public:
  ExchangeRpc(const ExchangeRpc&) = delete;
  ExchangeRpc& operator=(const ExchangeRpc&) = delete;

  // Asks gRPC for the next call; OnArrived runs once it has arrived. A
  // request the server's shutdown ends frees the object.
  void Request();

 protected:
  ExchangeRpc(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue);
  virtual ~ExchangeRpc() = default;

  // The object that awaits the next call: requested as this one arrives,
  // before it is served, so that calls never wait for each other to arrive.
  virtual ExchangeRpc* Next() = 0;
  // The call has arrived: its stream is admitted (OpenStreams). The
  // subclass starts reading.
  virtual void OnArrived() = 0;
  // A read has ended, the call still going: the message is in received()
  // (`ok`), or the request has ended, or failed (the client went away).
  // A message is taken on the work pool where the shard is large (its
  // copying, decoding and applying outlast the hand-off), else on the
  // queue's thread that saw it arrive.
  virtual void OnRead(bool ok) = 0;
  // The call is over, with `status`: nothing of the subclass runs now, nor
  // will, but for the wakes of waiters it left (Resume answers false).
  // Gives back what the request holds; the admitted stream goes after it.
  virtual void OnOver(const absl::Status& status) = 0;

  // Reads the next message, unless the call has ended.
  void Read();
  grpc::ByteBuffer* received() { return &in_; }
  // Queues one of the answer's messages (dropped once the call has ended).
  void Write(grpc::ByteBuffer message);
  // Ends the call with `status`: on OK once the queued messages are out,
  // else at once, dropping those not yet being written. Only the first
  // end counts. The stream's place is given back at once.
  void End(absl::Status status);
  bool Ended();

  // The waits an exchange leaves, one of each kind at a time, for the
  // client's cancel to drop.
  enum class Wait { kShard, kRegion };
  enum class Parking {
    kEnded,    // the call had ended: nothing left, no reference taken
    kWaiting,  // a waiter was left: it holds a reference, and calls Resume once woken
    kNoWait,   // none was needed: the caller holds a reference to drop (or hand on)
  };
  // Under the call's lock, so that a cancel finds it: `leave` leaves a
  // waiter of kind `wait` and returns its id, or 0 if it need not wait.
  Parking Park(Wait wait, absl::FunctionRef<uint64_t()> leave);
  // A waiter of kind `wait` has been woken: true, with the call held
  // unfinished (a pool task) until LeaveBusy, if it goes on; false if the
  // call has ended. Either way the waiter's reference is the caller's to drop.
  bool Resume(Wait wait);
  // A pool task's end: lets the call be finished, and done.
  void LeaveBusy();

  // The call is freed once gRPC is done with it and no pool task or
  // waiter still refers to it.
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  grpc::ServerCompletionQueue* completion_queue() const { return completion_queue_; }
  grpc::ServerContext* context() { return &context_; }
  OpenStreams::Stream* open_stream() { return stream_.get(); }

  const ExchangeResources r_;

 private:
  using Wire = ExchangeWire;

  // What the idle watchdog holds of the call: the call until it is done.
  struct Handle {
    absl::Mutex mu;
    ExchangeRpc* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  // The events of the call's operations.
  void OnRequested(bool ok);
  // The arrival's work is over: as LeaveBusy, but only where the call has
  // ended meanwhile is there anything to finish.
  void LeaveArrival();
  void OnReadDone(bool ok);
  void TakeRead(bool ok);
  void OnWriteDone(bool ok);
  void OnFinished(bool ok);
  // The call is over: finished, or cancelled (the worker went away, its
  // deadline passed, the watchdog ended it).
  void OnCallOver(bool ok);
  void OnCancel();
  // An operation's event has come (`operation_ended`; false: a pool task's
  // end), and OnDone if it was the last thing outstanding: no operation in
  // flight, the call's end (AsyncNotifyWhenDone's) included, and no pool
  // task running.
  void Settle(bool operation_ended);
  void OnDone();

  // The watchdog's end: also while a write waits on the client.
  void EndIdle(const absl::Status& status);
  // Starts the next write, or the Finish, if it is time.
  void Pump();
  void EnterWire(Wire next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CheckTransition(wire_, next);
    wire_ = next;
  }
  // Drops the messages not yet being written.
  void DropUnsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t* WaitSlot(Wait wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return wait == Wait::kShard ? &shard_wait_ : &region_wait_;
  }

  grpc::ServerCompletionQueue* const completion_queue_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> call_{&context_};
  MemberTag<ExchangeRpc, &ExchangeRpc::OnRequested> requested_tag_{this};
  MemberTag<ExchangeRpc, &ExchangeRpc::OnReadDone> read_tag_{this};
  MemberTag<ExchangeRpc, &ExchangeRpc::OnWriteDone> write_tag_{this};
  MemberTag<ExchangeRpc, &ExchangeRpc::OnFinished> finish_tag_{this};
  MemberTag<ExchangeRpc, &ExchangeRpc::OnCallOver> over_tag_{this};
  bool offload_ = false;      // messages are taken on r_.work
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  const std::shared_ptr<Handle> handle_;
  std::unique_ptr<OpenStreams::Stream> stream_;
  grpc::ByteBuffer in_;  // touched by one read's work at a time

  absl::Mutex mu_;
  Wire wire_ ABSL_GUARDED_BY(mu_) = Wire::kIdle;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // front: being written
  std::optional<OpenStreams::Stream::ClientWait> read_wait_ ABSL_GUARDED_BY(mu_);
  std::optional<OpenStreams::Stream::ClientWait> write_wait_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
  // Pool tasks using the request's buffers, and the arrival's own work
  // until OnArrived returns: a later arrival or the watchdog may end the
  // call as soon as it is admitted, and the call must outlive that work.
  int busy_ ABSL_GUARDED_BY(mu_) = 1;
  // Operations started, their events not yet in; the call's end
  // (AsyncNotifyWhenDone) counts from the start, as it comes for every
  // call that arrives (one that never arrived is freed without Settle).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 1;
  // The waiters left: a shard's WaitId, a parked ShmRegions::ClaimId.
  uint64_t shard_wait_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t region_wait_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_RPC_H_
