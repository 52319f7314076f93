// A server shut down while a client opens and resets streams in a loop
// (HTTP/2 rapid reset) on one connection: in gRPC 1.51 the queue thread
// reading that connection comes back only when the client pauses, so the
// shutdown waited for the client (29 s for a 30 s attack on ps_server,
// SIGTERM included). A second past its deadline, the server's connections
// are shut down under it.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"

namespace pst {
namespace PST_FILE_ID {

TEST(ShutdownUnderAttackTest, AClientResettingStreamsDoesNotHoldUpTheShutdown) {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  std::unique_ptr<ParameterShard> shard = std::move(*ParameterShard::Create(options));
  // The default limits: the PS as the README starts it.
  absl::StatusOr<RunningServer> server =
      StartGrpcServer("127.0.0.1:0", shard.get(), {}, ClusterSecurity::Plaintext(), RpcLimits{});
  ASSERT_TRUE(server.ok()) << server.status();

  // The client, its standard output a pipe to this test.
  int out[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::string binary = PST_HTTP2_FLOOD_CLIENT, port = absl::StrCat(server->port),
              kind = "rapid_reset";
  char* argv[] = {binary.data(), port.data(), kind.data(), nullptr};
  pid_t client = -1;
  ASSERT_EQ(posix_spawn(&client, argv[0], &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  char line[16] = {};
  ASSERT_GT(read(out[0], line, sizeof(line)), 0) << "the client never got going";
  // The client never stops on its own, so a shutdown that waits for it
  // waits until this limit (it takes about 1 s when it does not): the
  // client is then stopped, and the test fails. The margin is for slow
  // machines, not a measurement.
  absl::Notification shut_down;
  std::atomic<bool> waited_for_the_client{false};
  std::thread limit([&] {
    if (!shut_down.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      waited_for_the_client = true;
      kill(client, SIGKILL);
    }
  });
  shard->BeginShutdown();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
  shut_down.Notify();
  limit.join();
  EXPECT_FALSE(waited_for_the_client.load());
  kill(client, SIGKILL);  // it ends on its own once its connection ends; never left running
  waitpid(client, nullptr, 0);
  close(out[0]);
}

}  // namespace PST_FILE_ID
}  // namespace pst
