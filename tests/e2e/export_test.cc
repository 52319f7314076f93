// The trained model out, both ways: the built-in worker's chief writes it
// (training.export_model) and psctl export reads it from the same run's
// checkpoints on two shards; numpy loads both into the same arrays, each
// variable whole (the kernel placement cut over both shards joined back).
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

TEST(ExportModelTest, TheChiefsModelIsTheModelTheCheckpointsHold) {
  // The suite's packages include python3-numpy: its absence is a broken setup, not a skip.
  ASSERT_EQ(RunCommand("/usr/bin/python3 -c 'import numpy'", 60).exit_code, 0)
      << "no numpy for /usr/bin/python3; scripts/install_deps.sh installs python3-numpy";
  const std::string dir = ScratchDir() + "/export";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // hidden 200: dense_1/kernel is [200, 200], 160 KB, cut over both shards.
  const std::string config = dir + "/job.textproto";
  std::ofstream(config) << absl::StrCat(
      "cluster { ps: \"127.0.0.1:0\" ps: \"127.0.0.1:0\" workers: 2 }\n"
      "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 16\n"
      "  model { mlp { hidden: 200 hidden: 200 } } dataset { quadratic { examples: 128 } }\n"
      "  export_model: \"", dir, "/chief.npz\"\n"
      "  checkpoint { dir: \"", dir, "/ckpt\" every_steps: 4 } }\n");
  CommandResult run = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config), 300);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out + run.err, HasSubstr("wrote the final model to " + dir + "/chief.npz"));

  CommandResult exported = RunCommand(absl::StrCat(Bin("psctl"), " export --checkpoint=", dir,
                                                   "/ckpt --format=npz --out=", dir, "/ckpt.npz"),
                                      60);
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_THAT(exported.out, HasSubstr("from 2 shard(s)"));

  const std::string compare = absl::StrCat(
      "/usr/bin/python3 -c \"import numpy as np\n"
      "a = np.load('", dir, "/chief.npz'); b = np.load('", dir, "/ckpt.npz')\n"
      "assert sorted(a.files) == sorted(b.files), (a.files, b.files)\n"
      "for k in a.files: np.testing.assert_array_equal(a[k], b[k], err_msg=k)\n"
      "print(sorted((k, a[k].shape) for k in a.files))\"");
  CommandResult same = RunCommand(compare, 60);
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_THAT(same.out, HasSubstr("('dense_1/kernel', (200, 200))"));
  EXPECT_THAT(same.out, HasSubstr("('dense_0/bias', (200,))"));
}

TEST(ExportModelTest, ACtrModelIsExportedFromItsCheckpoints) {
  const std::string config = ScratchDir() + "/ctr_export.textproto";
  std::ofstream(config) << "cluster { ps: \"127.0.0.1:1\" workers: 1 }\n"
                           "training { export_model: \"m.npz\" optimizer { sgd { learning_rate: 0.1 } }\n"
                           "  model { ctr { } }\n"
                           "  dataset { ctr { train_file: \"t\" test_file: \"t\" } } }\n";
  CommandResult run =
      RunCommand(absl::StrCat(Bin("worker"), " --config=", config, " --check_config"), 60);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("training.export_model"));
  EXPECT_THAT(run.err, HasSubstr("psctl export"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
