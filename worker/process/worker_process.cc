#include "worker/process/worker_process.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/tf_config.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/device.h"
#include "kernels/openblas_core.h"
#include "spdlog/spdlog.h"
#include "worker/client/worker_metrics.h"
#include "worker/report/event_writer.h"
#include "worker/training/ctr_data.h"
#include "worker/training/ctr_trainer.h"
#include "worker/training/trainer.h"

ABSL_FLAG(std::string, task, "",
          "Which worker this is: worker:<index>; worker:0 is the chief (default: TF_CONFIG's "
          "task, else worker:0).");
ABSL_FLAG(std::string, result_file, "",
          "Write this worker's result (steps, samples, loss, test accuracy) here as JSON.");
// Overrides this program reads itself (common/overrides.cc).
ABSL_DECLARE_FLAG(std::string, logdir);
ABSL_DECLARE_FLAG(int, connect_timeout_seconds);

namespace {

constexpr char kProgram[] = "worker";

absl::Status WriteResult(const std::string& path, const pst::WorkerResult& result) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(result, &json, options).ok()) {
    return absl::InternalError("cannot serialize the worker result");
  }
  std::ofstream out(path);
  out << json << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write --result_file ", path));
  return absl::OkStatus();
}

// One backend per tower: training.devices when set, else one on training.device
// (auto: this rank's share of the visible GPUs, kernels/device.h).
absl::StatusOr<std::vector<std::unique_ptr<pst::Kernels>>> MakeTowerBackends(
    const pst::TrainingConfig& training, int rank) {
  absl::StatusOr<pst::DeviceList> list = pst::ParseDeviceList(training.devices());
  if (!list.ok()) return list.status();
  std::string where = "--devices=" + training.devices() + ": ";
  std::string instead = "; use --devices=cpu:N";
  if (list->every_gpu) {
    const int gpus = pst::VisibleGpuCount();
    if (gpus == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--devices=gpu:all: no GPU is visible (", pst::NoGpuReason(), "); use --devices=cpu:N"));
    }
    for (int g = 0; g < gpus; ++g) list->towers.push_back({pst::DeviceSpec::Kind::kGpu, g});
  } else if (list->towers.empty()) {
    absl::StatusOr<pst::DeviceSpec> device = pst::ParseDeviceSpec(training.device());
    if (!device.ok()) return device.status();
    list->towers.push_back(*device);
    where = "";
    instead = "; use --device=cpu, or auto";
  }
  std::vector<std::unique_ptr<pst::Kernels>> backends;
  for (const pst::DeviceSpec& spec : list->towers) {
    absl::StatusOr<std::unique_ptr<pst::Kernels>> kernels = pst::MakeKernelsFor(spec, rank);
    if (!kernels.ok()) {
      return absl::Status(kernels.status().code(),
                          absl::StrCat(where, "--device=", spec.ToString(), ": ",
                                       kernels.status().message(), instead));
    }
    backends.push_back(std::move(*kernels));
  }
  return backends;
}

}  // namespace

namespace pst {

int RunWorkerProcess(int argc, char** argv, const WorkerProcessHooks& hooks) {
  pst::ExecAgainWithBetterOpenBlasKernels();
  pst::ParseCommandLineFlags(
      argc, argv,
      "A training worker: pulls parameters from every PS shard, computes gradients on its "
      "shard of the data, pushes them back.\n"
      "Usage: worker --config=configs/local.textproto --task=worker:0 [--mode=async] "
      "[--device=auto|cpu|gpu:N] [--devices=cpu:2|gpu:0,gpu:1|gpu:all]",
      pst::kWorker);

  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfigFromFlags();
  if (!config.ok()) pst::ExitWithError(kProgram, config.status());
  absl::StatusOr<pst::TaskId> task = pst::ResolveTaskFromEnvironment(
      absl::GetFlag(FLAGS_task), pst::TaskId::Kind::kWorker, kProgram);
  if (!task.ok()) pst::ExitWithError(kProgram, task.status());
  if (absl::Status s = pst::ValidateTask(*config, *task); !s.ok()) pst::ExitWithError(kProgram, s);
  if (absl::Status s = pst::CheckConfigNamesModel(*config); !s.ok()) {
    pst::ExitWithError(kProgram, s);
  }
  const int connect_seconds = absl::GetFlag(FLAGS_connect_timeout_seconds);
  if (connect_seconds < 0) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
        "--connect_timeout_seconds=", connect_seconds,
        " must be 0 (the default, 60 s) or a positive number of seconds")));
  }

  if (absl::GetFlag(FLAGS_check_config)) {
    pst::FinishConfigCheck(kProgram, *config,
                           pst::CheckTaskFiles(*config, /*ps=*/false,
                                               /*workers=*/true));
  }
  // The devices first: a wrong --device(s) fails at once, before data and peers.
  absl::StatusOr<std::vector<std::unique_ptr<pst::Kernels>>> backends =
      MakeTowerBackends(config->training(), task->index);
  if (!backends.ok()) pst::ExitWithError(kProgram, backends.status());
  std::vector<pst::Kernels*> towers;
  for (const std::unique_ptr<pst::Kernels>& backend : *backends) towers.push_back(backend.get());
  const int gpus = pst::VisibleGpuCount();
  spdlog::info(
      "{} computing on {} tower(s): {} ({} GPU(s) visible)", task->ToString(), towers.size(),
      absl::StrJoin(towers, ",",
                    [](std::string* out, const pst::Kernels* k) { out->append(k->Name()); }),
      gpus);
  if (std::any_of(towers.begin(), towers.end(),
                  [](const pst::Kernels* k) { return k->Name() == "cpu"; })) {
    spdlog::info("CPU matrix products: OpenBLAS's {} kernels{}", pst::OpenBlasCore(),
                 std::getenv("OPENBLAS_CORETYPE") != nullptr ? " (OPENBLAS_CORETYPE)" : "");
  }
  // Why none is: worth a line where the host has an NVIDIA device (a driver
  // older than the runtime, say); on a host without one the CUDA runtime's
  // complaint is noise in every CPU worker's log.
  if (gpus == 0) {
    const bool nvidia_device = std::filesystem::exists("/dev/nvidiactl");
    spdlog::log(nvidia_device ? spdlog::level::info : spdlog::level::debug,
                "no GPU visible here: {}", pst::NoGpuReason());
  }

  // Before the slow parts (data, connecting), so a bad flag fails at once.
  pst::metrics::SetProcessLabels(
      {{"task", task->ToString()}, {"worker", std::to_string(task->index)}});
  pst::GetWorkerMetrics();  // every metric is scraped from the start, at zero
  absl::StatusOr<std::unique_ptr<pst::metrics::MetricsServer>> metrics_server =
      pst::metrics::StartMetricsServerFromFlags(task->ToString());
  if (!metrics_server.ok()) pst::ExitWithError(kProgram, metrics_server.status());
  std::unique_ptr<pst::EventWriter> events;
  if (std::string logdir = absl::GetFlag(FLAGS_logdir); !logdir.empty() && task->index == 0) {
    absl::StatusOr<std::unique_ptr<pst::EventWriter>> opened = pst::EventWriter::Open(logdir);
    if (!opened.ok()) pst::ExitWithError(kProgram, opened.status());
    events = std::move(*opened);
    spdlog::info("TensorBoard events: {}", events->path());
  }

  // A CTR job streams its files (generated here on first use); the others
  // load their data set whole.
  const bool ctr = config->training().model().has_ctr();
  absl::StatusOr<std::optional<pst::PlantedModel>> planted = std::optional<pst::PlantedModel>();
  absl::StatusOr<pst::TrainingData> data = pst::TrainingData{};
  if (ctr) {
    if (towers.size() != 1) {
      pst::ExitWithError(kProgram, absl::InvalidArgumentError(
                                       "the CTR model trains on one device; set training.device "
                                       "and leave training.devices empty"));
    }
    planted = pst::PrepareCtrFiles(config->training());
    if (!planted.ok()) pst::ExitWithError(kProgram, planted.status());
  } else {
    data = pst::LoadTrainingData(config->training());
    if (!data.ok()) pst::ExitWithError(kProgram, data.status());
  }

  absl::StatusOr<pst::ClusterSecurity> security =
      pst::ClusterSecurity::FromConfig(config->cluster(), pst::ClusterSecurity::Role::kClient);
  if (!security.ok()) pst::ExitWithError(kProgram, security.status());
  for (const std::string& warning : security->warnings()) spdlog::warn("{}", warning);
  if (std::optional<std::string> warning =
          pst::metrics::ExposureWarningFromFlags(security->tls())) {
    spdlog::warn("{}", *warning);
  }
  std::vector<std::string> addresses(config->cluster().ps().begin(), config->cluster().ps().end());
  absl::StatusOr<std::unique_ptr<pst::PsClient>> client = pst::PsClient::Connect(
      addresses, task->index, absl::Seconds(connect_seconds > 0 ? connect_seconds : 60), *security,
      pst::ShardBackups(config->cluster()));
  // A shard that stayed unreachable for the whole connect timeout is most
  // likely a wrong address or a PS that never started: exit 2, as for any
  // mistake in the config (README, "Errors"), not a restart that waits as
  // long again.
  if (!client.ok()) pst::ExitWithError(kProgram, client.status());
  (*client)->set_call_patience(absl::Seconds(config->training().pull_timeout_seconds()));

  absl::StatusOr<pst::WorkerResult> result;
  if (ctr) {
    pst::CtrTrainer trainer(*config, task->index, client->get(), towers[0], *planted);
    trainer.set_live_progress(true);
    trainer.set_event_writer(events.get());
    result = trainer.Run();
  } else {
    pst::Trainer trainer(*config, task->index, client->get(), towers, &*data);
    trainer.set_live_progress(true);
    trainer.set_event_writer(events.get());
    trainer.set_before_push(hooks.before_push);
    result = trainer.Run();
  }
  if (!result.ok()) pst::ExitWithStatus(kProgram, result.status());
  if (std::string path = absl::GetFlag(FLAGS_result_file); !path.empty()) {
    if (absl::Status s = WriteResult(path, *result); !s.ok()) pst::ExitWithError(kProgram, s);
  }
  return 0;
}

}  // namespace pst
