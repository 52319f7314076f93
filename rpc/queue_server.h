// A gRPC server whose calls are all served on one completion queue
// (rpc/completion_tag.h) by a fixed set of threads: however many calls are
// open or waiting, the server's threads stay that many. Every thread both
// polls the sockets and runs the events it finds, so an event is run by
// the thread that saw it arrive.
#ifndef PST_RPC_COMPLETION_THREADS_H_
#define PST_RPC_COMPLETION_THREADS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace pst {

class QueueServer {
 public:
  // Adds the queue to `builder`, builds and starts the server, then calls
  // `request_calls(queue)` (which requests the first call of every method)
  // and starts `threads` threads on the queue. Null if the server did not
  // start (gRPC logs why).
  static std::unique_ptr<QueueServer> Start(
      grpc::ServerBuilder* builder, int threads,
      const std::function<void(grpc::ServerCompletionQueue*)>& request_calls);

  // Stops taking calls, waits for the open ones to end (cancelling those
  // still open at `deadline`), then drains the queue and joins the threads.
  // Later calls do nothing.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  void Shutdown() { Shutdown(std::chrono::system_clock::time_point::max()); }
  ~QueueServer() { Shutdown(); }

  QueueServer(const QueueServer&) = delete;
  QueueServer& operator=(const QueueServer&) = delete;

 private:
  QueueServer() = default;

  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
};

}  // namespace pst

#endif  // PST_RPC_COMPLETION_THREADS_H_
