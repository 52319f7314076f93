// TF_CONFIG and torchrun's environment as the cluster part of the job
// config: their mapping onto ps and worker tasks, each malformed shape, and
// their conflicts with the config file and --task.
#include "common/tf_config.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/overrides.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTwoWorkersAndChief[] =
    R"({"cluster": {"ps": ["p0:2222", "p1:2222"], "chief": ["c:2222"],
                    "worker": ["w0:2222", "w1:2222"]},
        "task": {"type": "worker", "index": 1}})";

TEST(TfConfigTest, MapsTasksOntoPsAndWorkers) {
  struct Case {
    std::string json;
    std::vector<std::string> ps;
    int workers;
    std::optional<TaskId> task;
  };
  const TaskId::Kind ps = TaskId::Kind::kPs;
  const TaskId::Kind worker = TaskId::Kind::kWorker;
  std::vector<Case> cases = {
      {kTwoWorkersAndChief, {"p0:2222", "p1:2222"}, 3, TaskId{worker, 2}},
      {R"({"cluster": {"ps": ["p:1"], "chief": ["c:1"], "worker": ["w:1"]},
           "task": {"type": "chief", "index": 0}})", {"p:1"}, 2, TaskId{worker, 0}},
      {R"({"cluster": {"ps": ["p:1"], "master": ["m:1"], "worker": ["w:1"]},
           "task": {"type": "worker", "index": 0}})", {"p:1"}, 2, TaskId{worker, 1}},
      // Without a chief, worker:0 is the chief.
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"]},
           "task": {"type": "worker", "index": 1}})", {"p:1"}, 2, TaskId{worker, 1}},
      {R"({"cluster": {"ps": ["p0:1", "p1:1"], "worker": ["w:1"]},
           "task": {"type": "ps", "index": 1}})", {"p0:1", "p1:1"}, 1, TaskId{ps, 1}},
      // An index left out is 0, as in TensorFlow.
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps"}})", {"p:1"}, 1,
       TaskId{ps, 0}},
      // No task: the cluster alone (psctl on any host).
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}})", {"p:1"}, 1, std::nullopt},
      // The evaluator is outside the training cluster; what TensorFlow adds is ignored.
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
           "task": {"type": "worker", "index": 0}, "environment": "cloud", "rpc_layer": "grpc"})",
       {"p:1"}, 1, TaskId{worker, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    absl::StatusOr<TfConfig> parsed = ParseTfConfig(c.json);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->ps, c.ps);
    EXPECT_EQ(parsed->workers, c.workers);
    EXPECT_EQ(parsed->task, c.task);
  }
}

TEST(TfConfigTest, RefusesEachMalformedShapeNamingIt) {
  struct Case {
    std::string json;
    std::string message;
  };
  std::vector<Case> cases = {
      {"", "is not a JSON object"},
      {"not json", "is not a JSON object"},
      {"{\"cluster\": {\"ps\": [\"p:1\"]\n  \"worker\": [\"w:1\"]}}", "is not a JSON object"},
      {R"(["ps"])", "is not a JSON object"},
      {R"({"task": {"type": "ps", "index": 0}})", "has no \"cluster\" object"},
      {R"({"cluster": ["p:1"]})", "has no \"cluster\" object"},
      {R"({"cluster": {"ps": "p:1", "worker": ["w:1"]}})", "cluster.ps that is not a list"},
      {R"({"cluster": {"ps": [1], "worker": ["w:1"]}})", "cluster.ps[0] that is not a \"host:port\""},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1", ""]}})", "cluster.worker[1] that is not"},
      {R"({"cluster": {"ps": ["p"], "worker": ["w:1"]}})", "cluster.ps[0] that is not a \"host:port\""},
      {R"({"cluster": {"ps": ["p:http"], "worker": ["w:1"]}})", "cluster.ps[0] that is not"},
      {R"({"cluster": {"ps": [":1"], "worker": ["w:1"]}})", "cluster.ps[0] that is not"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:70000"]}})", "cluster.worker[0] that is not"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"], "evaluator": "e:1"}})",
       "cluster.evaluator that is not a list"},
      {R"({"cluster": {"worker": ["w:1"]}})", "lists no ps task"},
      {R"({"cluster": {"ps": [], "worker": ["w:1"]}})", "lists no ps task"},
      {R"({"cluster": {"ps": ["p:1"]}})", "lists no chief or worker task"},
      {R"({"cluster": {"ps": ["p:1"], "chief": ["a:1", "b:1"]}})", "more than one chief"},
      {R"({"cluster": {"ps": ["p:1"], "chief": ["a:1"], "master": ["b:1"]}})", "more than one chief"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"], "gpu": ["g:1"]}})", "has cluster.gpu"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "tasks": {}})", "unknown key \"tasks\""},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": "ps:0"})",
       "task that is not an object"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"index": 0}})",
       "task without a string \"type\""},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps", "index": -1}})",
       "\"index\" that is not a non-negative integer"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps", "index": 0.5}})",
       "\"index\" that is not a non-negative integer"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps", "index": "0"}})",
       "\"index\" that is not a non-negative integer"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps", "index": 1}})",
       "task ps:1 but cluster.ps lists 1 task(s)"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "chief"}})",
       "task chief:0 but cluster.chief lists 0 task(s)"},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "trainer"}})",
       "task type \"trainer\""},
      {R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "evaluator"}})",
       "evaluator task, which pstrain does not run"},
      {std::string(20, '[') + std::string(20, ']'), "nests more than 8 levels"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    absl::StatusOr<TfConfig> parsed = ParseTfConfig(c.json);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("TF_CONFIG "));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message));
    // One line, whatever the text: the programs print it as their one error line.
    EXPECT_THAT(parsed.status().message(), Not(HasSubstr("\n")));
  }
}

TEST(TfConfigTest, FillsTheClusterOrChecksItAgrees) {
  absl::StatusOr<TfConfig> tf = ParseTfConfig(kTwoWorkersAndChief);
  ASSERT_TRUE(tf.ok()) << tf.status();
  struct Case {
    std::string name;
    std::vector<std::string> config_ps;
    int config_workers;
    std::string error;  // empty: applies
  };
  std::vector<Case> cases = {
      {"empty cluster", {}, 0, ""},
      {"the same cluster", {"p0:2222", "p1:2222"}, 3, ""},
      {"workers only", {}, 3, ""},
      {"other ps", {"p0:2222"}, 0, "TF_CONFIG lists ps [p0:2222, p1:2222] but job.textproto has "
                                  "cluster.ps [p0:2222]"},
      {"ps in another order", {"p1:2222", "p0:2222"}, 0, "but job.textproto has cluster.ps"},
      {"other worker count", {}, 2, "TF_CONFIG lists 3 worker(s) (chief included) but "
                                    "job.textproto (or --workers) has cluster.workers 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    JobConfig config;
    for (const std::string& address : c.config_ps) config.mutable_cluster()->add_ps(address);
    config.mutable_cluster()->set_workers(c.config_workers);
    absl::Status applied = ApplyTfConfig(*tf, "job.textproto", &config);
    if (c.error.empty()) {
      ASSERT_TRUE(applied.ok()) << applied;
      EXPECT_THAT(config.cluster().ps(), ::testing::ElementsAre("p0:2222", "p1:2222"));
      EXPECT_EQ(config.cluster().workers(), 3);
    } else {
      EXPECT_EQ(applied.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(applied.message(), HasSubstr(c.error));
    }
  }
}

TEST(TfConfigTest, ResolvesTheTaskFromTheFlagOrTfConfig) {
  absl::StatusOr<TfConfig> tf = ParseTfConfig(kTwoWorkersAndChief);  // task worker:2
  ASSERT_TRUE(tf.ok()) << tf.status();
  const TaskId::Kind ps = TaskId::Kind::kPs;
  const TaskId::Kind worker = TaskId::Kind::kWorker;
  struct Case {
    std::string name;
    std::string flag;
    std::optional<TfConfig> tf;
    TaskId::Kind runs;
    std::optional<TaskId> task;  // nullopt: refused with `error`
    std::string error;
  };
  std::vector<Case> cases = {
      {"flag alone", "worker:1", std::nullopt, worker, TaskId{worker, 1}, ""},
      {"neither: the program's first task", "", std::nullopt, ps, TaskId{ps, 0}, ""},
      {"TF_CONFIG alone", "", *tf, worker, TaskId{worker, 2}, ""},
      {"both agree", "worker:2", *tf, worker, TaskId{worker, 2}, ""},
      {"both differ", "worker:1", *tf, worker, std::nullopt,
       "--task=worker:1 but TF_CONFIG's task is worker:2"},
      {"TF_CONFIG's task for the other program", "", *tf, ps, std::nullopt,
       "TF_CONFIG names task worker:2 but ps_server runs ps:<index> tasks; start worker for it"},
      {"flag for the other program", "ps:0", std::nullopt, worker, std::nullopt,
       "--task names task ps:0 but ps_server runs worker:<index> tasks"},
      {"malformed flag", "shard:0", std::nullopt, ps, std::nullopt, "must be ps:<index>"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<TaskId> task = ResolveTask(c.flag, c.tf, c.runs, "ps_server");
    if (c.task) {
      ASSERT_TRUE(task.ok()) << task.status();
      EXPECT_EQ(*task, *c.task);
    } else {
      ASSERT_FALSE(task.ok());
      EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(task.status().message(), HasSubstr(c.error));
    }
  }
}

// torchrun's variables as a map, for ParseTorchEnvironment.
std::function<const char*(const char*)> Env(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(TorchEnvironmentTest, FindsTheShardsFromPstrainPsOrBesideTheMaster) {
  absl::StatusOr<std::optional<TfConfig>> listed = ParseTorchEnvironment(
      Env({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"PSTRAIN_PS", "a:1, b:2"}}));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_TRUE(listed->has_value());
  EXPECT_THAT((*listed)->ps, ::testing::ElementsAre("a:1", "b:2"));
  EXPECT_EQ((*listed)->workers, 2);
  EXPECT_EQ((*listed)->task, (TaskId{TaskId::Kind::kWorker, 1}));

  absl::StatusOr<std::optional<TfConfig>> master = ParseTorchEnvironment(
      Env({{"WORLD_SIZE", "4"}, {"RANK", "0"}, {"MASTER_ADDR", "job-master-0"},
           {"MASTER_PORT", "23456"}, {"PSTRAIN_NUM_PS", "2"}}));
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE(master->has_value());
  EXPECT_THAT((*master)->ps, ::testing::ElementsAre("job-master-0:23457", "job-master-0:23458"));
  EXPECT_EQ((*master)->workers, 4);

  // pslaunch's workers get RANK and WORLD_SIZE beside a config naming the
  // shards: no cluster here.
  absl::StatusOr<std::optional<TfConfig>> pslaunch =
      ParseTorchEnvironment(Env({{"WORLD_SIZE", "2"}, {"RANK", "1"}}));
  ASSERT_TRUE(pslaunch.ok());
  EXPECT_FALSE(pslaunch->has_value());
}

TEST(TorchEnvironmentTest, RefusesEachBadVariableNamingIt) {
  const struct {
    std::map<std::string, std::string> vars;
    std::string error;
  } cases[] = {
      {{{"WORLD_SIZE", "two"}, {"PSTRAIN_PS", "a:1"}}, "WORLD_SIZE=two is not a whole number"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"PSTRAIN_PS", "a:1"}}, "RANK=2 is not a whole number in [0, 1]"},
      {{{"WORLD_SIZE", "2"}, {"PSTRAIN_PS", "a:1,b"}}, "PSTRAIN_PS=a:1,b has \"b\", which is not host:port"},
      {{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}}, "MASTER_ADDR is set but MASTER_PORT is not"},
      {{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "65535"}}, "MASTER_PORT=65535"},
      {{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "1"}, {"PSTRAIN_NUM_PS", "0"}},
       "PSTRAIN_NUM_PS=0"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::optional<TfConfig>> parsed = ParseTorchEnvironment(Env(c.vars));
    ASSERT_FALSE(parsed.ok()) << c.error;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error));
  }
}

// PSTRAIN_PS_REPLICAS=R: the ps list is N*R addresses, the primaries first,
// then each shard's first backup, ...; ps task j is replica j / N of shard j % N.
TEST(ReplicatedShardsTest, TfConfigsPsListIsThePrimariesThenEachBackupRow) {
  constexpr char kSixPs[] =
      R"({"cluster": {"ps": ["p0:1", "p1:1", "b0:1", "b1:1", "c0:1", "c1:1"], "worker": ["w:1"]},
          "task": {"type": "ps", "index": 5}})";
  absl::StatusOr<TfConfig> parsed = ParseTfConfig(kSixPs, /*replicas=*/3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->ps, ::testing::ElementsAre("p0:1", "p1:1"));
  ASSERT_EQ(parsed->ps_backups.size(), 2u);
  EXPECT_THAT(parsed->ps_backups[0], ::testing::ElementsAre("b0:1", "c0:1"));
  EXPECT_THAT(parsed->ps_backups[1], ::testing::ElementsAre("b1:1", "c1:1"));
  EXPECT_EQ(parsed->task, (TaskId{TaskId::Kind::kPs, 1}));
  EXPECT_EQ(parsed->replica, 2);
  absl::StatusOr<int> replica = ResolveReplica(std::nullopt, *parsed);
  ASSERT_TRUE(replica.ok());
  EXPECT_EQ(*replica, 2);
  EXPECT_EQ(*ResolveReplica(2, *parsed), 2);
  EXPECT_THAT(ResolveReplica(1, *parsed).status().message(),
              HasSubstr("--replica=1 but TF_CONFIG's task is replica 2 of shard 1"));
  EXPECT_EQ(*ResolveReplica(std::nullopt, std::nullopt), 0);

  // Unreplicated, a ps task is its shard's primary.
  parsed = ParseTfConfig(kSixPs);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ps.size(), 6u);
  EXPECT_TRUE(parsed->ps_backups.empty());
  EXPECT_EQ(parsed->replica, 0);

  parsed = ParseTfConfig(kSixPs, /*replicas=*/4);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(
      parsed.status().message(),
      HasSubstr("TF_CONFIG lists 6 ps address(es), not a multiple of PSTRAIN_PS_REPLICAS=4"));
}

TEST(ReplicatedShardsTest, TorchrunsShardsAreReplicatedTheSameWay) {
  absl::StatusOr<std::optional<TfConfig>> listed =
      ParseTorchEnvironment(Env({{"WORLD_SIZE", "2"},
                                 {"PSTRAIN_PS", "a:1,b:1,c:1,d:1"},
                                 {"PSTRAIN_PS_REPLICAS", "2"},
                                 {"PSTRAIN_ETCD", "e:2379"}}));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_TRUE(listed->has_value());
  EXPECT_THAT((*listed)->ps, ::testing::ElementsAre("a:1", "b:1"));
  ASSERT_EQ((*listed)->ps_backups.size(), 2u);
  EXPECT_THAT((*listed)->ps_backups[0], ::testing::ElementsAre("c:1"));
  EXPECT_THAT((*listed)->ps_backups[1], ::testing::ElementsAre("d:1"));
  EXPECT_THAT((*listed)->etcd_endpoints, ::testing::ElementsAre("e:2379"));

  absl::StatusOr<std::optional<TfConfig>> master =
      ParseTorchEnvironment(Env({{"WORLD_SIZE", "1"},
                                 {"MASTER_ADDR", "m"},
                                 {"MASTER_PORT", "100"},
                                 {"PSTRAIN_NUM_PS", "2"},
                                 {"PSTRAIN_PS_REPLICAS", "2"}}));
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_THAT((*master)->ps, ::testing::ElementsAre("m:101", "m:102"));
  EXPECT_THAT((*master)->ps_backups[0], ::testing::ElementsAre("m:103"));
  EXPECT_THAT((*master)->ps_backups[1], ::testing::ElementsAre("m:104"));

  for (const auto& [vars, error] :
       std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"WORLD_SIZE", "1"}, {"PSTRAIN_PS", "a:1"}, {"PSTRAIN_PS_REPLICAS", "0"}},
            "PSTRAIN_PS_REPLICAS=0 is not a whole number in [1, 16]"},
           {{{"WORLD_SIZE", "1"}, {"PSTRAIN_PS", "a:1,b:1,c:1"}, {"PSTRAIN_PS_REPLICAS", "2"}},
            "PSTRAIN_PS lists 3 ps address(es), not a multiple of PSTRAIN_PS_REPLICAS=2"},
           {{{"WORLD_SIZE", "1"}, {"PSTRAIN_PS", "a:1"}, {"PSTRAIN_ETCD", "e"}},
            "PSTRAIN_ETCD=e has \"e\", which is not host:port"},
       }) {
    absl::StatusOr<std::optional<TfConfig>> parsed = ParseTorchEnvironment(Env(vars));
    ASSERT_FALSE(parsed.ok()) << error;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(error));
  }
}

// The hook in LoadJobConfig: a config file carrying only the job takes its
// cluster from the environment, and a file that disagrees is refused.
class LoadWithTfConfigTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {kTfConfigVariable, "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
                             kPsReplicasVariable, kEtcdVariable}) {
      unsetenv(name);
    }
  }

  std::string WriteConfig(const std::string& name, const std::string& cluster) {
    const std::string path = ScratchDir() + "/" + name;
    std::ofstream(path) << cluster
                        << "training { optimizer { sgd { learning_rate: 0.1 } } model { mlp { hidden: 4 } }\n"
                           "  dataset { quadratic { examples: 64 } } }\n";
    return path;
  }
};

TEST_F(LoadWithTfConfigTest, TakesTheClusterFromTheEnvironment) {
  setenv(kTfConfigVariable, kTwoWorkersAndChief, 1);
  absl::StatusOr<JobConfig> config = LoadJobConfig(WriteConfig("job_only.textproto", ""), {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->cluster().ps(), ::testing::ElementsAre("p0:2222", "p1:2222"));
  EXPECT_EQ(config->cluster().workers(), 3);
}

TEST_F(LoadWithTfConfigTest, TakesTheBackupsAndEtcdFromTheEnvironment) {
  setenv(kTfConfigVariable,
         R"({"cluster": {"ps": ["p0:1", "p1:1", "b0:1", "b1:1"], "worker": ["w:1"]},
             "task": {"type": "ps", "index": 2}})",
         1);
  setenv(kPsReplicasVariable, "2", 1);
  setenv(kEtcdVariable, "etcd:2379", 1);
  absl::StatusOr<JobConfig> config = LoadJobConfig(WriteConfig("job.textproto", ""), {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->cluster().ps(), ::testing::ElementsAre("p0:1", "p1:1"));
  ASSERT_EQ(config->cluster().ps_backups_size(), 2);
  EXPECT_THAT(config->cluster().ps_backups(0).address(), ::testing::ElementsAre("b0:1"));
  EXPECT_THAT(config->cluster().ps_backups(1).address(), ::testing::ElementsAre("b1:1"));
  EXPECT_THAT(config->cluster().membership().etcd_endpoints(), ::testing::ElementsAre("etcd:2379"));
  absl::StatusOr<TaskId> task = ResolveTaskFromEnvironment("", TaskId::Kind::kPs, "ps_server");
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(*task, (TaskId{TaskId::Kind::kPs, 0}));
  absl::StatusOr<int> replica = ResolveReplicaFromEnvironment(std::nullopt);
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(*replica, 1);

  // A file with other backups, or another etcd, is refused, naming both.
  const std::string other =
      WriteConfig("other_backups.textproto",
                  "cluster { ps_backups { address: \"x:1\" } ps_backups { address: "
                  "\"y:1\" } membership { etcd_endpoints: \"etcd:2379\" } }\n");
  config = LoadJobConfig(other, {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("lists other backups than " + other + "'s cluster.ps_backups"));
  const std::string other_etcd = WriteConfig(
      "other_etcd.textproto", "cluster { membership { etcd_endpoints: \"elsewhere:2379\" } }\n");
  config = LoadJobConfig(other_etcd, {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("PSTRAIN_ETCD lists [etcd:2379] but"));
}

TEST_F(LoadWithTfConfigTest, RefusesAFileOrFlagThatDisagrees) {
  setenv(kTfConfigVariable, kTwoWorkersAndChief, 1);
  const std::string path = WriteConfig("other_ps.textproto", "cluster { ps: \"p0:2222\" }\n");
  absl::StatusOr<JobConfig> config = LoadJobConfig(path, {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr(path + " has cluster.ps [p0:2222]"));

  config = LoadJobConfig(WriteConfig("job.textproto", ""), {*ConfigOverrideOf("workers", "5")});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("(or --workers) has cluster.workers 5"));

  setenv(kTfConfigVariable, "{\"cluster\": {}}", 1);
  config = LoadJobConfig(path, {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("TF_CONFIG lists no ps task"));
}

TEST_F(LoadWithTfConfigTest, TheLaunchersClusterReplacesTheBuiltInOne) {
  setenv(kTfConfigVariable, kTwoWorkersAndChief, 1);
  absl::StatusOr<JobConfig> config = LoadJobConfig("", {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->cluster().ps(), ::testing::ElementsAre("p0:2222", "p1:2222"));
  EXPECT_EQ(config->cluster().workers(), 3);
  unsetenv(kTfConfigVariable);

  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29500", 1);
  config = LoadJobConfig("", {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->cluster().ps(), ::testing::ElementsAre("10.0.0.7:29501"));
  EXPECT_EQ(config->cluster().workers(), 2);
  // torchrun's workers are scripts with a model of their own.
  EXPECT_FALSE(config->training().has_model());
  absl::StatusOr<TaskId> worker = ResolveTaskFromEnvironment("", TaskId::Kind::kWorker, "worker");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(*worker, (TaskId{TaskId::Kind::kWorker, 1}));
  // RANK is a worker's: a shard beside the master takes --task, else ps:0.
  absl::StatusOr<TaskId> shard = ResolveTaskFromEnvironment("", TaskId::Kind::kPs, "ps_server");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(*shard, (TaskId{TaskId::Kind::kPs, 0}));
}

TEST_F(LoadWithTfConfigTest, AnEmptyTfConfigIsUnset) {
  setenv(kTfConfigVariable, "", 1);
  absl::StatusOr<JobConfig> config =
      LoadJobConfig(WriteConfig("own_cluster.textproto", "cluster { ps: \"h:1\" workers: 1 }\n"), {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->cluster().ps(), ::testing::ElementsAre("h:1"));
  EXPECT_TRUE(CheckTfConfigUnset("pslaunch").ok());
  setenv(kTfConfigVariable, kTwoWorkersAndChief, 1);
  EXPECT_THAT(CheckTfConfigUnset("pslaunch").message(),
              HasSubstr("TF_CONFIG is set, which gives each process one task, but pslaunch"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
