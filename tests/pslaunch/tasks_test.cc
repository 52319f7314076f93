// The tasks pslaunch starts: every override of the table that pslaunch is
// given reaches each task that takes it, on the start it belongs to, and
// no other task.
#include "pslaunch/tasks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/overrides.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

// A value of `flag`'s type other than its default.
std::string OtherValue(const absl::CommandLineFlag& flag) {
  const std::string value = flag.DefaultValue();
  if (flag.IsOfType<bool>()) return value == "true" ? "false" : "true";
  if (flag.IsOfType<std::string>()) return value + "given";
  double number = 0;
  EXPECT_TRUE(absl::SimpleAtod(value, &number)) << flag.Name() << " default " << value;
  return absl::StrCat(static_cast<int64_t>(number) + 1);
}

int Count(const std::vector<std::string>& args, const std::string& arg) {
  return static_cast<int>(std::count(args.begin(), args.end(), arg));
}

JobConfig TwoShardsTwoWorkers() {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:0");
  config.mutable_cluster()->add_ps("127.0.0.1:0");
  config.mutable_cluster()->set_workers(2);
  return config;
}

TEST(ClusterTasksTest, EveryOverrideReachesTheTasksThatTakeIt) {
  ASSERT_GT(Overrides().size(), 25u);
  for (const Override& entry : Overrides()) {
    SCOPED_TRACE(entry.name());
    absl::FlagSaver restore;
    const std::string arg = absl::StrCat("--", entry.name(), "=", OtherValue(*entry.flag));
    char* argv[] = {const_cast<char*>("pslaunch"), const_cast<char*>(arg.c_str())};
    // What pslaunch's own parsing does with it: accept it and set the flag.
    ASSERT_TRUE(CheckCommandLine(2, argv, kPslaunch).ok()) << arg;
    ASSERT_TRUE(entry.Given());
    const std::string forwarded = absl::StrCat("--", entry.name(), "=", entry.flag->CurrentValue());

    absl::StatusOr<std::vector<ChildSpec>> tasks = ClusterTasks(
        TwoShardsTwoWorkers(),
        {"/bin", "/run/cluster.textproto", "/run", {{"ps:1", "/run/ps-1.port"}}, "", ""});
    ASSERT_TRUE(tasks.ok()) << tasks.status();
    ASSERT_EQ(tasks->size(), 4u);
    for (const ChildSpec& task : *tasks) {
      SCOPED_TRACE(task.name);
      const bool takes = entry.Takes(absl::StartsWith(task.name, "ps:") ? kPsServer : kWorker);
      const bool every_start = takes && entry.forwarding == Forwarding::kEveryStart;
      const bool first_start = takes && entry.forwarding == Forwarding::kFirstStart;
      EXPECT_EQ(Count(task.argv, forwarded), every_start ? 1 : 0);
      EXPECT_EQ(Count(task.first_start_args, forwarded), first_start ? 1 : 0);
    }
  }
}

TEST(ClusterTasksTest, AnOverrideLeftAtItsDefaultIsNotPassedOn) {
  absl::StatusOr<std::vector<ChildSpec>> tasks =
      ClusterTasks(TwoShardsTwoWorkers(), {"/bin", "/run/cluster.textproto", "/run", {}, "", ""});
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_THAT((*tasks)[0].argv, ::testing::ElementsAre("/bin/ps_server",
                                                       "--config=/run/cluster.textproto",
                                                       "--task=ps:0"));
  EXPECT_THAT((*tasks)[3].argv,
              ::testing::ElementsAre("/bin/worker", "--config=/run/cluster.textproto",
                                     "--task=worker:1", "--result_file=/run/worker-1.json"));
  EXPECT_THAT((*tasks)[1].first_start_args, ::testing::IsEmpty());
}

TEST(ClusterTasksTest, APortFileGoesToItsShardsFirstStartOnly) {
  absl::StatusOr<std::vector<ChildSpec>> tasks = ClusterTasks(
      TwoShardsTwoWorkers(),
      {"/bin", "/run/cluster.textproto", "/run", {{"ps:1", "/run/ps-1.port"}}, "", ""});
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_THAT((*tasks)[0].first_start_args, ::testing::IsEmpty());
  EXPECT_THAT((*tasks)[1].first_start_args, ::testing::ElementsAre("--port_file=/run/ps-1.port"));
  EXPECT_EQ(Count((*tasks)[1].argv, "--port_file=/run/ps-1.port"), 0);
}

// cluster.ps_backups: each backup is a ps_server of its own, started before
// the primaries (which read their backups' addresses as they start), with
// its port file keyed by its task name.
TEST(ClusterTasksTest, BackupsStartFirstAsReplicasOfTheirShards) {
  JobConfig config = TwoShardsTwoWorkers();
  config.mutable_cluster()->add_ps_backups()->add_address("127.0.0.1:0");
  config.mutable_cluster()->add_ps_backups()->add_address("127.0.0.1:0");
  absl::StatusOr<std::vector<ChildSpec>> tasks = ClusterTasks(
      config, {"/bin", "/run/cluster.textproto", "/run", {{"ps:1:1", "/run/ps-1-1.port"}}, "", ""});
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 6u);
  std::vector<std::string> names;
  for (const ChildSpec& task : *tasks) names.push_back(task.name);
  EXPECT_THAT(names,
              ::testing::ElementsAre("ps:0:1", "ps:1:1", "ps:0", "ps:1", "worker:0", "worker:1"));
  EXPECT_THAT((*tasks)[1].argv,
              ::testing::ElementsAre("/bin/ps_server", "--config=/run/cluster.textproto",
                                     "--task=ps:1", "--replica=1"));
  EXPECT_THAT((*tasks)[1].first_start_args, ::testing::ElementsAre("--port_file=/run/ps-1-1.port"));
  EXPECT_THAT((*tasks)[3].first_start_args, ::testing::IsEmpty());
}

// --relay: each shard at its socket file, and nghttpx at its address in
// front of it; with cluster.tls, the task's files on both of the relay's sides.
TEST(ClusterTasksTest, ARelayStandsInFrontOfEachShard) {
  JobConfig config = TwoShardsTwoWorkers();
  config.mutable_cluster()->set_ps(0, "127.0.0.1:50051");
  config.mutable_cluster()->set_ps(1, "ps-1.example:50052");
  const TaskPaths paths{"/bin", "/run/cluster.textproto", "/run", {}, "/usr/sbin/nghttpx",
                        "/etc/relay.conf"};
  absl::StatusOr<std::vector<ChildSpec>> tasks = ClusterTasks(config, paths);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 6u);
  EXPECT_EQ((*tasks)[0].name, "ps:0");
  EXPECT_EQ(Count((*tasks)[0].argv, "--listen=unix:/run/ps-0.sock"), 1);
  EXPECT_EQ((*tasks)[1].name, "relay:0");
  EXPECT_FALSE((*tasks)[1].must_finish);
  EXPECT_THAT((*tasks)[1].argv,
              ::testing::ElementsAre("/usr/sbin/nghttpx", "--conf=/etc/relay.conf",
                                     "--frontend=127.0.0.1,50051;no-tls",
                                     "--backend=unix:/run/ps-0.sock;;proto=h2"));
  EXPECT_EQ((*tasks)[2].name, "ps:1");
  EXPECT_EQ(Count((*tasks)[2].argv, "--listen=unix:/run/ps-1.sock"), 1);
  EXPECT_EQ((*tasks)[3].name, "relay:1");
  EXPECT_EQ((*tasks)[4].name, "worker:0");

  TlsConfig* tls = config.mutable_cluster()->mutable_tls();
  tls->set_cert("/tls/task.crt");
  tls->set_key("/tls/task.key");
  tls->set_ca("/tls/ca.crt");
  tls->set_require_client_cert(true);
  tls->set_server_name("pstrain-ps");
  tasks = ClusterTasks(config, paths);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_THAT((*tasks)[3].argv,
              ::testing::ElementsAre(
                  "/usr/sbin/nghttpx", "--conf=/etc/relay.conf", "--frontend=ps-1.example,50052",
                  "--backend=unix:/run/ps-1.sock;;proto=h2;tls;sni=pstrain-ps",
                  "--cacert=/tls/ca.crt", "--client-private-key-file=/tls/task.key",
                  "--client-cert-file=/tls/task.crt", "--verify-client",
                  "--verify-client-cacert=/tls/ca.crt", "/tls/task.key", "/tls/task.crt"));

  // A port the relay cannot bind in advance.
  config.mutable_cluster()->set_ps(1, "127.0.0.1:0");
  tasks = ClusterTasks(config, paths);
  EXPECT_EQ(tasks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tasks.status().message()),
              ::testing::HasSubstr("the relay needs a fixed port"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
