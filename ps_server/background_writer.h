// Writes one stream's messages, in order, on a thread of a pool.
//
// A sync-API Write blocks until gRPC has taken the message, and on a busy
// connection that means waiting for the peer to read. Writing a large
// answer message takes about as long as staging a chunk of the push, so a
// PushPull's serving thread that wrote its answers itself would do the two
// one after the other, with the push's next chunk arrived and unread. With
// the answers written from here, the serving thread goes straight on to
// read and stage the next chunk while the last answer is written.
#ifndef PST_PS_SERVER_BACKGROUND_WRITER_H_
#define PST_PS_SERVER_BACKGROUND_WRITER_H_

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "grpcpp/support/byte_buffer.h"

namespace pst {

// Write and Finish are called from one thread, the one serving the call.
class BackgroundWriter {
 public:
  // `write` sends one message on the stream (false: the call has ended). It
  // is called from the writer's thread only, one message at a time, and
  // must stay callable until Finish has returned. gRPC allows one thread to
  // write a stream while another reads it. The writes run on a thread of
  // `threads`, which must outlive the writer.
  BackgroundWriter(std::function<bool(const grpc::ByteBuffer&)> write, ThreadPool* threads);
  // Finishes first.
  ~BackgroundWriter();

  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Queues `message` behind the ones before it and returns at once; the
  // writing starts with the first message. False, and the message dropped,
  // once a write has failed: nothing after a failed write is sent.
  bool Write(grpc::ByteBuffer message);

  // Waits until every queued message is written (or dropped after a
  // failure) and gives the thread back; false if a write failed. The
  // caller may then write on the stream itself. No Write may follow.
  bool Finish();

 private:
  void Run();

  const std::function<bool(const grpc::ByteBuffer&)> write_;
  absl::Mutex mu_;
  // Signalled when a message is queued or Finish begins. (A CondVar, not
  // Mutex::Await: absl evaluates an Await condition on whichever thread
  // unlocks, which the TSan build's annotations, scripts/tsan_absl_mutex.cc,
  // cannot order.)
  absl::CondVar work_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  ThreadPool* const threads_;
  // The writing: started by the first Write, waited for by Finish. Touched
  // by the caller's thread only.
  ThreadPool::Task writing_;
  bool started_ = false;
};

}  // namespace pst

#endif  // PST_PS_SERVER_BACKGROUND_WRITER_H_
