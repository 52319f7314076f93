// A worker task turned into a command of the user's: its flags become its
// environment, and the command runs through /bin/sh with them.
#include "pslaunch/worker_command.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

TEST(WorkerCommandTest, FlagsBecomeEnvironmentAndTheCommandRunsThroughTheShell) {
  ChildSpec task{"worker:1",
                 {"/opt/bin/worker", "--config=/tmp/run/cluster.textproto", "--task=worker:1",
                  "--result_file=/tmp/run/worker-1.json", "--metrics_port=9102", "positional"},
                 /*must_finish=*/true};
  task.env.push_back("PSTRAIN_TASK_TOKEN=secret");
  RunWorkerCommand("python3 train.py --lr=0.1 > out.log", /*workers=*/4, &task);
  EXPECT_THAT(task.argv, ElementsAre("/bin/sh", "-c", "python3 train.py --lr=0.1 > out.log"));
  EXPECT_THAT(task.env, UnorderedElementsAre("PSTRAIN_TASK_TOKEN=secret",
                                             "PSTRAIN_CONFIG=/tmp/run/cluster.textproto",
                                             "PSTRAIN_TASK=worker:1",
                                             "PSTRAIN_RESULT_FILE=/tmp/run/worker-1.json",
                                             "PSTRAIN_METRICS_PORT=9102", "RANK=1", "LOCAL_RANK=1",
                                             "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=4"));
  EXPECT_EQ(task.name, "worker:1");
  EXPECT_TRUE(task.must_finish);
}

TEST(WorkerCommandTest, TheSupervisorRunsTheCommandWithItsEnvironment) {
  const std::string out = ScratchDir() + "/command.out";
  ChildSpec task{"worker:0", {"/unused/worker", "--task=worker:0", "--result_file=" + out}};
  RunWorkerCommand("echo \"$PSTRAIN_TASK\" > \"$PSTRAIN_RESULT_FILE\"", /*workers=*/1, &task);
  Supervisor supervisor(STDOUT_FILENO, STDERR_FILENO);
  ASSERT_TRUE(supervisor.Start(task).ok());
  EXPECT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  EXPECT_EQ(ReadFile(out), "worker:0\n");
}

}  // namespace PST_FILE_ID
}  // namespace pst
