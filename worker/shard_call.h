// One Exchange call (proto/ps.proto) to one shard, driven by gRPC's
// callback API: the request's messages are written in the order given, one
// at a time, as the connection takes them; each answer message is handed to
// the caller's function on a gRPC thread as it arrives. No thread of the
// caller's is held while the call runs, and none is made for it: the
// caller queues its messages and waits for the end.
#ifndef PST_WORKER_SHARD_CALL_H_
#define PST_WORKER_SHARD_CALL_H_

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/client_callback.h"

namespace pst {

class ShardCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Takes one answer message (its bytes may be moved out). An error ends
  // the call: it is cancelled, and Wait returns the error.
  using TakeAnswer = std::function<absl::Status(grpc::ByteBuffer* message)>;
  // Told the call's outcome once it is over (Wait's status), on a gRPC
  // thread, before Wait returns.
  using OnEnd = std::function<void(const absl::Status& status)>;

  // Prepares the call on `stub`, which must outlive it, ending by
  // `deadline` from now.
  ShardCall(grpc::GenericStub* stub, absl::Duration deadline, TakeAnswer take, OnEnd on_end = {});
  // Waits for the call to end (cancelling it first if it was started and
  // not waited for).
  ~ShardCall() override;
  ShardCall(const ShardCall&) = delete;
  ShardCall& operator=(const ShardCall&) = delete;

  // Starts the call: its first queued message goes out, and its answer is
  // read. Call once.
  void Start();
  // Queues `message` behind the ones before it; `last` ends the request
  // (no Write may follow). False, with the message dropped, once a write
  // has failed: the shard ended the call, and Wait says why. One caller at
  // a time.
  bool Write(grpc::ByteBuffer message, bool last);
  // Ends the call early (the shard drops what it has of it).
  void Cancel();
  // For TakeAnswer: the message it just took ends the answer, and says the
  // exchange succeeded (its outcome is in it). Nothing more is read, and
  // Wait returns OK at once, before gRPC has finished the call.
  void AnswerComplete();
  // Waits for the call's end (or the answer's, AnswerComplete): OK, the
  // first error of TakeAnswer, or the call's status from the shard (or
  // gRPC) as an absl::Status whose message is gRPC's. Idempotent.
  absl::Status Wait();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Issues the next queued write if none is in flight.
  void Pump();
  // Lets the call end once no more writes will be issued.
  void ReleaseHold() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::ClientContext context_;
  const TakeAnswer take_;
  const OnEnd on_end_;
  grpc::ByteBuffer in_;
  absl::Status problem_;  // TakeAnswer's, set on the reading callback only
  absl::Status status_;   // set in OnDone
  bool answered_ = false;  // set on the reading callback only
  absl::Notification answer_;  // the answer is whole, or the call is done
  absl::Notification done_;

  absl::Mutex mu_;
  struct Outgoing {
    grpc::ByteBuffer message;
    bool last = false;
  };
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);  // front: in flight while writing_
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool last_written_ ABSL_GUARDED_BY(mu_) = false;
  bool holding_ ABSL_GUARDED_BY(mu_) = true;  // until the last write is out, or none can be
};

}  // namespace pst

#endif  // PST_WORKER_SHARD_CALL_H_
