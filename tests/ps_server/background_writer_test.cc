// BackgroundWriter: a stream's messages leave in order from a thread of
// a pool, the caller never waits on a write, and nothing follows a
// failed write.
#include "ps_server/background_writer.h"

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"

namespace pst {
namespace {

grpc::ByteBuffer Message(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Text(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(message.Dump(&slices).ok());
  std::string text;
  for (const grpc::Slice& s : slices) {
    text.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return text;
}

// What a stream received, and on which threads.
struct FakeStream {
  absl::Mutex mu;
  std::vector<std::string> written ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> writers ABSL_GUARDED_BY(mu);
  size_t failed_writes ABSL_GUARDED_BY(mu) = 0;
  size_t fail_from = SIZE_MAX;  // the write of this index on fails

  bool Write(const grpc::ByteBuffer& message) {
    absl::MutexLock lock(&mu);
    if (written.size() + failed_writes >= fail_from) {
      ++failed_writes;
      return false;
    }
    written.push_back(Text(message));
    writers.push_back(std::this_thread::get_id());
    return true;
  }
};

TEST(BackgroundWriterTest, WritesEveryMessageInOrderFromAnotherThread) {
  ThreadPool threads;
  FakeStream stream;
  BackgroundWriter writer([&](const grpc::ByteBuffer& m) { return stream.Write(m); },
                          &threads);
  std::vector<std::string> sent;
  for (int i = 0; i < 100; ++i) {
    sent.push_back("message " + std::to_string(i));
    ASSERT_TRUE(writer.Write(Message(sent.back())));
  }
  EXPECT_TRUE(writer.Finish());
  absl::MutexLock lock(&stream.mu);
  EXPECT_EQ(stream.written, sent);
  for (const std::thread::id& id : stream.writers) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, stream.writers.front());  // one writer: gRPC allows no more
  }
}

TEST(BackgroundWriterTest, WriteReturnsWhileAnEarlierWriteIsStillBlocked) {
  ThreadPool threads;
  absl::Notification peer_reads;
  std::vector<std::string> written;
  BackgroundWriter writer([&](const grpc::ByteBuffer& m) {
    // As a sync Write waits for the peer (bounded, so that a writer that
    // wrote on the caller's thread fails here rather than hangs).
    peer_reads.WaitForNotificationWithTimeout(absl::Seconds(10));
    written.push_back(Text(m));
    return true;
  }, &threads);
  EXPECT_TRUE(writer.Write(Message("a")));
  EXPECT_TRUE(writer.Write(Message("b")));  // the caller goes on meanwhile
  EXPECT_TRUE(written.empty());
  peer_reads.Notify();
  EXPECT_TRUE(writer.Finish());
  EXPECT_EQ(written, (std::vector<std::string>{"a", "b"}));
}

TEST(BackgroundWriterTest, NothingFollowsAFailedWrite) {
  ThreadPool threads;
  FakeStream stream;
  stream.fail_from = 2;
  BackgroundWriter writer([&](const grpc::ByteBuffer& m) { return stream.Write(m); },
                          &threads);
  for (int i = 0; i < 5; ++i) writer.Write(Message(std::to_string(i)));
  EXPECT_FALSE(writer.Finish());
  absl::MutexLock lock(&stream.mu);
  EXPECT_EQ(stream.written, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(stream.failed_writes, 1u);  // the messages after it were dropped unwritten
}

TEST(BackgroundWriterTest, WriteSaysSoOnceAWriteHasFailed) {
  ThreadPool threads;
  BackgroundWriter writer([](const grpc::ByteBuffer&) { return false; }, &threads);
  EXPECT_TRUE(writer.Write(Message("x")));  // queued before anything failed
  // The thread fails the write soon; every Write after that says so. Write's
  // answer is the one sign of the failure the caller gets, so ask until it
  // comes.
  EXPECT_TRUE(Eventually([&] { return !writer.Write(Message("y")); }));
  EXPECT_FALSE(writer.Write(Message("z")));
  EXPECT_FALSE(writer.Finish());
}

TEST(BackgroundWriterTest, FinishWithNothingWrittenSucceeds) {
  ThreadPool threads;
  bool called = false;
  BackgroundWriter writer([&](const grpc::ByteBuffer&) { return called = true; }, &threads);
  EXPECT_TRUE(writer.Finish());
  EXPECT_FALSE(called);
}

TEST(BackgroundWriterTest, DestructionWaitsForQueuedMessages) {
  ThreadPool threads;
  FakeStream stream;
  {
    BackgroundWriter writer([&](const grpc::ByteBuffer& m) { return stream.Write(m); },
                            &threads);
    for (int i = 0; i < 20; ++i) writer.Write(Message(std::to_string(i)));
  }
  absl::MutexLock lock(&stream.mu);
  EXPECT_EQ(stream.written.size(), 20u);
}

TEST(BackgroundWriterTest, SuccessiveCallsWriteFromOneKeptThread) {
  ThreadPool threads;
  FakeStream stream;
  for (int call = 0; call < 5; ++call) {
    BackgroundWriter writer([&](const grpc::ByteBuffer& m) { return stream.Write(m); },
                            &threads);
    ASSERT_TRUE(writer.Write(Message(std::to_string(call))));
    ASSERT_TRUE(writer.Finish());
  }
  EXPECT_EQ(threads.threads(), 1);
  absl::MutexLock lock(&stream.mu);
  ASSERT_EQ(stream.writers.size(), 5u);
  for (const std::thread::id& writer : stream.writers) EXPECT_EQ(writer, stream.writers[0]);
}

}  // namespace
}  // namespace pst
