// One Exchange call (proto/ps.proto) to one shard, on gRPC's completion-
// queue API: the request's messages are written in the order given, one at
// a time, as the connection takes them; each answer message is handed to
// the caller's function as it arrives. The events run on whichever thread
// waits on the client's queue (rpc/completion_driver.h), usually the one
// that waits for this call's answer, so no thread is made or held for the
// call and the answer is decoded where it is awaited.
#ifndef PST_WORKER_CLIENT_SHARD_CALL_H_
#define PST_WORKER_CLIENT_SHARD_CALL_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "rpc/completion_driver.h"
#include "rpc/completion_tag.h"

namespace pst {

class ShardCall {
 public:
  // Takes one answer message (its bytes may be moved out). An error ends
  // the call: it is cancelled, and Wait returns the error.
  using TakeAnswer = std::function<absl::Status(grpc::ByteBuffer* message)>;
  // Told the call's outcome once it is over (Wait's status), before Wait
  // returns.
  using OnEnd = std::function<void(const absl::Status& status)>;

  // How many messages the exchange has. kOneEachWay: the request is one
  // message and the answer will be one (a share of at most one chunk, or
  // a shared exchange): the call is made as a unary call, one operation
  // and one event instead of four. The shard serves both alike.
  enum class Shape { kStreams, kOneEachWay };

  // Prepares the call on `stub` and `driver`, which must outlive it, ending
  // by `deadline` from now.
  ShardCall(grpc::GenericStub* stub, CompletionDriver* driver, absl::Duration deadline,
            TakeAnswer take, OnEnd on_end = {}, Shape shape = Shape::kStreams);
  // Cancels a call whose answer is not whole, and waits until gRPC is done
  // with it.
  ~ShardCall();
  ShardCall(const ShardCall&) = delete;
  ShardCall& operator=(const ShardCall&) = delete;

  // Starts the call: its first queued message goes out, and its answer is
  // read. Call once.
  void Start();
  // Queues `message` behind the ones before it; `last` ends the request
  // (no Write may follow). False, with the message dropped, once a write
  // has failed: the shard ended the call, and Wait says why. One caller at
  // a time. A kOneEachWay call takes one message, which must be `last`.
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
  // Whether the answer is whole or the call over (Wait would not wait).
  bool Answered();
  // What Wait would return, once Answered(); nullopt before. Never waits.
  std::optional<absl::Status> Outcome();
  // Whether gRPC has taken every message written so far, or will take no
  // more (the request is whole, or the call failed).
  bool Sent();

 private:
  void OnWriteDone(bool ok);
  void OnReadDone(bool ok);
  void OnFinished(bool ok);
  // Issues the next queued write if none is in flight.
  void Pump();
  // Asks for the call's status once nothing more is read or written.
  void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Over();

  grpc::GenericStub* const stub_;
  CompletionDriver* const driver_;
  const Shape shape_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;           // kStreams
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> unary_call_;  // kOneEachWay
  const TakeAnswer take_;
  const OnEnd on_end_;
  grpc::ByteBuffer in_;  // touched by the reading event only
  grpc::Status grpc_status_;
  MemberTag<ShardCall, &ShardCall::OnWriteDone> write_tag_{this};
  MemberTag<ShardCall, &ShardCall::OnReadDone> read_tag_{this};
  MemberTag<ShardCall, &ShardCall::OnFinished> finish_tag_{this};

  absl::Mutex mu_;
  struct Outgoing {
    grpc::ByteBuffer message;
    bool last = false;
  };
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);  // front: in flight while writing_
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool issued_ ABSL_GUARDED_BY(mu_) = false;  // gRPC has the call
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;      // no more writes
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;  // no more reads
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;   // Finish issued
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // Finish's event is in: gRPC is done
  absl::Status problem_ ABSL_GUARDED_BY(mu_);  // TakeAnswer's
  absl::Status status_ ABSL_GUARDED_BY(mu_);   // the outcome, once done_
};

}  // namespace pst

#endif  // PST_WORKER_CLIENT_SHARD_CALL_H_
