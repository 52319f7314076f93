// One unary call of the service on a completion queue (rpc/completion_tag.h):
// requested, handed to its method's Serve as it arrives (with the next call
// requested first), answered by one Finish (now, or later from any thread),
// and freed once gRPC has sent the answer.
#ifndef PST_PS_SERVER_SERVICE_UNARY_CALL_H_
#define PST_PS_SERVER_SERVICE_UNARY_CALL_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "grpcpp/completion_queue.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/async_unary_call.h"
#include "ps_server/service/async_service.h"
#include "rpc/completion_tag.h"

namespace pst {

template <typename Request, typename Response>
class UnaryCall final : public CompletionTag {
 public:
  using RequestCall = void (AsyncParameterServer::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  struct Method {
    AsyncParameterServer* service;
    RequestCall request;  // the generated Request<Name>
    // Answers the call (by Finish, exactly once). Runs on a queue thread,
    // so it must not block: work that may is handed elsewhere.
    std::function<void(UnaryCall* call)> serve;
    // Whether the call learns that its client went away (SetOnCancel): for
    // a method whose answer may wait. It costs one more event per call.
    bool cancellable = false;
  };

  // Requests the next call of `method` (which must outlive the server) on
  // `queue`.
  static void Await(const Method* method, grpc::ServerCompletionQueue* queue) {
    auto* call = new UnaryCall(method, queue);
    if (method->cancellable) call->context_.AsyncNotifyWhenDone(&call->over_tag_);
    (method->service->*method->request)(&call->context_, &call->request_, &call->writer_, queue,
                                        queue, call);
  }

  const Request& request() const { return request_; }
  // The request, moved out: for work that outlasts the answer (the call,
  // request included, is freed once the answer is sent).
  Request TakeRequest() { return std::move(request_); }
  Response* response() { return &response_; }
  grpc::ServerContext* context() { return &context_; }

  // For a cancellable method: `cancelled` runs once, on a queue thread (at
  // once if that has happened already), if the client goes away before
  // the answer is sent. The call must still be finished.
  void SetOnCancel(std::function<void()> cancelled) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        on_cancel_ = std::move(cancelled);
        return;
      }
    }
    cancelled();
  }

  // Sends the response (if `status` is OK) or the error.
  void Finish(const grpc::Status& status) {
    if (status.ok()) {
      writer_.Finish(response_, status, this);
    } else {
      writer_.FinishWithError(status, this);
    }
  }

  void Complete(bool ok) override {
    if (!arrived_ && !ok) {  // the server shut down before a call came
      delete this;
      return;
    }
    if (arrived_) {  // the answer is out (or the call is gone)
      bool last = true;
      if (method_->cancellable) {
        absl::MutexLock lock(&mu_);
        finished_ = true;
        last = over_;
      }
      if (last) delete this;
      return;
    }
    arrived_ = true;
    Await(method_, queue_);
    method_->serve(this);
  }

 private:
  UnaryCall(const Method* method, grpc::ServerCompletionQueue* queue)
      : method_(method), queue_(queue) {}
  ~UnaryCall() = default;

  // A cancellable call is over: answered, or cancelled.
  void OnOver(bool /*ok*/) {
    std::function<void()> cancelled;
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      over_ = true;
      last = finished_;
      if (context_.IsCancelled()) {
        cancelled_ = true;
        cancelled = std::move(on_cancel_);
      }
    }
    if (cancelled) cancelled();
    if (last) delete this;
  }

  const Method* const method_;
  grpc::ServerCompletionQueue* const queue_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> writer_{&context_};
  bool arrived_ = false;
  MemberTag<UnaryCall, &UnaryCall::OnOver> over_tag_{this};
  absl::Mutex mu_;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_UNARY_CALL_H_
