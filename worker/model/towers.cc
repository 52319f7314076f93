#include "worker/model/towers.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pst {
namespace {

// Where the towers' threads meet in a step: at each of its points (a layer
// whose output gradients every tower must have computed, or the end of the
// slices before the average), every tower arrives once. A tower that fails
// instead releases every wait, so none waits for a point it will not reach.
//
// A wait spins a little before it sleeps: the towers reach a point within
// microseconds of each other, each on a core of its own with nothing else
// to run during the step, and a sleep and wake-up costs more than that.
class TowerBarriers {
 public:
  TowerBarriers(int towers, int points) : towers_(towers), arrived_(points) {}

  void Arrive(int point) {
    if (arrived_[point].fetch_add(1, std::memory_order_acq_rel) + 1 < towers_) return;
    absl::MutexLock lock(&mu_);  // a waiter about to sleep checks under it
    changed_.SignalAll();
  }

  // Whether every tower arrived at `point`; false once one failed.
  bool Wait(int point) {
    const absl::Time spin_until = absl::Now() + kSpin;
    for (int i = 0; !Done(point); ++i) {
      if (i % 64 == 63 && absl::Now() > spin_until) {
        absl::MutexLock lock(&mu_);
        while (!Done(point)) changed_.Wait(&mu_);
        break;
      }
      CpuRelax();
    }
    return !failed_.load(std::memory_order_acquire);
  }

  void Fail() {
    failed_.store(true, std::memory_order_release);
    absl::MutexLock lock(&mu_);
    changed_.SignalAll();
  }

 private:
  static constexpr absl::Duration kSpin = absl::Microseconds(50);

  bool Done(int point) const {
    return failed_.load(std::memory_order_acquire) ||
           arrived_[point].load(std::memory_order_acquire) >= towers_;
  }
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  const int towers_;
  std::vector<std::atomic<int>> arrived_;
  std::atomic<bool> failed_{false};
  absl::Mutex mu_;
  absl::CondVar changed_;
};

// The towers' losses over equal slices, as one batch's.
LossResult MeanLoss(const std::vector<LossResult>& losses) {
  LossResult total;
  for (const LossResult& l : losses) {
    total.loss += l.loss;
    total.correct += l.correct;
  }
  total.loss /= static_cast<double>(losses.size());
  return total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Towers>> Towers::Create(const MlpSpec& spec,
                                                       const std::vector<Kernels*>& backends,
                                                       int batch, int eval_batch) {
  const int count = static_cast<int>(backends.size());
  if (count < 1) return absl::InvalidArgumentError("a worker needs at least one tower");
  if (batch < count || batch % count != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        count, " towers cannot split a batch of ", batch,
        " rows into equal slices; use a batch_size divisible by the number of towers"));
  }
  std::unique_ptr<Towers> towers(new Towers());
  towers->backends_ = backends;
  towers->slice_rows_ = batch / count;
  towers->input_dim_ = spec.input_dim;
  towers->target_width_ =
      spec.loss == LossKind::kSoftmaxCrossEntropy ? 1 : spec.output_dim;
  for (int t = 0; t < count; ++t) {
    // Tower 0 also stages the whole batch and evaluates.
    const int rows = t == 0 ? std::max(batch, eval_batch) : batch / count;
    absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(spec, backends[t], rows);
    if (!mlp.ok()) {
      return absl::Status(mlp.status().code(), absl::StrCat("tower ", t, " (", backends[t]->Name(),
                                                            "): ", mlp.status().message()));
    }
    towers->towers_.push_back(std::move(*mlp));
  }
  // The worker pulls into tower 0's parameters: no copy per tower and step.
  towers->shared_parameters_ = std::all_of(backends.begin(), backends.end(), [](Kernels* k) {
    return k->ComputesOnHostMemory();
  });
  // CPU towers compute with tower 0's parameters, and in its rows: tower t
  // keeps its slice's activations and output gradients in rows
  // [t * slice, (t + 1) * slice) of tower 0's, so every layer's rows are one
  // matrix for the kernel gradients.
  if (towers->shared_parameters_) {
    for (int t = 1; t < count; ++t) {
      PST_RETURN_IF_ERROR(towers->towers_[t]->ReadParametersOf(*towers->towers_[0]));
      PST_RETURN_IF_ERROR(
          towers->towers_[t]->ComputeInRowsOf(*towers->towers_[0], t * towers->slice_rows_));
    }
  }
  for (size_t i = 0; i < towers->variables().size(); ++i) {
    towers->all_variables_.push_back(static_cast<int>(i));
  }
  if (count > 1) {
    for (const VariableSpec& v : towers->variables()) {
      towers->averaged_.push_back(
          towers->averaged_memory_.emplace_back(static_cast<size_t>(v.size())));
    }
  }
  return towers;
}

absl::Status Towers::AllocateFrom(TensorAllocator& allocator) {
  if (!ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only towers that all compute on host memory can compute in place");
  }
  std::vector<std::span<float>> parameters, gradients;
  for (size_t i = 0; i < variables().size(); ++i) {
    PST_ASSIGN_OR_RETURN(TensorAllocator::Memory memory,
                         allocator.Allocate(static_cast<int>(i), variables()[i]));
    parameters.push_back(memory.values);
    gradients.push_back(memory.gradient);
  }
  for (size_t i = 0; i < gradients.size() && size() > 1; ++i) {
    if (gradients[i].size() != averaged_[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("a gradient of ", gradients[i].size(),
                                                     " floats for ", variables()[i].name,
                                                     ", which has ", averaged_[i].size()));
    }
  }
  // One tower leaves its gradients there; several average into them.
  PST_RETURN_IF_ERROR(towers_[0]->PlaceTensors(
      parameters, size() == 1 ? gradients : std::span<const std::span<float>>()));
  for (int t = 1; t < size(); ++t) {
    PST_RETURN_IF_ERROR(towers_[t]->ReadParametersOf(*towers_[0]));
  }
  if (size() > 1) {
    averaged_.assign(gradients.begin(), gradients.end());
    averaged_memory_.clear();
  }
  return absl::OkStatus();
}

std::string Towers::DevicesLabel() const {
  std::vector<std::string> names;
  for (const std::unique_ptr<Mlp>& tower : towers_) names.push_back(tower->backend().Name());
  if (std::all_of(names.begin(), names.end(), [](const std::string& n) { return n == "cpu"; })) {
    return size() == 1 ? "cpu" : absl::StrCat("cpu:", size());
  }
  return absl::StrJoin(names, ",");
}

absl::Status Towers::ForEachTower(const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(towers_.size());
  {
    std::vector<ThreadPool::Task> tasks;
    for (int t = 1; t < size(); ++t) {
      tasks.push_back(threads_.Start([&fn, &results, t] { results[t] = fn(t); }));
    }
    results[0] = fn(0);
  }  // the tasks' destructors wait for them
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Towers::UploadParameters() {
  // Towers 1.. compute with tower 0's parameters: its upload is every
  // tower's, and waking their threads for it would cost more than it does.
  if (shared_parameters_) return towers_[0]->UploadParameters();
  return ForEachTower([this](int t) {
    if (t > 0) {
      PST_RETURN_IF_ERROR(CopyParameters(t, all_variables_));
    }
    return towers_[t]->UploadParameters();
  });
}

absl::Status Towers::PrepareHostParametersForWrite() {
  for (const std::unique_ptr<Mlp>& tower : towers_) {
    PST_RETURN_IF_ERROR(tower->PrepareHostParametersForWrite());
  }
  return absl::OkStatus();
}

absl::Status Towers::CopyParameters(int t, const std::vector<int>& variables) {
  // Tower t's own host parameters may still be read by its last upload.
  PST_RETURN_IF_ERROR(towers_[t]->PrepareHostParametersForWrite());
  for (int i : variables) {
    std::span<const float> from = towers_[0]->HostParameter(i);
    std::memcpy(towers_[t]->HostParameter(i).data(), from.data(), from.size_bytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const float* x, const float* targets,
                                                    int batch) {
  if (size() == 1) return towers_[0]->ComputeGradients(x, targets, batch);
  return ComputeSlices(x, targets, batch, nullptr);
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const float* x, const float* targets,
                                                    int batch, FillRows fill_rows) {
  if (size() == 1) {
    fill_rows(0, batch);
    return towers_[0]->ComputeGradients(x, targets, batch);
  }
  return ComputeSlices(x, targets, batch, nullptr, &fill_rows);
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const float* x, const float* targets,
                                                    int batch, const Mlp::LayerHooks& hooks) {
  if (size() == 1) return towers_[0]->ComputeGradients(x, targets, batch, hooks);
  {
    absl::MutexLock lock(&layers_mu_);
    towers_left_.assign(num_layers(), size());
  }
  return ComputeSlices(x, targets, batch, &hooks);
}

absl::StatusOr<LossResult> Towers::ComputeSlices(const float* x, const float* targets, int batch,
                                                 const Mlp::LayerHooks* hooks,
                                                 const FillRows* fill_rows) {
  if (batch % size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", batch, " rows does not split evenly over ", size(), " towers"));
  }
  const int slice = batch / size();
  if (hooks == nullptr && shared_parameters_) {
    return ComputeSlicesSharingKernelGradients(x, targets, slice, fill_rows);
  }
  std::vector<LossResult> losses(towers_.size());
  TowerBarriers computed_all(size(), /*points=*/1);
  absl::Status computed = ForEachTower([&](int t) -> absl::Status {
    if (fill_rows != nullptr) (*fill_rows)(t * slice, slice);
    absl::Status slice_status = ComputeSlice(t, x, targets, slice, hooks, nullptr, &losses[t]);
    if (hooks != nullptr) return slice_status;
    // Without hooks every tower's thread then averages its share of each
    // variable, once every tower's gradient is there: the average takes one
    // pass over the gradients, on every core, with no second hand-off.
    if (!slice_status.ok()) {
      computed_all.Fail();
      return slice_status;
    }
    computed_all.Arrive(0);
    if (!computed_all.Wait(0)) return absl::OkStatus();  // the tower that failed reports
    for (int i : all_variables_) {
      const size_t n = averaged_[i].size();
      AverageRange(i, n * t / size(), n * (t + 1) / size());
    }
    return absl::OkStatus();
  });
  if (!computed.ok()) return computed;
  return MeanLoss(losses);
}

absl::StatusOr<LossResult> Towers::ComputeSlicesSharingKernelGradients(
    const float* x, const float* targets, int slice, const FillRows* fill_rows) {
  // Tower t keeps its rows from t * slice_rows_ on in tower 0's buffers
  // (Create): smaller slices would leave gaps in the batch's rows. (A
  // larger one is refused by the towers' models.)
  if (slice < slice_rows_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", slice * size(), " rows on CPU towers made for batches of ",
        slice_rows_ * size(), "; each step's batch must be the one the towers were made for"));
  }
  std::vector<LossResult> losses(towers_.size());
  std::vector<absl::Status> results(towers_.size());
  // By another tower's failure; one byte each, as the towers write their own.
  std::vector<char> stopped(towers_.size(), 0);
  TowerBarriers barriers(size(), num_layers());
  PST_RETURN_IF_ERROR(ForEachTower([&](int t) {
    const Mlp::SharedKernelGradients shared{
        .output_gradient_ready = [&barriers](int layer) { barriers.Arrive(layer); },
        .kernel_gradient = [&, t](int layer) -> absl::Status {
          if (!barriers.Wait(layer)) {
            stopped[t] = 1;
            return absl::AbortedError("another tower failed");
          }
          return KernelGradientColumns(t, layer, slice * size());
        }};
    if (fill_rows != nullptr) (*fill_rows)(t * slice, slice);
    results[t] = ComputeSlice(t, x, targets, slice, nullptr, &shared, &losses[t]);
    if (!results[t].ok()) barriers.Fail();
    return absl::OkStatus();
  }));
  for (int t = 0; t < size(); ++t) {
    if (!results[t].ok() && !stopped[t]) return results[t];
  }
  // Every tower's bias gradient is its own: those are averaged.
  for (int layer = 0; layer < num_layers(); ++layer) {
    const std::vector<int> variables = LayerVariables(layer);
    for (size_t v = 1; v < variables.size(); ++v) {
      AverageRange(variables[v], 0, averaged_[variables[v]].size());
    }
  }
  return MeanLoss(losses);
}

absl::Status Towers::KernelGradientColumns(int t, int layer, int batch) {
  const int kernel = LayerVariables(layer)[0];
  const int in = static_cast<int>(variables()[kernel].shape[0]);
  const int out = static_cast<int>(variables()[kernel].shape[1]);
  const int first = out * t / size();
  const int columns = out * (t + 1) / size() - first;
  // Every tower's rows are tower 0's (Create); each tower's output
  // gradient is the mean over its slice, so 1/T makes the batch's mean.
  return backends_[t]->GemmStrided(true, false, in, columns, batch,
                                   1.0f / static_cast<float>(size()),
                                   towers_[0]->LayerInput(layer), in,
                                   towers_[0]->LayerOutputGradient(layer) + first, out, 0.0f,
                                   averaged_[kernel].data() + first, out);
}

absl::Status Towers::ComputeSlice(int t, const float* x, const float* targets, int slice,
                                  const Mlp::LayerHooks* hooks,
                                  const Mlp::SharedKernelGradients* shared, LossResult* result) {
  const float* tower_x = x + static_cast<size_t>(t) * slice * input_dim_;
  const float* tower_targets = targets + static_cast<size_t>(t) * slice * target_width_;
  absl::StatusOr<LossResult> loss;
  if (shared != nullptr) {
    loss = towers_[t]->ComputeGradients(tower_x, tower_targets, slice, *shared);
  } else if (hooks == nullptr) {
    loss = towers_[t]->ComputeGradients(tower_x, tower_targets, slice);
  } else {
    Mlp::LayerHooks tower_hooks{
        .parameters_needed = [this, hooks, t](int layer) -> absl::Status {
          PST_RETURN_IF_ERROR(hooks->parameters_needed(layer));
          if (t > 0 && !shared_parameters_) return CopyParameters(t, LayerVariables(layer));
          return absl::OkStatus();
        },
        .gradients_ready = [this, hooks](int layer) -> absl::Status {
          {
            absl::MutexLock lock(&layers_mu_);
            if (--towers_left_[layer] > 0) return absl::OkStatus();
          }
          // The last tower done with the layer averages it and hands it on.
          AverageGradients(LayerVariables(layer));
          return hooks->gradients_ready(layer);
        }};
    loss = towers_[t]->ComputeGradients(tower_x, tower_targets, slice, tower_hooks);
  }
  if (!loss.ok()) {
    return absl::Status(loss.status().code(),
                        absl::StrCat("tower ", t, ": ", loss.status().message()));
  }
  *result = *loss;
  return absl::OkStatus();
}

void Towers::AverageGradients(const std::vector<int>& variables) {
  for (int i : variables) AverageRange(i, 0, averaged_[i].size());
}

void Towers::AverageRange(int i, size_t begin, size_t end) {
  // Block by block, so that a block's sum stays in L1 until it is scaled;
  // the same additions, in tower order, as a pass per tower.
  constexpr size_t kBlock = 2048;
  const float scale = 1.0f / static_cast<float>(size());
  for (size_t first = begin; first < end; first += kBlock) {
    const size_t n = std::min(kBlock, end - first);
    float* __restrict sum = averaged_[i].data() + first;
    std::memcpy(sum, towers_[0]->HostGradient(i).data() + first, n * sizeof(float));
    for (int t = 1; t < size(); ++t) {
      const float* __restrict g = towers_[t]->HostGradient(i).data() + first;
      for (size_t j = 0; j < n; ++j) sum[j] += g[j];
    }
    for (size_t j = 0; j < n; ++j) sum[j] *= scale;
  }
}

}  // namespace pst
