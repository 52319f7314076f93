// TrainingSession against a real shard on loopback: the versions an
// exchange tags and waits for, the step redone after each class of refusal
// for now, the rejoin after the shard's restart, the lost-updates check, and
// the metrics it records.
#include "worker/session/training_session.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/transient_refusal.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_options.h"
#include "ps_server/service/ps_service.h"
#include "worker/client/ps_client.h"
#include "worker/client/worker_metrics.h"

namespace pst {
namespace PST_FILE_ID {

const std::vector<VariableSpec> kModel = {{"w", {4}}};

JobConfig AsyncJob() {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(1);
  // The test brings its own model (kModel).
  config.mutable_cluster()->set_worker_command("training_session_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(ASYNC);
  t->set_pull_timeout_seconds(30);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  t->mutable_model()->mutable_mlp()->add_hidden(4);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

// One shard on a port of its own that can stop and come back there: with
// its state (Restart: its server only, as after a lost connection) or
// without (Replace: a new shard, as a restart with no checkpoint).
class RestartableShard {
 public:
  explicit RestartableShard(const JobConfig& config) : config_(config) {
    EXPECT_TRUE(Serve(NewShard(), "127.0.0.1:0").ok());
  }
  ~RestartableShard() {
    if (shard_ != nullptr) shard_->BeginShutdown();
    server_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Its server stops; the shard keeps its state.
  void Stop() { server_.reset(); }
  absl::Status Restart() {
    Stop();
    return Serve(std::move(shard_), address());
  }
  absl::Status Replace() {
    shard_->BeginShutdown();
    Stop();
    return Serve(NewShard(), address());
  }

 private:
  std::unique_ptr<ParameterShard> NewShard() {
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard =
        ParameterShard::Create(ShardOptionsFromConfig(config_, 0));
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? std::move(*shard) : nullptr;
  }
  absl::Status Serve(std::unique_ptr<ParameterShard> shard, const std::string& address) {
    shard_ = std::move(shard);
    absl::StatusOr<RunningServer> server = StartGrpcServer(address, shard_.get(), AdminHooks{});
    if (!server.ok()) return server.status();
    port_ = server->port;
    server_ = std::make_unique<RunningServer>(std::move(*server));
    return absl::OkStatus();
  }

  const JobConfig config_;
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<RunningServer> server_;
  int port_ = 0;
};

class TrainingSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = std::make_unique<RestartableShard>(config_);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect({shard_->address()}, 0, absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    client_->SetVariables(kModel);
    absl::StatusOr<std::unique_ptr<TrainingSession>> session =
        TrainingSession::Create(config_, 0, client_.get());
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::move(*session);
    ASSERT_TRUE(session_->Join().ok());
    absl::StatusOr<bool> init =
        session_->Init([] { return std::vector<std::vector<float>>{{0, 0, 0, 0}}; });
    ASSERT_TRUE(init.ok()) << init.status();
  }

  // One step: push a gradient of ones (SGD at rate 1 subtracts it), read
  // the values back.
  absl::Status Step() {
    return session_->Exchange({.gradients = &gradients_, .values = &values_});
  }
  // A whole step, as a trainer runs it: read first unless the last
  // exchange brought the values (not so after a rejoin).
  absl::Status ReadAndStep() {
    if (!session_->parameters_current()) {
      absl::Status read = session_->Exchange({.values = &values_});
      if (!read.ok()) return read;
    }
    return Step();
  }

  JobConfig config_ = AsyncJob();
  std::unique_ptr<RestartableShard> shard_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<TrainingSession> session_;
  std::vector<float> gradient_ = std::vector<float>(4, 1.0f);
  std::vector<float> value_ = std::vector<float>(4, NAN);
  std::vector<std::span<const float>> gradients_ = {gradient_};
  std::vector<std::span<float>> values_ = {value_};
};

TEST_F(TrainingSessionTest, AnExchangeTagsThePushAndReadsTheVersionThePolicyRequires) {
  EXPECT_FALSE(session_->parameters_current());
  ASSERT_TRUE(session_->Exchange({.values = &values_}).ok());
  EXPECT_TRUE(session_->parameters_current());
  EXPECT_EQ(session_->versions(), std::vector<int64_t>{0});
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(Step().ok());
    EXPECT_EQ(session_->versions(), std::vector<int64_t>{step});
    EXPECT_EQ(value_, std::vector<float>(4, -step));
    ASSERT_EQ(session_->last_responses().size(), 1u);
    EXPECT_EQ(session_->last_responses()[0].outcome(), PushResponse::APPLIED);
  }
  // Each push was computed on the version before it: no staleness.
  EXPECT_EQ(session_->TakeStaleness(), 0);
}

// A step refused for now is run again, after a rejoin, whatever the class;
// any other failure ends it at once.
TEST_F(TrainingSessionTest, AStepIsRedoneAfterEachClassOfRefusalForNow) {
  struct Case {
    std::string name;
    absl::Status refusal;
    bool redone;
  };
  const std::vector<Case> cases = {
      {"overloaded",
       MarkTransient(absl::ResourceExhaustedError("busy"), TransientRefusal::kOverloaded), true},
      {"region lost",
       MarkTransient(absl::NotFoundError("no region"), TransientRefusal::kRegionLost), true},
      {"restarting", absl::UnavailableError("shutting down"), true},
      {"a size limit", absl::ResourceExhaustedError("too large"), false},
      {"not found", absl::NotFoundError("no such variable"), false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t before = session_->redone_steps();
    int runs = 0;
    absl::Status done = session_->Redo([&] {
      if (++runs == 1) return c.refusal;
      return ReadAndStep();
    });
    if (c.redone) {
      EXPECT_TRUE(done.ok()) << done;
      EXPECT_EQ(runs, 2);
      EXPECT_EQ(session_->redone_steps(), before + 1);
      // The rejoin read afresh: the step ran on what the shard holds.
      EXPECT_TRUE(session_->parameters_current());
    } else {
      EXPECT_EQ(done, c.refusal);
      EXPECT_EQ(runs, 1);
      EXPECT_EQ(session_->redone_steps(), before);
    }
  }
}

// A shard that keeps refusing for now is backed off from, not spun on,
// and the step ends Unavailable once training.pull_timeout_seconds is
// spent (a launcher restarts the worker).
class TrainingSessionPatienceTest : public TrainingSessionTest {
 protected:
  TrainingSessionPatienceTest() { config_.mutable_training()->set_pull_timeout_seconds(1); }
};

TEST_F(TrainingSessionPatienceTest, RefusalsPastThePatienceEndTheStepAsUnavailable) {
  int runs = 0;
  const absl::Time start = absl::Now();
  absl::Status done = session_->Redo([&] {
    ++runs;
    return MarkTransient(absl::ResourceExhaustedError("ps:0: busy"), TransientRefusal::kOverloaded);
  });
  EXPECT_TRUE(absl::IsUnavailable(done)) << done;
  EXPECT_NE(done.message().find("busy"), absl::string_view::npos) << done;
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_GT(runs, 2);
  EXPECT_LT(runs, 20);
}

TEST_F(TrainingSessionTest, AStepIsRedoneOnceARestartedShardIsBack) {
  ASSERT_TRUE(Step().ok());
  ASSERT_TRUE(Step().ok());
  int runs = 0;
  absl::Status done = session_->Redo([&]() -> absl::Status {
    if (++runs > 1) return ReadAndStep();
    // The shard goes away under the step, and comes back with its state.
    shard_->Stop();
    absl::Status failed = Step();
    EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
    EXPECT_TRUE(shard_->Restart().ok());
    return failed;
  });
  ASSERT_TRUE(done.ok()) << done;
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(session_->versions(), std::vector<int64_t>{3});
  EXPECT_EQ(value_, std::vector<float>(4, -3.0f));
}

TEST_F(TrainingSessionTest, AShardThatCameBackWithoutItsUpdatesEndsTheRun) {
  ASSERT_TRUE(Step().ok());
  ASSERT_TRUE(Step().ok());
  int runs = 0;
  absl::Status done = session_->Redo([&]() -> absl::Status {
    ++runs;
    // The shard comes back empty: no checkpoint held the two updates.
    EXPECT_TRUE(shard_->Replace().ok());
    return absl::UnavailableError("the parameter server restarted");
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(done)) << done;
  EXPECT_NE(done.message().find("2 updates are gone"), absl::string_view::npos) << done;
  EXPECT_EQ(runs, 1);
}

TEST_F(TrainingSessionTest, AShardBackWithinACheckpointIntervalGetsTheModelAgain) {
  config_.mutable_training()->mutable_checkpoint()->set_dir("/nonexistent");
  config_.mutable_training()->mutable_checkpoint()->set_every_steps(5);
  ASSERT_TRUE(Step().ok());
  ASSERT_TRUE(Step().ok());
  int runs = 0;
  absl::Status done = session_->Redo([&]() -> absl::Status {
    if (++runs > 1) return ReadAndStep();
    EXPECT_TRUE(shard_->Replace().ok());
    return absl::UnavailableError("the parameter server restarted");
  });
  ASSERT_TRUE(done.ok()) << done;
  // The initial values again, then the redone step.
  EXPECT_EQ(session_->versions(), std::vector<int64_t>{1});
  EXPECT_EQ(value_, std::vector<float>(4, -1.0f));
}

TEST_F(TrainingSessionTest, TheWorkersMetricsCountItsExchangesAndSteps) {
  WorkerMetrics& metrics = GetWorkerMetrics();
  const double steps = metrics.steps.Value();
  const double samples = metrics.samples.Value();
  const uint64_t pushes = metrics.push_seconds.Collect().histogram.sample_count;
  const uint64_t pulls = metrics.pull_seconds.Collect().histogram.sample_count;
  ASSERT_TRUE(session_->Exchange({.values = &values_}).ok());
  for (int step = 0; step < 3; ++step) {
    const absl::Time start = absl::Now();
    ASSERT_TRUE(Step().ok());
    session_->CountStep(start, 8);
  }
  EXPECT_EQ(metrics.steps.Value() - steps, 3);
  EXPECT_EQ(metrics.samples.Value() - samples, 24);
  EXPECT_EQ(metrics.push_seconds.Collect().histogram.sample_count - pushes, 3u);
  EXPECT_EQ(metrics.pull_seconds.Collect().histogram.sample_count - pulls, 1u);
  EXPECT_EQ(metrics.version[0].Value(), 3);
}

}  // namespace PST_FILE_ID
}  // namespace pst
