// A primary's sender to one backup (ReplicaSender) over gRPC, against a
// backup whose calls fail until it is let up, as while its process starts:
// in a job's first office, within the start patience, the backup stays in
// the commit rule and takes the state whole once up; past it, or after a
// chain, the shard goes on without it.
#include "ps_server/service/replica_sender.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::ExpectSameState;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

// A backup process behind gRPC: every call fails (UNAVAILABLE) until
// LetUp; then it applies what it is sent to `shard`, as ps_server does.
class BackupService : public ParameterServer::Service {
 public:
  explicit BackupService(ParameterShard* shard) : shard_(shard) {}

  void LetUp() { up_.store(true); }
  // Whether `calls` calls have failed by `timeout`.
  bool AwaitFailedCalls(int calls, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto failed = [this, calls]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return failed_ >= calls; };
    return mu_.AwaitWithTimeout(absl::Condition(&failed), timeout);
  }

  grpc::Status Stats(grpc::ServerContext*, const StatsRequest*, StatsResponse*) override {
    return Answer();
  }
  grpc::Status Replicate(grpc::ServerContext*, const ReplicaUpdate* update,
                         ReplicaAck* ack) override {
    if (grpc::Status down = Answer(); !down.ok()) return down;
    // A refusal's answer says what the backup holds.
    absl::Status applied = shard_->ApplyReplicaUpdate(*update, ack);
    return applied.ok() || absl::IsFailedPrecondition(applied)
               ? grpc::Status::OK
               : grpc::Status(grpc::StatusCode::INTERNAL, std::string(applied.message()));
  }

 private:
  grpc::Status Answer() {
    if (up_.load()) return grpc::Status::OK;
    absl::MutexLock lock(&mu_);
    ++failed_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  }

  ParameterShard* const shard_;
  std::atomic<bool> up_{false};
  absl::Mutex mu_;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
};

class ReplicaSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int replica = 0; replica < 2; ++replica) {
      ShardOptions options = AsReplica(Options(ASYNC, 1), replica);
      options.elected = true;
      shards_.push_back(MakeShard(options));
    }
    service_ = std::make_unique<BackupService>(&backup());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    sender_.reset();
    if (server_) server_->Shutdown();
  }

  ParameterShard& primary() { return *shards_[0]; }
  ParameterShard& backup() { return *shards_[1]; }

  // Makes replica 0 primary in `office` and the Init's state its first
  // version, then starts forwarding to the backup; each time it is taken
  // out of the commit rule counts in drops_ and notifies dropped_.
  void StartSender(ParameterShard::Office office, absl::Duration start_patience) {
    ASSERT_TRUE(primary().BecomePrimary(1, office).ok());
    Init(&primary());
    const std::string address = absl::StrCat("127.0.0.1:", port_);
    sender_ = std::make_unique<ReplicaSender>(
        &primary(),
        ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        ReplicaSender::Options{.replica = 1,
                               .address = address,
                               .retry = absl::Milliseconds(5),
                               .start_patience = start_patience,
                               .drop = [this](int replica) {
                                 primary().SetReplicaLive(replica, false);
                                 if (++drops_ == 1) dropped_.Notify();
                                 return absl::OkStatus();
                               }});
  }

  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::unique_ptr<BackupService> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ReplicaSender> sender_;
  std::atomic<int> drops_{0};
  absl::Notification dropped_;
};

TEST_F(ReplicaSenderTest, ABackupNotUpYetAtTheStartStaysInTheCommitRuleAndTakesTheStateOnceUp) {
  StartSender(ParameterShard::Office::kFirstOfJob, absl::Seconds(60));
  // The Init's state, then the questions whether it answers.
  ASSERT_TRUE(service_->AwaitFailedCalls(3, absl::Seconds(30)));
  EXPECT_EQ(primary().ChainToPublish(), std::nullopt);
  service_->LetUp();
  ASSERT_TRUE(Eventually([&] { return primary().ChainToPublish().has_value(); }));
  EXPECT_THAT(primary().ChainToPublish(), Optional(ElementsAre(1)));
  EXPECT_EQ(drops_.load(), 0);
  ExpectSameState(primary(), backup());
}

TEST_F(ReplicaSenderTest, ABackupThatDoesNotComeUpWithinItsPatienceIsTakenOut) {
  const absl::Duration patience = absl::Milliseconds(300);
  const absl::Time started = absl::Now();
  StartSender(ParameterShard::Office::kFirstOfJob, patience);
  ASSERT_TRUE(dropped_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_GE(absl::Now() - started, patience);
  EXPECT_THAT(primary().ChainToPublish(), Optional(IsEmpty()));
  // Once up, it is asked again and brought back (the state whole).
  service_->LetUp();
  ASSERT_TRUE(Eventually([&] { return !primary().CaughtUpBackups().empty(); }));
  EXPECT_EQ(drops_.load(), 1);
}

// After a chain, the office acknowledges alone while its backups catch up:
// one that does not answer is taken out at once, not waited for.
TEST_F(ReplicaSenderTest, AfterAChainABackupThatDoesNotAnswerIsTakenOutAtOnce) {
  const absl::Duration patience = absl::Seconds(60);
  const absl::Time started = absl::Now();
  StartSender(ParameterShard::Office::kAfterAChain, patience);
  ASSERT_TRUE(dropped_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - started, patience);
}

}  // namespace PST_FILE_ID
}  // namespace pst
