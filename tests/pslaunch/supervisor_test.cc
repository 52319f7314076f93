// The Supervisor with small /bin/sh children: how runs end, how output is
// copied, and that stopping leaves no child behind. Every child that could
// outlive its test sleeps at most 30 s and is stopped by the test (or the
// Supervisor's destructor); the tests check the bounds they rely on.
#include "pslaunch/supervisor.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ChildSpec Shell(const std::string& name, const std::string& script, bool must_finish = true) {
  return {name, {"/bin/sh", "-c", script}, must_finish};
}

// What the Supervisor writes, kept in memory files so nothing can block.
class CapturedOutput {
 public:
  CapturedOutput()
      : out_(memfd_create("supervisor_out", MFD_CLOEXEC)),
        err_(memfd_create("supervisor_err", MFD_CLOEXEC)) {}
  ~CapturedOutput() {
    close(out_);
    close(err_);
  }
  int out_fd() const { return out_; }
  int err_fd() const { return err_; }
  std::string Out() const { return ReadAll(out_); }
  std::string Err() const { return ReadAll(err_); }

 private:
  static std::string ReadAll(int fd) {
    std::string text;
    char buffer[4096];
    for (off_t offset = 0;;) {
      ssize_t n = pread(fd, buffer, sizeof(buffer), offset);
      if (n <= 0) return text;
      text.append(buffer, static_cast<size_t>(n));
      offset += n;
    }
  }
  int out_, err_;
};

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// True once no process with this PID exists (reaped, not a zombie).
bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// True once the process is dead: gone, or a zombie that its parent (not
// us) has yet to reap.
bool Ended(pid_t pid) {
  if (Gone(pid)) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string pid_text, command, state;
  stat >> pid_text >> command >> state;
  return !stat || state == "Z";
}

void ExpectAllGone(const Supervisor& supervisor) {
  for (pid_t pid : supervisor.pids()) EXPECT_TRUE(Gone(pid)) << "pid " << pid;
}

// Waits (bounded) until the child has created `path`: its traps are set.
void WaitForFile(const std::string& path) {
  ASSERT_TRUE(Eventually([&] { return std::filesystem::exists(path); })) << path;
}

// Waits (bounded) until the Supervisor has copied `line` of a child's
// output: Run() or StopAll() is under way.
void WaitForOutput(const CapturedOutput& output, const std::string& line) {
  ASSERT_TRUE(Eventually([&] { return absl::StrContains(output.Out(), line); }))
      << output.Out();
}

std::string TempPath(const std::string& name) {
  std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  std::filesystem::remove(path);
  return path;
}

TEST(SupervisorTest, AllChildrenExitingZeroIsSuccess) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("a", "echo hello from a")).ok());
  ASSERT_TRUE(supervisor.Start(Shell("b", "sleep 0.2; echo hello from b")).ok());
  RunOutcome outcome = supervisor.Run();
  EXPECT_EQ(outcome.kind, RunOutcome::Kind::kAllFinished);
  supervisor.StopAll(absl::Seconds(1));
  EXPECT_THAT(output.Out(), HasSubstr("[a] hello from a\n"));
  EXPECT_THAT(output.Out(), HasSubstr("[b] hello from b\n"));
  ExpectAllGone(supervisor);
}

TEST(SupervisorTest, RunEndsWhenWorkersFinishWhileServersStillRun) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("ps:0", "sleep 30", /*must_finish=*/false)).ok());
  ASSERT_TRUE(supervisor.Start(Shell("worker:0", "echo done")).ok());
  absl::Time start = absl::Now();
  EXPECT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  supervisor.StopAll(absl::Seconds(5));  // sleep dies of SIGTERM at once
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(output.Out(), HasSubstr("[worker:0] done\n"));
  ExpectAllGone(supervisor);
}

// RunUntil waits on what servers do (here: a file one writes) without
// ending because no must_finish child is left, and copies their output
// meanwhile; a server that exits first, or a wait that runs out, ends it.
TEST(SupervisorTest, RunUntilWaitsForAConditionOnServersAlone) {
  const std::string port = TempPath("run-until-port");
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor
                  .Start(Shell("ps:0", absl::StrCat("echo binding; sleep 0.2; echo 4242 > ", port,
                                                    ".tmp; mv ", port, ".tmp ", port, "; sleep 30"),
                               /*must_finish=*/false))
                  .ok());
  RunOutcome outcome = supervisor.RunUntil(
      [&] { return ReadFile(port) == "4242\n"; }, absl::Seconds(20));
  EXPECT_EQ(outcome.kind, RunOutcome::Kind::kReady);
  EXPECT_THAT(output.Out(), HasSubstr("[ps:0] binding\n"));

  // Still running: a wait on something that never happens runs out.
  absl::Time start = absl::Now();
  outcome = supervisor.RunUntil([] { return false; }, absl::Milliseconds(300));
  EXPECT_EQ(outcome.kind, RunOutcome::Kind::kTimedOut);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  supervisor.StopAll(absl::Seconds(5));
  ExpectAllGone(supervisor);

  Supervisor failing(output.out_fd(), output.err_fd());
  ASSERT_TRUE(failing.Start(Shell("ps:1", "exit 3", /*must_finish=*/false)).ok());
  outcome = failing.RunUntil([] { return false; }, absl::Seconds(20));
  EXPECT_EQ(outcome.kind, RunOutcome::Kind::kChildFailed);
  EXPECT_EQ(outcome.failed_child, "ps:1");
  EXPECT_EQ(outcome.exit_code, 3);
  failing.StopAll(absl::Seconds(1));
  ExpectAllGone(failing);
  std::filesystem::remove(port);
}

TEST(SupervisorTest, FailureNamesTheChildAndItsExitCode) {
  struct Case {
    std::string script;
    bool must_finish;
    int exit_code;
  };
  const Case cases[] = {
      {"exit 3", true, 3},
      {"exit 1", true, 1},
      {"kill -KILL $$", true, 128 + SIGKILL},
      {"kill -SEGV $$", true, 128 + SIGSEGV},
      {"exit 0", /*must_finish=*/false, 0},  // a server that quit on its own
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.script);
    CapturedOutput output;
    Supervisor supervisor(output.out_fd(), output.err_fd());
    ASSERT_TRUE(supervisor.Start(Shell("worker:0", "sleep 30")).ok());
    ASSERT_TRUE(supervisor.Start(Shell("task:1", c.script, c.must_finish)).ok());
    absl::Time start = absl::Now();
    RunOutcome outcome = supervisor.Run();
    EXPECT_EQ(outcome.kind, RunOutcome::Kind::kChildFailed);
    EXPECT_EQ(outcome.failed_child, "task:1");
    EXPECT_EQ(outcome.exit_code, c.exit_code);
    supervisor.StopAll(absl::Seconds(10));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the sleeping sibling was not stopped";
    ExpectAllGone(supervisor);
  }
}

TEST(SupervisorTest, TheFirstChildToFailIsReported) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("late", "sleep 0.5; exit 4")).ok());
  ASSERT_TRUE(supervisor.Start(Shell("early", "exit 5")).ok());
  RunOutcome outcome = supervisor.Run();
  EXPECT_EQ(outcome.failed_child, "early");
  EXPECT_EQ(outcome.exit_code, 5);
  supervisor.StopAll(absl::Seconds(1));
  ExpectAllGone(supervisor);
}

TEST(SupervisorTest, LinesArePrefixedAndKeptWhole) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  const int kLines = 2000;
  for (std::string name : {"a", "b", "c"}) {
    std::string script = absl::StrCat("i=0; while [ $i -lt ", kLines, " ]; do echo ", name,
                                      "-line-$i; i=$((i+1)); done; echo ", name, "-err >&2");
    ASSERT_TRUE(supervisor.Start(Shell(name, script)).ok());
  }
  ASSERT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  supervisor.StopAll(absl::Seconds(1));
  std::map<std::string, int> next;  // per child: the line number expected next
  for (const std::string& line : Lines(output.Out())) {
    std::string name = line.substr(1, 1);
    ASSERT_EQ(line, absl::StrCat("[", name, "] ", name, "-line-", next[name]));
    ++next[name];
  }
  EXPECT_EQ(next["a"], kLines);
  EXPECT_EQ(next["b"], kLines);
  EXPECT_EQ(next["c"], kLines);
  std::vector<std::string> errors = Lines(output.Err());
  std::sort(errors.begin(), errors.end());
  EXPECT_THAT(errors, ElementsAre("[a] a-err", "[b] b-err", "[c] c-err"));
}

TEST(SupervisorTest, PartialLastLinesAreFlushed) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("w", "printf 'one\\ntwo'; printf 'oops' >&2")).ok());
  ASSERT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  EXPECT_EQ(output.Out(), "[w] one\n[w] two\n");
  EXPECT_EQ(output.Err(), "[w] oops\n");
}

TEST(SupervisorTest, OutputOfAFailedChildIsFlushedByStopAll) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(
      supervisor.Start(Shell("w", "echo 'fatal: no data' >&2; printf partial; exit 2")).ok());
  EXPECT_EQ(supervisor.Run().exit_code, 2);
  supervisor.StopAll(absl::Seconds(1));
  EXPECT_EQ(output.Err(), "[w] fatal: no data\n");
  EXPECT_EQ(output.Out(), "[w] partial\n");
}

TEST(SupervisorTest, StopAllKillsAChildThatIgnoresSigterm) {
  std::string ready = TempPath("ignores-term");
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(
      supervisor.Start(Shell("stubborn", "trap '' TERM; touch " + ready + "; sleep 30")).ok());
  ASSERT_TRUE(supervisor.Start(Shell("polite", "sleep 30")).ok());
  WaitForFile(ready);
  absl::Time start = absl::Now();
  supervisor.StopAll(absl::Milliseconds(500));
  absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Milliseconds(500) + absl::Seconds(2));
  ExpectAllGone(supervisor);
  std::filesystem::remove(ready);
}

TEST(SupervisorTest, StopAllReturnsAsSoonAsChildrenExit) {
  std::string ready = TempPath("polite-trap");
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("a", "sleep 30")).ok());
  ASSERT_TRUE(
      supervisor
          .Start(Shell("b", "trap 'echo bye; exit 0' TERM; touch " + ready + "; sleep 30 & wait"))
          .ok());
  WaitForFile(ready);
  absl::Time start = absl::Now();
  supervisor.StopAll(absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(output.Out(), HasSubstr("[b] bye\n"));
  ExpectAllGone(supervisor);
  std::filesystem::remove(ready);
}

// A finished worker that left a background process behind: Run() does not
// wait for the pipe it holds, and StopAll() ends it with the worker's group.
TEST(SupervisorTest, StopAllEndsWhatAnExitedChildLeftBehind) {
  std::string pid_file = TempPath("left-behind");
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  absl::Time start = absl::Now();
  ASSERT_TRUE(
      supervisor.Start(Shell("w", "sleep 30 & echo $! > " + pid_file + "; echo done")).ok());
  ASSERT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  EXPECT_THAT(output.Out(), HasSubstr("[w] done\n"));
  std::ifstream in(pid_file);
  pid_t left_behind = 0;
  in >> left_behind;
  ASSERT_GT(left_behind, 0);
  supervisor.StopAll(absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ExpectAllGone(supervisor);
  // Not our child, so not ours to reap: dead is enough.
  EXPECT_TRUE(AwaitProcessEnd(left_behind, absl::Seconds(10)));
  EXPECT_TRUE(Ended(left_behind));
  std::filesystem::remove(pid_file);
}

TEST(SupervisorTest, RequestStopFromAnotherThreadEndsRun) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("a", "echo up; sleep 30")).ok());
  ASSERT_TRUE(supervisor.Start(Shell("b", "sleep 30", /*must_finish=*/false)).ok());
  absl::Time start = absl::Now();
  // Once Run() is copying output: a stop requested before Run() began would
  // end it without waking it.
  std::thread stopper([&] {
    WaitForOutput(output, "[a] up\n");
    supervisor.RequestStop();
  });
  RunOutcome outcome = supervisor.Run();
  stopper.join();
  EXPECT_EQ(outcome.kind, RunOutcome::Kind::kStopRequested);
  supervisor.StopAll(absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ExpectAllGone(supervisor);
}

TEST(SupervisorTest, ASecondStopRequestCutsTheGracePeriodShort) {
  std::string ready = TempPath("second-stop");
  std::string termed = TempPath("second-stop-termed");
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  // Notes StopAll's SIGTERM and goes on (its sleep dies with the group).
  ASSERT_TRUE(supervisor
                  .Start(Shell("stubborn", "trap 'touch " + termed + "' TERM; touch " + ready +
                                               "; while :; do sleep 30 & wait $!; done"))
                  .ok());
  WaitForFile(ready);
  absl::Time start = absl::Now();
  // Once StopAll's grace period runs: a request before StopAll began would
  // cut it short without being a second one.
  std::thread stopper([&] {
    WaitForFile(termed);
    supervisor.RequestStop();
  });
  supervisor.StopAll(absl::Seconds(25));
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ExpectAllGone(supervisor);
  std::filesystem::remove(ready);
  std::filesystem::remove(termed);
}

TEST(SupervisorTest, SigtermToTheLauncherEndsRun) {
  struct sigaction before;
  sigaction(SIGTERM, nullptr, &before);
  {
    CapturedOutput output;
    Supervisor supervisor(output.out_fd(), output.err_fd());
    ASSERT_TRUE(supervisor.StopOnSignals().ok());
    Supervisor other(output.out_fd(), output.err_fd());
    EXPECT_EQ(other.StopOnSignals().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(supervisor.Start(Shell("a", "echo up; sleep 30")).ok());
    // Once Run() is copying output, as in RequestStopFromAnotherThreadEndsRun.
    std::thread signaller([&] {
      WaitForOutput(output, "[a] up\n");
      kill(getpid(), SIGTERM);
    });
    RunOutcome outcome = supervisor.Run();
    signaller.join();
    EXPECT_EQ(outcome.kind, RunOutcome::Kind::kStopRequested);
    supervisor.StopAll(absl::Seconds(10));
    ExpectAllGone(supervisor);
  }
  struct sigaction after;
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "the old SIGTERM handler was not restored";
}

TEST(SupervisorTest, DestructorStopsChildrenStillRunning) {
  std::vector<pid_t> pids;
  absl::Time start = absl::Now();
  {
    CapturedOutput output;
    Supervisor supervisor(output.out_fd(), output.err_fd());
    ASSERT_TRUE(supervisor.Start(Shell("a", "sleep 30")).ok());
    ASSERT_TRUE(supervisor.Start(Shell("b", "sleep 30 & sleep 30; wait")).ok());
    pids = supervisor.pids();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << "pid " << pid;
}

TEST(SupervisorTest, StartReportsAnExecutableThatCannotRun) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  absl::Status missing = supervisor.Start({"w", {"/nonexistent/worker", "--task=worker:0"}});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("cannot run /nonexistent/worker"));
  std::string plain_file = TempPath("not-executable");
  { std::ofstream(plain_file) << "echo hi\n"; }
  absl::Status not_executable = supervisor.Start({"w", {plain_file}});
  std::filesystem::remove(plain_file);
  EXPECT_EQ(not_executable.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(supervisor.Start({"w", {}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(supervisor.pids().empty());
  EXPECT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);  // nothing to wait for
}

TEST(SupervisorTest, ChildrenGetTheirOwnProcessGroupAndNoStdin) {
  CapturedOutput output;
  Supervisor supervisor(output.out_fd(), output.err_fd());
  ASSERT_TRUE(supervisor.Start(Shell("w", "cut -d' ' -f5 /proc/$$/stat; cat; echo eof")).ok());
  ASSERT_EQ(supervisor.Run().kind, RunOutcome::Kind::kAllFinished);
  EXPECT_EQ(output.Out(), absl::StrCat("[w] ", supervisor.pids()[0], "\n[w] eof\n"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
