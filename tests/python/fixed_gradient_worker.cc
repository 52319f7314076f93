// A C++ worker with a model of fixed arithmetic, for the test that a
// Python worker and a C++ worker are interchangeable in one SYNC job
// (tests/python/sync_equivalence_test.py). It drives PsClient as the
// trainer does (worker/training/trainer.cc: Connect, set_wire_dtype, set_transport,
// SetVariables, Register, AllocateTensors, Init, PushPull tagged with the
// last versions, waiting for the policy's next ones, Done); its "gradient"
// is elementwise 0.5 * value - target(worker, step, i), rounded once in
// float32, which tests/python/fixed_gradient_worker.py computes bitwise
// alike with NumPy.
//   fixed_gradient_worker CONFIG worker:<i> STEPS [OUT]
// The chief (worker:0) waits for every worker to be done and writes the
// final values to OUT, one "name value value ..." line per variable.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/security.h"
#include "common/tensor_codec.h"
#include "consistency/consistency_policy.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace {

// The test model's variables; fixed_gradient_worker.py declares the same.
std::vector<VariableSpec> Variables() {
  return {{"dense/kernel", {300, 4}}, {"dense/bias", {4}}, {"out/kernel", {4, 3}}};
}

float Initial(int64_t i) { return static_cast<float>(i % 11) * 0.0625f - 0.3125f; }

// Exact in float32: small multiples of 1/8.
float Target(int worker, int64_t step, int64_t i) {
  return static_cast<float>(i % 7) * 0.125f + static_cast<float>(worker + step % 3);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fixed_gradient_worker: error: %s\n",
               std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

int Run(const std::string& config_path, const std::string& task_text, int64_t steps,
        const std::string& out_path) {
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path, ConfigOverrides());
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<TaskId> task = ParseTask(task_text);
  if (!task.ok()) return Fail(task.status());
  absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> policy =
      MakeConsistencyPolicy(ConsistencyOptionsFromConfig(*config));
  if (!policy.ok()) return Fail(policy.status());
  absl::StatusOr<ClusterSecurity> security =
      ClusterSecurity::FromConfig(config->cluster(), ClusterSecurity::Role::kClient);
  if (!security.ok()) return Fail(security.status());
  std::vector<std::string> addresses(config->cluster().ps().begin(),
                                     config->cluster().ps().end());
  absl::StatusOr<std::unique_ptr<PsClient>> connected =
      PsClient::Connect(addresses, task->index, absl::Seconds(30), *security);
  if (!connected.ok()) return Fail(connected.status());
  PsClient& client = **connected;

  const std::vector<VariableSpec> variables = Variables();
  client.SetVariables(variables);
  client.set_wire_dtype(WireDType(config->training().wire_dtype()));
  client.set_transport(config->cluster().shm() == SHM_OFF ? PsClient::Transport::kTcp
                                                          : PsClient::Transport::kAuto);
  if (absl::StatusOr<RegisterResponse> view = client.Register(); !view.ok()) {
    return Fail(view.status());
  }
  absl::StatusOr<PsClient::Tensors> tensors = client.AllocateTensors();
  if (!tensors.ok()) return Fail(tensors.status());
  std::vector<std::vector<float>> initial;
  for (const VariableSpec& v : variables) {
    initial.emplace_back(v.size());
    for (int64_t i = 0; i < v.size(); ++i) initial.back()[i] = Initial(i);
  }
  std::vector<std::span<const float>> initial_spans(initial.begin(), initial.end());
  if (absl::StatusOr<bool> init = client.Init(initial_spans); !init.ok()) {
    return Fail(init.status());
  }

  const absl::Duration timeout = absl::Seconds(config->training().pull_timeout_seconds());
  std::vector<int64_t> versions(client.num_shards(), 0);
  absl::Status status =
      client.Exchange({.min_versions = versions, .timeout = timeout, .values = tensors->values},
                      &versions, nullptr);
  if (!status.ok()) return Fail(status);
  std::vector<std::span<const float>> gradients(tensors->gradients.begin(),
                                                tensors->gradients.end());
  std::vector<PushResponse> responses;
  for (int64_t step = 0; step < steps; ++step) {
    for (size_t v = 0; v < variables.size(); ++v) {
      for (size_t i = 0; i < tensors->values[v].size(); ++i) {
        tensors->gradients[v][i] =
            0.5f * tensors->values[v][i] - Target(task->index, step, static_cast<int64_t>(i));
      }
    }
    const std::vector<int64_t> computed_at = versions;
    std::vector<int64_t> min_versions = computed_at;
    for (int64_t& m : min_versions) m = (*policy)->MinVersionAfterPush(m);
    status = client.Exchange({.computed_at = computed_at,
                              .gradients = gradients,
                              .min_versions = min_versions,
                              .timeout = timeout,
                              .values = tensors->values},
                             &versions, &responses);
    if (!status.ok()) return Fail(status);
  }
  if (status = client.Done(); !status.ok()) return Fail(status);
  if (task->index != 0) return 0;

  // The chief: once every worker is done, the final values.
  int64_t known = -1;
  while (true) {
    absl::StatusOr<StatsResponse> stats = client.AwaitWorkersDone(0, known, absl::Seconds(10));
    if (!stats.ok()) return Fail(stats.status());
    if (stats->workers_done() >= config->cluster().workers()) break;
    known = stats->worker_changes();
  }
  std::fill(versions.begin(), versions.end(), 0);
  status =
      client.Exchange({.min_versions = versions, .timeout = timeout, .values = tensors->values},
                      &versions, nullptr);
  if (!status.ok()) return Fail(status);
  std::ofstream out(out_path);
  for (size_t v = 0; v < variables.size(); ++v) {
    out << variables[v].name;
    // %.9g: every float32 printed so that it reads back bitwise.
    for (float value : tensors->values[v]) out << absl::StrFormat(" %.9g", value);
    out << "\n";
  }
  out.close();
  if (!out) return Fail(absl::UnavailableError("cannot write " + out_path));
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  int64_t steps = 0;
  if ((argc != 4 && argc != 5) || !absl::SimpleAtoi(argv[3], &steps)) {
    std::fprintf(stderr, "usage: fixed_gradient_worker CONFIG worker:<i> STEPS [OUT]\n");
    return 2;
  }
  return pst::Run(argv[1], argv[2], steps, argc == 5 ? argv[4] : "");
}
