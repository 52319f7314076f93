// Which failed calls a worker waits out, and why: read from the status's
// code and the shard's mark (common/transient_refusal.h), never from its
// message. Each class once as a shard's answer over real gRPC, and the
// ones a real shard gives: an exchange past the worker's limit
// (overloaded), a shared region it does not hold (region lost), a shard
// that is not there (restarting), a replicated shard's primary that does
// not answer Register within the wait (away).
#include "common/transient_refusal.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "ps_server/shm/shm_regions.h"
#include "rpc/grpc_status.h"
#include "rpc/worker_session.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

// A shard whose Heartbeat answers `answer`.
class Answers : public ParameterServer::Service {
 public:
  explicit Answers(absl::Status answer) : answer_(std::move(answer)) {}
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest*,
                         HeartbeatResponse*) override {
    return ToGrpcStatus(answer_);
  }

 private:
  const absl::Status answer_;
};

struct Case {
  std::string name;
  absl::Status answer;
  std::optional<TransientRefusal> expected;
};

TEST(TransientRefusalTest, TheClassIsReadFromTheCodeAndTheMarkAlone) {
  const std::vector<Case> cases = {
      {"marked overload", MarkTransient(absl::ResourceExhaustedError("busy"),
                                        TransientRefusal::kOverloaded),
       TransientRefusal::kOverloaded},
      {"marked region lost", MarkTransient(absl::NotFoundError("no such region"),
                                           TransientRefusal::kRegionLost),
       TransientRefusal::kRegionLost},
      {"marked restart", MarkTransient(absl::UnavailableError("shutting down"),
                                       TransientRefusal::kRestarting),
       TransientRefusal::kRestarting},
      {"UNAVAILABLE unmarked", absl::UnavailableError("gone"), TransientRefusal::kRestarting},
      // What used to be told apart by its words: a size limit is no
      // refusal for now, whatever it says.
      {"RESOURCE_EXHAUSTED unmarked", absl::ResourceExhaustedError("try again later"),
       std::nullopt},
      {"gRPC's size refusal", absl::ResourceExhaustedError("Received message larger than max"),
       std::nullopt},
      {"NOT_FOUND unmarked", absl::NotFoundError("no shared region 7 here (the PS restarted)"),
       std::nullopt},
      {"INVALID_ARGUMENT", absl::InvalidArgumentError("unavailable, busy, restarting"),
       std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Answers service(c.answer);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect({"127.0.0.1:" + std::to_string(port)}, 0, absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    const absl::Status answered = (*client)->Heartbeat(0);
    EXPECT_EQ(answered.code(), c.answer.code());
    EXPECT_TRUE(NamesItsShard(answered));
    EXPECT_EQ(TransientRefusalOf(answered), c.expected) << answered;
    EXPECT_EQ(IsTransientShardError(answered), c.expected.has_value());
  }
}

JobConfig SmallJob() {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(1);
  config.mutable_cluster()->set_worker_command("transient_refusal_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(ASYNC);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  t->mutable_model()->mutable_mlp()->add_hidden(4);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

// Exchanges of worker 0 held open on the shard (waiting for a version that
// never comes), taking its slots.
class HeldExchange {
 public:
  HeldExchange(const std::string& address, int worker)
      : stub_(ParameterServer::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    PullRequest pull;
    pull.set_min_version(1 << 30);
    pull.set_timeout_ms(600000);
    context_.AddMetadata(kSessionMetadataKey, absl::StrCat(ProcessSession()));
    stream_ = stub_->Exchange(&context_);
    EXPECT_TRUE(stream_->Write(PullOnly(pull, worker)));
  }
  ~HeldExchange() {
    context_.TryCancel();
    stream_->Finish().IgnoreError();
  }

 private:
  std::unique_ptr<ParameterServer::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> stream_;
};

TEST(TransientRefusalTest, AShardMarksAnExchangePastTheWorkersLimitAsAnOverload) {
  RpcLimits limits;
  limits.max_streams_per_worker = 1;
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(SmallJob(), 1, limits);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->config().cluster().ps(0);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect({address}, 0, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"w", {4}}});
  std::optional<HeldExchange> held;
  held.emplace(address, 0);
  std::vector<float> values(4);
  std::vector<int64_t> versions;
  absl::Status pulled;
  // Refused once the held exchange has claimed the worker's one slot. A
  // pull that reaches the shard before the held exchange takes the slot
  // itself and waits out its timeout (the shard is not initialised), and
  // the held exchange may then have been refused: open it again.
  EXPECT_TRUE(Eventually([&] {
    pulled = (*client)->Exchange(
        {.min_versions = {0}, .timeout = absl::Milliseconds(250), .values = {values}}, &versions,
        nullptr);
    if (absl::IsResourceExhausted(pulled)) return true;
    held.emplace(address, 0);
    return false;
  })) << pulled;
  EXPECT_EQ(TransientRefusalOf(pulled), TransientRefusal::kOverloaded) << pulled;
}

TEST(TransientRefusalTest, AShardMarksARegionItDoesNotHoldAsLost) {
  ShmRegions regions(/*enabled=*/true, /*num_workers=*/1, /*max_region_bytes=*/1 << 20);
  absl::StatusOr<ShmRegions::Claim> claim =
      regions.TryClaim(/*handle=*/12345, /*worker=*/0, [](absl::StatusOr<ShmRegions::Claimed>) {});
  ASSERT_FALSE(claim.ok());
  EXPECT_TRUE(absl::IsNotFound(claim.status()));
  EXPECT_EQ(MarkedTransient(claim.status()), TransientRefusal::kRegionLost);
  EXPECT_EQ(TransientRefusalOf(FromGrpcStatus(ToGrpcStatus(claim.status()))),
            TransientRefusal::kRegionLost);
}

TEST(TransientRefusalTest, AShardThatIsNotThereIsRestarting) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ParameterServer::Service unimplemented;
  builder.RegisterService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect({"127.0.0.1:" + std::to_string(port)}, 0, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  server->Shutdown();
  server->Wait();
  const absl::Status answered = (*client)->Heartbeat(0);
  EXPECT_TRUE(absl::IsUnavailable(answered)) << answered;
  EXPECT_EQ(TransientRefusalOf(answered), TransientRefusal::kRestarting);
}

// A replicated shard's primary whose Register answer comes after the
// client's wait on the first call, and at once on the next.
class SlowFirstRegister : public ParameterServer::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*,
                        RegisterResponse* response) override {
    if (calls_.fetch_add(1) == 0) release_.WaitForNotificationWithTimeout(absl::Seconds(30));
    response->set_epoch(1);
    return grpc::Status::OK;
  }
  absl::Notification release_;

 private:
  std::atomic<int> calls_{0};
};

// A backup: no primary here.
class NotPrimary : public ParameterServer::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse*) override {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "a backup");
  }
};

TEST(TransientRefusalTest, APrimaryThatAnswersRegisterTooLateIsAwayForNowNotFailed) {
  SlowFirstRegister primary;
  NotPrimary backup;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> addresses;
  for (ParameterServer::Service* service : {static_cast<ParameterServer::Service*>(&primary),
                                            static_cast<ParameterServer::Service*>(&backup)}) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    servers.push_back(builder.BuildAndStart());
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  }
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
      {addresses[0]}, 0, absl::Seconds(10), ClusterSecurity::Plaintext(), {{addresses[1]}});
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::StatusOr<RegisterResponse> late = (*client)->Register();
  primary.release_.Notify();
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
  EXPECT_TRUE(IsTransientShardError(late.status())) << late.status();
  EXPECT_TRUE(NamesItsShard(late.status()));
  const absl::StatusOr<RegisterResponse> again = (*client)->Register();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->epoch(), 1);
}

}  // namespace PST_FILE_ID
}  // namespace pst
