#include "rpc/queue_server.h"

#include "rpc/completion_tag.h"

namespace pst {

std::unique_ptr<QueueServer> QueueServer::Start(
    grpc::ServerBuilder* builder, int threads,
    const std::function<void(grpc::ServerCompletionQueue*)>& request_calls) {
  std::unique_ptr<QueueServer> server(new QueueServer);
  server->queue_ = builder->AddCompletionQueue();
  server->server_ = builder->BuildAndStart();
  if (server->server_ == nullptr) {
    server->queue_->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (server->queue_->Next(&tag, &ok)) {
    }
    server->shut_down_ = true;
    return nullptr;
  }
  request_calls(server->queue_.get());
  for (int i = 0; i < threads; ++i) {
    server->threads_.emplace_back([queue = server->queue_.get()] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) CompletionTag::Run(tag, ok);
    });
  }
  return server;
}

void QueueServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  // The threads keep running the calls' events while they end, and the
  // events of the requests the shutdown fails; only then is the queue shut.
  if (deadline == std::chrono::system_clock::time_point::max()) {
    server_->Shutdown();
  } else {
    server_->Shutdown(deadline);
  }
  queue_->Shutdown();
  for (std::thread& thread : threads_) thread.join();
}

}  // namespace pst
