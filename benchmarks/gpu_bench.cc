// gpu_bench: one worker training step on the GPU against cuBLAS alone.
//
// For MLPs 784-W-W-10 (ReLU, softmax cross-entropy) and several batch sizes
// it times, in the same run on the same GPU:
//   step ms   the real Mlp on CudaKernels: batch upload (from pinned
//             memory), forward, loss readback, backward, the gradients left
//             on the device
//             (Mlp::ComputeDeviceGradients + Synchronize), host clock;
//   gemm ms   the same 3L-1 GEMM shapes issued back to back with cuBLAS
//             alone on its own stream, timed with CUDA events;
//   copy ms   the gradients' device-to-host copy (Mlp::DownloadGradients),
//             which a worker adds on top of the step before pushing;
// each the median of --repeats runs after --warmup runs. ratio = step/gemm
// (the goal is <= 1.25: the non-GEMM kernels must not matter); TFLOP/s are
// the GEMM FLOPs divided by the step or the GEMM time.
//
// --torch_results=FILE adds the PyTorch step time of the same model
// (benchmarks/torch_step.py writes FILE) and our step / PyTorch's.
// Without a visible GPU it exits with code 2 and one line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/mutex_checks.h"
#include "common/process_memory.h"
#include "kernels/device.h"
#include "worker/model/mlp.h"

ABSL_FLAG(std::vector<std::string>, widths, std::vector<std::string>({"1024", "2048", "4096", "8192"}),
          "Hidden widths W of the 784-W-W-10 models, comma-separated.");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"256", "512", "1024"}),
          "Batch sizes, comma-separated.");
ABSL_FLAG(int, repeats, 20, "Timed runs per measurement; the median is reported.");
ABSL_FLAG(int, warmup, 5, "Untimed runs before each measurement.");
ABSL_FLAG(int, gpu, 0, "CUDA device to run on.");
ABSL_FLAG(bool, json, false, "Print one JSON object per row instead of a table.");
ABSL_FLAG(std::string, torch_results, "",
          "Output of benchmarks/torch_step.py (lines \"MODEL BATCH STEP_MS\"): adds PyTorch's "
          "step time and our ratio to it.");

namespace pst {
namespace {

constexpr char kProgram[] = "gpu_bench";

struct GemmShape {
  bool transpose_a, transpose_b;
  int m, n, k;
  double flops() const { return 2.0 * m * n * k; }
};

// The GEMMs Mlp issues for one step (forward, then dW and dX per layer).
std::vector<GemmShape> StepGemms(const std::vector<int>& widths, int batch) {
  std::vector<GemmShape> shapes;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    shapes.push_back({false, false, batch, widths[l + 1], widths[l]});
  }
  for (size_t l = widths.size() - 1; l-- > 0;) {
    shapes.push_back({true, false, widths[l], widths[l + 1], batch});
    if (l > 0) shapes.push_back({false, true, batch, widths[l], widths[l + 1]});
  }
  return shapes;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

absl::Status Cuda(cudaError_t e, absl::string_view call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

absl::Status Cublas(cublasStatus_t s, absl::string_view call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cublasGetStatusName(s)));
}

// cuBLAS alone: its own handle, stream and buffers; row-major through the
// same operand swap as CudaKernels (C^T = op(B)^T op(A)^T, column-major).
class GemmTimer {
 public:
  ~GemmTimer() {
    for (float* p : buffers_) cudaFree(p);
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
    if (handle_) cublasDestroy(handle_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init(int gpu) {
    if (auto s = Cuda(cudaSetDevice(gpu), "cudaSetDevice"); !s.ok()) return s;
    if (auto s = Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); !s.ok()) return s;
    if (auto s = Cublas(cublasCreate(&handle_), "cublasCreate"); !s.ok()) return s;
    if (auto s = Cublas(cublasSetStream(handle_, stream_), "cublasSetStream"); !s.ok()) return s;
    if (auto s = Cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"); !s.ok()) return s;
    if (auto s = Cuda(cudaEventCreate(&start_), "cudaEventCreate"); !s.ok()) return s;
    return Cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }

  // Median milliseconds of the whole sequence of `shapes`, back to back.
  absl::StatusOr<double> Time(const std::vector<GemmShape>& shapes, int warmup, int repeats) {
    std::vector<std::array<float*, 3>> operands;
    for (const GemmShape& g : shapes) {
      std::array<float*, 3> abc{};
      const size_t sizes[3] = {size_t(g.m) * g.k, size_t(g.k) * g.n, size_t(g.m) * g.n};
      for (int i = 0; i < 3; ++i) {
        void* p = nullptr;
        if (auto s = Cuda(cudaMalloc(&p, sizes[i] * sizeof(float)), "cudaMalloc"); !s.ok()) return s;
        buffers_.push_back(static_cast<float*>(p));
        if (auto s = Cuda(cudaMemsetAsync(p, 0, sizes[i] * sizeof(float), stream_), "cudaMemsetAsync"); !s.ok()) return s;
        abc[i] = static_cast<float*>(p);
      }
      operands.push_back(abc);
    }
    auto run_all = [&]() -> absl::Status {
      const float alpha = 1.0f, beta = 0.0f;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const GemmShape& g = shapes[i];
        const auto [a, b, c] = operands[i];
        if (auto s = Cublas(cublasSgemm(handle_, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k,
                                        &alpha, b, g.transpose_b ? g.k : g.n, a,
                                        g.transpose_a ? g.m : g.k, &beta, c, g.n),
                            "cublasSgemm");
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    };
    for (int i = 0; i < warmup; ++i) {
      if (auto s = run_all(); !s.ok()) return s;
    }
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      if (auto s = Cuda(cudaEventRecord(start_, stream_), "cudaEventRecord"); !s.ok()) return s;
      if (auto s = run_all(); !s.ok()) return s;
      if (auto s = Cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord"); !s.ok()) return s;
      if (auto s = Cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize"); !s.ok()) return s;
      float elapsed = 0;
      if (auto s = Cuda(cudaEventElapsedTime(&elapsed, start_, stop_), "cudaEventElapsedTime"); !s.ok()) return s;
      ms.push_back(elapsed);
    }
    for (float* p : buffers_) cudaFree(p);
    buffers_.clear();
    return Median(ms);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::vector<float*> buffers_;
};

struct StepTimes {
  double step_ms = 0, copy_ms = 0;
};

double MillisSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The real Mlp on `kernels`: median step and gradient-copy times.
absl::StatusOr<StepTimes> TimeStep(Kernels* kernels, int width, int batch, int warmup, int repeats) {
  MlpSpec spec{784, {width, width}, 10, ActivationKind::kRelu, LossKind::kSoftmaxCrossEntropy, true};
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(spec, kernels, batch);
  if (!mlp.ok()) return mlp.status();
  std::vector<std::vector<float>> init = (*mlp)->InitialValues(1);
  for (size_t v = 0; v < init.size(); ++v) std::copy(init[v].begin(), init[v].end(), (*mlp)->HostParameter(v).begin());
  if (auto s = (*mlp)->UploadParameters(); !s.ok()) return s;
  // The batch sits in the Mlp's pinned staging buffers, as in the worker.
  std::mt19937 rng(1);
  std::span<float> x = (*mlp)->HostInput(), y = (*mlp)->HostTargets();
  for (float& v : x) v = static_cast<float>(rng() % 256) / 255.0f;
  for (float& v : y) v = static_cast<float>(rng() % 10);
  auto step = [&]() -> absl::Status {
    absl::StatusOr<LossResult> loss = (*mlp)->ComputeDeviceGradients(x.data(), y.data(), batch);
    if (!loss.ok()) return loss.status();
    return kernels->Synchronize();
  };
  for (int i = 0; i < warmup; ++i) {
    if (auto s = step(); !s.ok()) return s;
  }
  std::vector<double> step_ms, copy_ms;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (auto s = step(); !s.ok()) return s;
    step_ms.push_back(MillisSince(t0));
    t0 = std::chrono::steady_clock::now();
    if (auto s = (*mlp)->DownloadGradients(); !s.ok()) return s;
    copy_ms.push_back(MillisSince(t0));
  }
  return StepTimes{Median(step_ms), Median(copy_ms)};
}

// "MODEL BATCH STEP_MS" lines -> {model/batch: ms}.
absl::StatusOr<std::map<std::string, double>> ReadTorchResults(const std::string& path) {
  std::map<std::string, double> results;
  if (path.empty()) return results;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --torch_results ", path));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double ms = 0;
    if (f.size() != 3 || !absl::SimpleAtod(f[2], &ms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", n, ": expected \"MODEL BATCH STEP_MS\" (torch_step.py output), got \"", line, "\""));
    }
    results[f[0] + "/" + f[1]] = ms;
  }
  return results;
}

absl::StatusOr<std::vector<int>> Ints(const std::vector<std::string>& texts, absl::string_view flag) {
  std::vector<int> out;
  for (const std::string& t : texts) {
    int v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", t, "\" is not a positive integer"));
    }
    out.push_back(v);
  }
  return out;
}

int Run() {
  const int gpu = absl::GetFlag(FLAGS_gpu);
  const int warmup = absl::GetFlag(FLAGS_warmup), repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1 || warmup < 0) ExitWithError(kProgram, absl::InvalidArgumentError("--repeats must be >= 1 and --warmup >= 0"));
  absl::StatusOr<std::vector<int>> widths = Ints(absl::GetFlag(FLAGS_widths), "widths");
  if (!widths.ok()) ExitWithError(kProgram, widths.status());
  absl::StatusOr<std::vector<int>> batches = Ints(absl::GetFlag(FLAGS_batches), "batches");
  if (!batches.ok()) ExitWithError(kProgram, batches.status());
  absl::StatusOr<std::map<std::string, double>> torch = ReadTorchResults(absl::GetFlag(FLAGS_torch_results));
  if (!torch.ok()) ExitWithError(kProgram, torch.status());
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = MakeCudaKernels(gpu);
  if (!kernels.ok()) {
    ExitWithError(kProgram, absl::FailedPreconditionError(absl::StrCat(
                                "needs a GPU: ", kernels.status().message())));
  }
  GemmTimer gemm;
  if (auto s = gemm.Init(gpu); !s.ok()) ExitWithError(kProgram, s);
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) std::printf("device: %s\n", prop.name);
    absl::PrintF("%-20s %6s %9s %9s %6s %11s %11s %9s%s\n", "model", "batch", "step_ms", "gemm_ms",
                 "ratio", "step_TFLOPs", "gemm_TFLOPs", "copy_ms", torch->empty() ? "" : "  torch_ms vs_torch");
  }
  for (int width : *widths) {
    for (int batch : *batches) {
      const std::string model = absl::StrCat("784-", width, "-", width, "-10");
      const std::vector<GemmShape> shapes = StepGemms({784, width, width, 10}, batch);
      double flops = 0;
      for (const GemmShape& g : shapes) flops += g.flops();
      absl::StatusOr<StepTimes> step = TimeStep(kernels->get(), width, batch, warmup, repeats);
      if (!step.ok()) ExitWithError(kProgram, step.status());
      absl::StatusOr<double> gemm_ms = gemm.Time(shapes, warmup, repeats);
      if (!gemm_ms.ok()) ExitWithError(kProgram, gemm_ms.status());
      const double ratio = step->step_ms / *gemm_ms;
      const double step_tflops = flops / (step->step_ms * 1e9), gemm_tflops = flops / (*gemm_ms * 1e9);
      auto t = torch->find(absl::StrCat(model, "/", batch));
      const bool has_torch = t != torch->end();
      if (json) {
        absl::PrintF("{\"model\":\"%s\",\"batch\":%d,\"step_ms\":%.4f,\"gemm_ms\":%.4f,\"ratio\":%.3f,"
                     "\"step_tflops\":%.2f,\"gemm_tflops\":%.2f,\"copy_ms\":%.4f%s}\n",
                     model, batch, step->step_ms, *gemm_ms, ratio, step_tflops, gemm_tflops, step->copy_ms,
                     has_torch ? absl::StrFormat(",\"torch_ms\":%.4f,\"vs_torch\":%.3f", t->second,
                                                 step->step_ms / t->second)
                               : "");
      } else {
        absl::PrintF("%-20s %6d %9.3f %9.3f %6.2f %11.2f %11.2f %9.3f%s\n", model, batch, step->step_ms,
                     *gemm_ms, ratio, step_tflops, gemm_tflops, step->copy_ms,
                     has_torch ? absl::StrFormat("  %8.3f %8.2f", t->second, step->step_ms / t->second) : "");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::SkipMutexDeadlockChecks();
  pst::ParseCommandLineFlags(argc, argv,
      "Times one worker training step (forward + backward) of MLPs 784-W-W-10 on the GPU "
      "against the same GEMMs with cuBLAS alone.\n"
      "Usage: gpu_bench [--widths=1024,8192] [--batches=256,1024] [--json] "
      "[--torch_results=torch.txt]",
      pst::kBenchmark);
  return pst::Run();
}
