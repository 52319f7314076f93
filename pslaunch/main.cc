// pslaunch: runs every task of a cluster config on this host.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/flags.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "pslaunch/supervisor.h"
#include "result.pb.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding ps_server and worker (default: the directory of pslaunch).");
ABSL_FLAG(std::string, result_dir, "",
          "Where the effective config and the workers' results go (default: a fresh temporary "
          "directory, removed at the end).");
ABSL_FLAG(int, grace_seconds, 10,
          "How long tasks get to exit after SIGTERM before they are killed.");

namespace {

constexpr char kProgram[] = "pslaunch";
pst::Supervisor* g_supervisor = nullptr;

void OnSignal(int) {
  if (g_supervisor != nullptr) g_supervisor->RequestStop();
}

std::string DefaultBinDir() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : self.parent_path().string();
}

absl::StatusOr<std::string> MakeResultDir(bool* remove_at_end) {
  std::string dir = absl::GetFlag(FLAGS_result_dir);
  *remove_at_end = dir.empty();
  if (dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "pslaunch.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError("cannot create a temporary directory for the run");
    }
    return pattern;
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create --result_dir ", dir));
  return dir;
}

absl::StatusOr<std::string> WriteEffectiveConfig(const pst::JobConfig& config,
                                                 const std::string& dir) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  std::string path = dir + "/cluster.textproto";
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return path;
}

std::vector<pst::ChildSpec> Tasks(const pst::JobConfig& config, const std::string& bin_dir,
                                  const std::string& config_path, const std::string& result_dir) {
  std::vector<pst::ChildSpec> tasks;
  for (int i = 0; i < config.cluster().ps_size(); ++i) {
    tasks.push_back({absl::StrCat("ps:", i),
                     {bin_dir + "/ps_server", "--config=" + config_path, absl::StrCat("--task=ps:", i)},
                     /*must_finish=*/false});
  }
  for (int i = 0; i < config.cluster().workers(); ++i) {
    tasks.push_back({absl::StrCat("worker:", i),
                     {bin_dir + "/worker", "--config=" + config_path,
                      absl::StrCat("--task=worker:", i),
                      absl::StrCat("--result_file=", result_dir, "/worker-", i, ".json")},
                     /*must_finish=*/true});
  }
  return tasks;
}

absl::StatusOr<pst::WorkerResult> ReadWorkerResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("worker result ", path, " is missing"));
  std::stringstream text;
  text << in.rdbuf();
  pst::WorkerResult result;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &result).ok()) {
    return absl::DataLossError(absl::StrCat("worker result ", path, " is not valid JSON"));
  }
  return result;
}

// The summary line; written by hand so numbers print as JSON numbers (the
// protobuf printer quotes 64-bit integers) and keys keep their order.
absl::StatusOr<std::string> SummaryLine(const pst::JobConfig& config, const std::string& dir,
                                        absl::Time start) {
  int64_t samples = 0;
  double longest = 0.0;
  pst::WorkerResult chief;
  for (int i = 0; i < config.cluster().workers(); ++i) {
    absl::StatusOr<pst::WorkerResult> result =
        ReadWorkerResult(absl::StrCat(dir, "/worker-", i, ".json"));
    if (!result.ok()) return result.status();
    samples += result->samples();
    longest = std::max(longest, result->train_seconds());
    if (i == 0) chief = *result;
  }
  std::string accuracy =
      chief.has_test_accuracy() ? absl::StrFormat("%.4f", chief.test_accuracy()) : "null";
  return absl::StrFormat(
      "{\"mode\":\"%s\",\"workers\":%d,\"epochs\":%d,\"steps\":%d,\"test_accuracy\":%s,"
      "\"final_loss\":%.6g,\"train_samples_per_sec\":%.1f,\"wall_seconds\":%.2f}",
      pst::ModeName(config.training().mode()), config.cluster().workers(),
      config.training().epochs(), chief.final_version(), accuracy, chief.final_loss(),
      longest > 0 ? samples / longest : 0.0, absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts every task of a cluster config on this host: each PS shard (ps_server) and each "
      "worker as its own process, with their log lines prefixed by the task name. Stops them "
      "all on Ctrl-C or when one fails, exiting with that task's code. When the workers "
      "finish, prints a JSON summary as the last line of stdout.\n"
      "Usage: pslaunch [--config=configs/local.textproto] [--mode=async] [--epochs=3] "
      "[--workers=4]");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_pattern("%H:%M:%S.%e [pslaunch] %v");
  absl::Time start = absl::Now();

  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfigFromFlags();
  if (!config.ok()) pst::ExitWithError(kProgram, config.status());
  bool remove_dir = false;
  absl::StatusOr<std::string> dir = MakeResultDir(&remove_dir);
  if (!dir.ok()) pst::ExitWithError(kProgram, dir.status());
  absl::StatusOr<std::string> config_path = WriteEffectiveConfig(*config, *dir);
  if (!config_path.ok()) pst::ExitWithError(kProgram, config_path.status());
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = DefaultBinDir();

  pst::Supervisor supervisor(STDOUT_FILENO, STDERR_FILENO);
  g_supervisor = &supervisor;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);

  for (const pst::ChildSpec& task : Tasks(*config, bin_dir, *config_path, *dir)) {
    if (absl::Status s = supervisor.Start(task); !s.ok()) {
      supervisor.StopAll(absl::Seconds(absl::GetFlag(FLAGS_grace_seconds)));
      pst::ExitWithError(kProgram, s);
    }
  }
  spdlog::info("started {} ps and {} worker task(s) in {} mode from {}",
               config->cluster().ps_size(), config->cluster().workers(),
               pst::ModeName(config->training().mode()), *config_path);

  pst::RunOutcome outcome = supervisor.Run();
  supervisor.StopAll(absl::Seconds(absl::GetFlag(FLAGS_grace_seconds)));
  g_supervisor = nullptr;
  int exit_code = 0;
  switch (outcome.kind) {
    case pst::RunOutcome::Kind::kAllFinished: {
      absl::StatusOr<std::string> summary = SummaryLine(*config, *dir, start);
      if (!summary.ok()) {
        std::fprintf(stderr, "pslaunch: error: %s\n", std::string(summary.status().message()).c_str());
        exit_code = 1;
        break;
      }
      std::fflush(stderr);
      std::printf("%s\n", summary->c_str());
      std::fflush(stdout);
      break;
    }
    case pst::RunOutcome::Kind::kChildFailed:
      std::fprintf(stderr, "pslaunch: task %s exited with code %d; stopped the other tasks\n",
                   outcome.failed_child.c_str(), outcome.exit_code);
      exit_code = outcome.exit_code;
      break;
    case pst::RunOutcome::Kind::kStopRequested:
      std::fprintf(stderr, "pslaunch: interrupted; stopped every task\n");
      exit_code = 130;
      break;
  }
  if (remove_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(*dir, ignored);
  }
  return exit_code;
}
