// A PS killed with SIGKILL while it writes a checkpoint, or while it trains,
// over and over: each restart restores the newest checkpoint whose whole
// chain was written (a full one, or a delta and the links before it), and
// training goes on. The PS holds a CTR model whose table lives mostly on
// disk (storage { memory_bytes disk }) and checkpoints every few steps,
// deltas between full ones. The kills are timed on what the PS does: a
// temporary checkpoint file appearing (inotify), or a version reached.
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The checkpoint files begun in a directory (their temporary files
// created) from the moment this is made on, as inotify reports them.
class CheckpointsBegun {
 public:
  explicit CheckpointsBegun(const std::string& dir) : fd_(inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) {
    if (fd_ >= 0 && inotify_add_watch(fd_, dir.c_str(), IN_CREATE) < 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~CheckpointsBegun() {
    if (fd_ >= 0) close(fd_);
  }
  CheckpointsBegun(const CheckpointsBegun&) = delete;
  CheckpointsBegun& operator=(const CheckpointsBegun&) = delete;

  // Blocks until the `n`th one has begun since this was made; false if it
  // did not within `timeout`.
  bool Await(int n, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    alignas(inotify_event) char buffer[4096];
    while (fd_ >= 0 && seen_ < n && absl::Now() < deadline) {
      pollfd ready = {fd_, POLLIN, 0};
      if (poll(&ready, 1, 100) <= 0) continue;
      const ssize_t got = read(fd_, buffer, sizeof(buffer));
      for (ssize_t at = 0; at < got;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        const std::string name = event->len > 0 ? event->name : "";
        if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) ++seen_;
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    return seen_ >= n;
  }

 private:
  int fd_;
  int seen_ = 0;
};

class CheckpointKillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(ScratchDir(), "/checkpoint_kill");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // The job, naming the PS at `address_` (port 0 until it reported one).
  void WriteConfig() {
    std::ofstream(dir_ + "/job.textproto") << absl::StrCat(
        "cluster { ps: \"", address_.empty() ? "127.0.0.1:0" : address_, "\" workers: 1 }\n",
        "training {\n  mode: ASYNC\n",
        "  optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 0.01 } }\n",
        "  batch_size: 64 epochs: 2 seed: 1\n",
        "  model {\n    ctr { table: \"categorical\" hidden: 16 pooling: POOLING_SUM }\n",
        // A RAM budget of a few hundred rows: most of the table is on disk.
        "    embeddings { name: \"categorical\" dim: 8 init_scale: 0.05\n",
        "      storage { memory_bytes: 40000 disk: \"", dir_, "/tier\" } }\n  }\n",
        "  dataset { ctr { train_file: \"", dir_, "/train.tsv\" test_file: \"", dir_,
        "/test.tsv\" format: CRITEO\n",
        "    generate { train_examples: 20000 test_examples: 2000 distinct: 5000 } } }\n",
        "  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 5 full_every: 3 keep: 2 }\n}\n");
  }

  std::unique_ptr<ChildProcess> StartPs(const std::string& extra_arg, const std::string& log) {
    std::vector<std::string> argv = {Bin("ps_server"), "--config=" + dir_ + "/job.textproto",
                                     "--task=ps:0"};
    if (!extra_arg.empty()) argv.push_back(extra_arg);
    const std::string port_file = dir_ + "/ps.port";
    if (address_.empty()) argv.push_back("--port_file=" + port_file);
    auto ps = std::make_unique<ChildProcess>(argv, dir_ + "/" + log);
    if (address_.empty()) {
      if (const int port = AwaitPortFile(port_file, ps->pid()); port > 0) {
        address_ = absl::StrCat("127.0.0.1:", port);
        WriteConfig();
      }
    }
    return ps;
  }

  std::string Log(const std::string& name) { return ReadFile(dir_ + "/" + name); }

  int64_t Version() {
    auto client = PsClient::Connect({address_}, 0, absl::Seconds(5));
    if (!client.ok()) return -1;
    absl::StatusOr<StatsResponse> stats = (*client)->Stats(0);
    return stats.ok() ? stats->version() : -1;
  }

  // The version the PS logged it restored, once it has (-1 if it did not
  // within the timeout).
  int64_t RestoredVersion(const std::string& log) {
    const std::string marker = "restored its checkpoint at version ";
    int64_t restored = -1;
    Eventually(
        [&] {
          const std::string text = Log(log);
          const size_t at = text.find(marker);
          if (at != std::string::npos) restored = std::stoll(text.substr(at + marker.size()));
          return restored >= 0;
        },
        absl::Seconds(30), absl::Milliseconds(20));
    return restored;
  }

  // The newest version a restore can give: that of the newest file whose
  // chain is all there (kill -9 tears no renamed file, so presence is
  // what matters), or -1.
  static int64_t NewestWholeChain(const std::string& shard_dir) {
    std::map<int64_t, CheckpointName> links;
    for (const std::string& file : ListCheckpoints(shard_dir)) {
      if (auto name = ParseCheckpointName(std::filesystem::path(file).filename().string())) {
        links[name->version] = *name;
      }
    }
    for (auto it = links.rbegin(); it != links.rend(); ++it) {
      int64_t at = it->first;
      while (links.contains(at) && links[at].delta) at = links[at].parent_version;
      if (links.contains(at)) return it->first;
    }
    return -1;
  }

  std::string dir_;
  std::string address_;
};

TEST_F(CheckpointKillTest, EveryRestartRestoresTheNewestWholeChainAndTrainingGoesOn) {
  WriteConfig();
  auto ps = StartPs("", "ps-0.log");
  ASSERT_FALSE(address_.empty()) << Log("ps-0.log");
  const std::string shard_dir = dir_ + "/ckpt/shard-0";
  ASSERT_TRUE(std::filesystem::exists(shard_dir)) << Log("ps-0.log");  // made before serving
  auto begun = std::make_unique<CheckpointsBegun>(shard_dir);
  auto worker = std::make_unique<ChildProcess>(
      std::vector<std::string>{Bin("worker"), "--config=" + dir_ + "/job.textproto",
                               "--task=worker:0"},
      dir_ + "/worker-0.log");
  // Each life of the PS starts a chain with a full checkpoint, then two
  // deltas (full_every: 3). Killed as the 4th (full), 2nd and 3rd (deltas)
  // and 1st (full) checkpoint of a life begins, and once mid-training,
  // between two checkpoints.
  const int kills[] = {4, 2, 3, 1, 0};
  int64_t highest_restored = -1;
  std::vector<std::string> deltas_seen;
  for (size_t life = 0; life < std::size(kills); ++life) {
    SCOPED_TRACE(absl::StrCat("life ", life));
    const std::string log = absl::StrCat("ps-", life, ".log");
    if (kills[life] > 0) {
      ASSERT_TRUE(begun->Await(kills[life], absl::Seconds(120))) << Log(log);
      ps->Kill();
    } else {
      const int64_t from = Version();
      ASSERT_TRUE(Eventually([&] { return Version() >= from + 7; }, absl::Seconds(60),
                             absl::Milliseconds(5)))
          << Log(log);
      ps->Kill();
    }
    for (const std::string& file : ListCheckpoints(shard_dir)) {
      if (file.find(".delta-") != std::string::npos) deltas_seen.push_back(file);
    }
    const int64_t expected = NewestWholeChain(shard_dir);
    ASSERT_GE(expected, 0) << "no whole checkpoint on disk";
    const std::string next_log = absl::StrCat("ps-", life + 1, ".log");
    begun = std::make_unique<CheckpointsBegun>(shard_dir);
    ps = StartPs("--checkpoint_start=restore", next_log);
    const int64_t restored = RestoredVersion(next_log);
    ASSERT_EQ(restored, expected) << Log(next_log);
    EXPECT_EQ(restored % 5, 0);             // a checkpoint that was completed, on the schedule
    EXPECT_GE(restored, highest_restored);  // never an older chain than the last life's
    highest_restored = restored;
  }
  // Training goes on from the last restore, and the run completes.
  ASSERT_TRUE(Eventually([&] { return Version() > highest_restored + 5; }, absl::Seconds(60),
                         absl::Milliseconds(20)))
      << Log("worker-0.log");
  EXPECT_FALSE(deltas_seen.empty()) << "no delta was ever written";
  EXPECT_EQ(worker->Wait(absl::Seconds(300)), 0) << Log("worker-0.log");
  std::printf("checkpoint kill: %zu kills; restored up to version %lld; %zu delta file(s) seen\n",
              std::size(kills), static_cast<long long>(highest_restored), deltas_seen.size());
}

}  // namespace PST_FILE_ID
}  // namespace pst
