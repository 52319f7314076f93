// Config parsing, overrides and validation: what a user sees for each
// mistake.
#include "common/config.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/overrides.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// The config overrides of flags `given` ({name, value} pairs), in order.
ConfigOverrides Overridden(std::vector<std::pair<std::string, std::string>> given) {
  ConfigOverrides overrides;
  for (const auto& [flag, value] : given) {
    absl::StatusOr<ConfigOverride> override = ConfigOverrideOf(flag, value);
    EXPECT_TRUE(override.ok()) << override.status();
    if (override.ok()) overrides.push_back(*std::move(override));
  }
  return overrides;
}

constexpr char kGoodConfig[] = R"(
cluster { ps: "127.0.0.1:50051" workers: 2 }
training {
  mode: SYNC
  optimizer { sgd { learning_rate: 0.1 momentum: 0.9 } }
  batch_size: 32
  epochs: 2
  model { mlp { hidden: 16 } }
  dataset { fashion_mnist {} }
}
)";

std::string WriteTemp(const std::string& name, const std::string& contents) {
  // Per process (ctest runs the tests of this file in parallel), removed
  // when it exits.
  static const std::string dir = [] {
    std::string made = FreshScratchDir("config_test");
    std::filesystem::create_directories(made);
    return made;
  }();
  std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << contents;
  return path;
}

TEST(ConfigTest, EmbeddedDefaultIsTheDocumentedMainJob) {
  absl::StatusOr<JobConfig> config = LoadJobConfig("", {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->cluster().ps_size(), 1);
  EXPECT_EQ(config->cluster().workers(), 2);
  EXPECT_EQ(config->training().mode(), SYNC);
  EXPECT_THAT(config->training().model().mlp().hidden(), ::testing::ElementsAre(256, 128));
  EXPECT_EQ(config->training().dataset().fashion_mnist().dir(), "/usr/share/datasets/fashion-mnist");
}

TEST(ConfigTest, TextAndJsonGiveTheSameConfig) {
  absl::StatusOr<JobConfig> text = ParseConfig(kGoodConfig, "text");
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<JobConfig> json = ParseConfig(
      R"({"cluster": {"ps": ["127.0.0.1:50051"], "workers": 2},
          "training": {"mode": "SYNC", "optimizer": {"sgd": {"learning_rate": 0.1, "momentum": 0.9}},
                       "batch_size": 32, "epochs": 2, "model": {"mlp": {"hidden": [16]}},
                       "dataset": {"fashion_mnist": {}}}})",
      "json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(text->SerializeAsString(), json->SerializeAsString());
}

TEST(ConfigTest, OverridesWinOverTheFile) {
  std::string path = WriteTemp("good.textproto", kGoodConfig);
  ConfigOverrides overrides = Overridden({{"mode", "async"},
                                          {"epochs", "7"},
                                          {"workers", "3"},
                                          {"batch_size", "8"},
                                          {"learning_rate", "0.5"}});
  absl::StatusOr<JobConfig> config = LoadJobConfig(path, overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->training().mode(), ASYNC);
  EXPECT_EQ(config->training().epochs(), 7);
  EXPECT_EQ(config->cluster().workers(), 3);
  EXPECT_EQ(config->training().batch_size(), 8);
  EXPECT_FLOAT_EQ(config->training().optimizer().sgd().learning_rate(), 0.5f);
  EXPECT_FLOAT_EQ(config->training().optimizer().sgd().momentum(), 0.9f);
  overrides.push_back(*ConfigOverrideOf("devices", "cpu:2"));
  config = LoadJobConfig(path, overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->training().devices(), "cpu:2");
}

TEST(ConfigTest, BadConfigsSayWhatAndWhere) {
  struct Case {
    std::string name;
    std::string text;
    ConfigOverrides overrides;
    absl::StatusCode code;
    std::string message;
  };
  std::string good = kGoodConfig;
  auto replace = [&good](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  std::vector<Case> cases = {
      {"syntax error with its line", "cluster {\n  ps: \"a:1\"\n  workers: }\n", {},
       absl::StatusCode::kInvalidArgument, "bad.textproto:3:"},
      {"unknown field with its line", "cluster { ps: \"a:1\" }\ntraining { epochz: 3 }\n", {},
       absl::StatusCode::kInvalidArgument, "bad.textproto:2:18: Message type \"pst.TrainingConfig\" has no field named \"epochz\""},
      {"no ps", replace("ps: \"127.0.0.1:50051\"", ""), {}, absl::StatusCode::kInvalidArgument,
       "cluster.ps is empty"},
      {"ps without a port", replace("127.0.0.1:50051", "localhost"), {},
       absl::StatusCode::kInvalidArgument, "cluster.ps[0] \"localhost\" is not \"host:port\""},
      {"zero workers", replace("workers: 2", "workers: 0"), {}, absl::StatusCode::kInvalidArgument,
       "cluster.workers must be at least 1"},
      {"negative batch", replace("batch_size: 32", "batch_size: -4"), {},
       absl::StatusCode::kInvalidArgument, "training.batch_size must be at least 1"},
      {"a lease too short to heartbeat in", replace("batch_size: 32", "batch_size: 32 lease_seconds: 1e-9"),
       {}, absl::StatusCode::kInvalidArgument, "training.lease_seconds must be between 0.1 and 86400"},
      {"an endless lease", replace("batch_size: 32", "batch_size: 32 lease_seconds: inf"), {},
       absl::StatusCode::kInvalidArgument, "training.lease_seconds must be between 0.1 and 86400"},
      {"no optimizer", replace("optimizer { sgd { learning_rate: 0.1 momentum: 0.9 } }", ""), {},
       absl::StatusCode::kInvalidArgument, "training.optimizer must set"},
      {"zero learning rate", replace("learning_rate: 0.1", "learning_rate: 0"), {},
       absl::StatusCode::kInvalidArgument, "learning_rate must be a positive number"},
      {"momentum of one", replace("momentum: 0.9", "momentum: 1"), {},
       absl::StatusCode::kInvalidArgument, "training.optimizer sgd momentum must be in [0, 1)"},
      // Found by config_fuzzer: valid at load, then refused by every PS.
      {"decay rate above one", replace("momentum: 0.9 }", "momentum: 0.9 } decay_rate: 1.5 decay_steps: 10"),
       {}, absl::StatusCode::kInvalidArgument, "decay_rate in (0, 1]"},
      {"no dataset", replace("dataset { fashion_mnist {} }", ""), {},
       absl::StatusCode::kInvalidArgument, "training.dataset must name a data set"},
      {"MSE on classification", replace("hidden: 16", "hidden: 16 loss: MSE"), {},
       absl::StatusCode::kInvalidArgument, "MSE does not fit"},
      {"zero-width layer", replace("hidden: 16", "hidden: 0"), {},
       absl::StatusCode::kInvalidArgument, "training.model.mlp.hidden[0]"},
      // Accepted at load, then every shard refused the MLP worker's Init.
      {"embedding tables in an mlp job",
       replace("hidden: 16 }", "hidden: 16 } embeddings { name: \"t\" dim: 4 }"), {},
       absl::StatusCode::kInvalidArgument,
       "config field training.model.embeddings declares 1 table(s), but the built-in mlp model "
       "trains none"},
      {"bad mode flag", good, Overridden({{"mode", "fast"}}),
       absl::StatusCode::kInvalidArgument,
       "--mode: unknown mode \"fast\"; use sync, async or ssp"},
      {"bad epochs flag", good, Overridden({{"epochs", "-1"}}),
       absl::StatusCode::kInvalidArgument,
       "training.epochs must be at least 1"},
      {"bad devices flag", good, Overridden({{"devices", "cpu:0"}}),
       absl::StatusCode::kInvalidArgument,
       "--devices: devices \"cpu:0\""},
      {"towers that cannot split the batch", replace("epochs: 2", "epochs: 2 devices: \"cpu:3\""),
       {}, absl::StatusCode::kInvalidArgument, "makes 3 towers, which cannot split batch_size 32"},
      // Accepted at load, then refused (or worse) by the PS or pslaunch.
      {"duplicate ps address", replace("ps: \"127.0.0.1:50051\"", "ps: \"a:1\" ps: \"a:1\""), {},
       absl::StatusCode::kInvalidArgument,
       "cluster.ps[1] \"a:1\" is also cluster.ps[0]; every shard needs its own address"},
      {"backups for some shards only",
       replace("ps: \"127.0.0.1:50051\"",
               "ps: \"a:1\" ps: \"a:2\" ps_backups { address: \"b:1\" }"),
       {}, absl::StatusCode::kInvalidArgument,
       "cluster.ps_backups has 1 entries for 2 shards; give every shard its backups, or none"},
      {"a backup at a shard's address",
       replace("ps: \"127.0.0.1:50051\"", "ps: \"a:1\" ps_backups { address: \"a:1\" }"), {},
       absl::StatusCode::kInvalidArgument,
       "cluster.ps_backups[0].address[0] \"a:1\" is taken already (by shard 0); every replica "
       "needs its own address"},
      {"mode out of range", replace("mode: SYNC", "mode: 7"), {}, absl::StatusCode::kInvalidArgument,
       "training.mode 7 is not a mode"},
      {"wire dtype out of range", replace("mode: SYNC", "wire_dtype: 9"), {},
       absl::StatusCode::kInvalidArgument, "training.wire_dtype 9 is not a type"},
      {"negative every_steps", replace("epochs: 2", "checkpoint { dir: \"c\" every_steps: -5 }"), {},
       absl::StatusCode::kInvalidArgument, "training.checkpoint.every_steps is -5"},
      {"negative keep", replace("epochs: 2", "checkpoint { dir: \"c\" keep: -2 }"), {},
       absl::StatusCode::kInvalidArgument, "training.checkpoint.keep is -2"},
      {"interval without a directory", replace("epochs: 2", "checkpoint { every_steps: 10 }"), {},
       absl::StatusCode::kInvalidArgument, "training.checkpoint.dir is empty"},
      {"absurd worker count", replace("workers: 2", "workers: 100000"), {},
       absl::StatusCode::kInvalidArgument, "cluster.workers 100000 is more than the 4096"},
      {"model too large", replace("hidden: 16", "hidden: 100000 hidden: 100000"), {},
       absl::StatusCode::kInvalidArgument, "makes a model of 10079600010 parameters"},
      {"bad shm flag", good, Overridden({{"shm", "maybe"}}),
       absl::StatusCode::kInvalidArgument,
       "--shm: unknown setting \"maybe\"; use auto or off"},
      {"JSON nested past any config", "{\"cluster\": {\"ps\": " + std::string(100000, '[') +
       std::string(100000, ']') + "}}", {}, absl::StatusCode::kInvalidArgument,
       "bad.textproto:1: invalid JSON config: nested more than 32 levels deep"},
      {"missing closing brace", "cluster { ps: \"a:1\" workers: 1\ntraining { epochs: 1 }\n", {},
       absl::StatusCode::kInvalidArgument,
       "bad.textproto:2:10: Message type \"pst.ClusterConfig\" has no field named \"training\". "
       "(\"training\" belongs to pst.JobConfig: is a closing } missing before it?)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = WriteTemp("bad.textproto", c.text);
    absl::StatusOr<JobConfig> config = LoadJobConfig(path, c.overrides);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), c.code);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.message));
  }
}

// A directory or a device given as --config is one line, not an empty
// config or a read that never ends.
TEST(ConfigTest, ADirectoryOrAnEndlessFileIsNoConfig) {
  absl::StatusOr<JobConfig> directory = LoadJobConfig(::testing::TempDir(), {});
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr("is a directory"));
  absl::StatusOr<JobConfig> endless = LoadJobConfig("/dev/zero", {});
  EXPECT_EQ(endless.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(endless.status().message()),
              HasSubstr("/dev/zero is larger than 16 MiB"));
}

TEST(ConfigTest, UnwritableCheckpointDirectoryIsFoundWithoutCreatingIt) {
  EXPECT_TRUE(CheckWritableDirectory(::testing::TempDir() + "/not/yet/there", "dir").ok());
  absl::Status through_a_file = CheckWritableDirectory("/etc/passwd/ckpt", "training.checkpoint.dir");
  EXPECT_EQ(through_a_file.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(through_a_file.message()),
              HasSubstr("training.checkpoint.dir /etc/passwd/ckpt cannot be created: /etc/passwd "
                        "is not a directory"));
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/not"));
}

// The run identity ignores where tasks run and how they are secured, and
// changes with anything that decides the trained model.
TEST(ConfigTest, TrainingConfigHashFollowsWhatDecidesTheModel) {
  const JobConfig base = *ParseConfig(kGoodConfig, "good");
  JobConfig moved = base;
  moved.mutable_cluster()->set_ps(0, "10.0.0.1:6000");
  moved.mutable_training()->set_lease_seconds(9);
  moved.mutable_training()->mutable_checkpoint()->set_dir("/elsewhere");
  EXPECT_EQ(TrainingConfigHash(moved), TrainingConfigHash(base));
  JobConfig wider = base;
  wider.mutable_training()->mutable_model()->mutable_mlp()->set_hidden(0, 32);
  EXPECT_NE(TrainingConfigHash(wider), TrainingConfigHash(base));
  JobConfig more_workers = base;
  more_workers.mutable_cluster()->set_workers(3);
  EXPECT_NE(TrainingConfigHash(more_workers), TrainingConfigHash(base));
}

// Workers that run cluster.worker_command bring their own model: the
// config needs none, and its data set, if named, is still checked.
TEST(ConfigTest, ScriptWorkersNeedNoModelOrDataSet) {
  auto validate = [](const std::string& text) -> absl::Status {
    absl::StatusOr<JobConfig> config = ParseConfig(text, "script.textproto");
    if (!config.ok()) return config.status();
    ApplyDefaults(&*config);
    return ValidateConfig(*config);
  };
  const std::string job =
      "cluster { ps: \"127.0.0.1:50051\" workers: 2 WORKER_COMMAND }\n"
      "training { optimizer { adam { learning_rate: 0.001 } } DATASET }\n";
  auto with = [&job](const std::string& command, const std::string& dataset) {
    std::string text = job;
    text.replace(text.find("WORKER_COMMAND"), 14, command);
    text.replace(text.find("DATASET"), 7, dataset);
    return text;
  };
  const std::string command = "worker_command: \"python3 train.py\"";
  EXPECT_TRUE(validate(with(command, "")).ok());
  EXPECT_TRUE(validate(with(command, "dataset { fashion_mnist {} }")).ok());
  absl::Status bad_data =
      validate(with(command, "dataset { fashion_mnist { train_limit: -1 } }"));
  EXPECT_THAT(bad_data.message(), HasSubstr("train_limit must not be negative"));
  // A config that names no model is a script's too, run against shards
  // started by hand: it needs no worker_command and no data set. The
  // worker binary, which trains the config's model, refuses it.
  EXPECT_TRUE(validate(with("", "")).ok());
  absl::StatusOr<JobConfig> plain = ParseConfig(with("", ""), "plain.textproto");
  ASSERT_TRUE(plain.ok());
  absl::Status binary = CheckConfigNamesModel(*plain);
  EXPECT_EQ(binary.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(binary.message(), HasSubstr("training.model names no model"));
  EXPECT_THAT(binary.message(), HasSubstr("cluster.worker_command"));
  absl::StatusOr<JobConfig> scripted = ParseConfig(with(command, ""), "script.textproto");
  ASSERT_TRUE(scripted.ok());
  EXPECT_TRUE(CheckConfigNamesModel(*scripted).ok());
}

TEST(ConfigTest, MissingFileIsNotFound) {
  absl::StatusOr<JobConfig> config = LoadJobConfig("/nonexistent/cluster.textproto", {});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/nonexistent/cluster.textproto"));
}

TEST(ConfigTest, TasksParseAndMustExist) {
  struct Case {
    std::string text;
    bool ok;
  };
  for (const Case& c : std::vector<Case>{{"ps:0", true}, {"worker:12", true}, {"ps", false},
                                         {"chief:0", false}, {"worker:-1", false},
                                         {"worker:x", false}}) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<TaskId> task = ParseTask(c.text);
    EXPECT_EQ(task.ok(), c.ok);
    if (task.ok()) {
      EXPECT_EQ(task->ToString(), c.text);
    }
  }
  absl::StatusOr<JobConfig> config = ParseConfig(kGoodConfig, "good");
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(ValidateTask(*config, {TaskId::Kind::kWorker, 1}).ok());
  absl::Status missing = ValidateTask(*config, {TaskId::Kind::kPs, 1});
  EXPECT_THAT(std::string(missing.message()), HasSubstr("task ps:1 does not exist"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
