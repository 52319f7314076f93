#include "ps_server/core/streamed_update.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/sync_reduce.h"

namespace pst {

StreamedUpdate::~StreamedUpdate() {
  staged_.clear();
  if (holds_staging_) shard_->ReleaseStaging();
}

absl::Status StreamedUpdate::Stage(VariableStore& store, const UpdateSettings& settings) {
  for (int index : indices_) {
    absl::StatusOr<VariableStore::StageTarget> target = store.BeginStage(index, settings);
    if (!target.ok()) {
      holds_staging_ = false;
      return target.status();
    }
    targets_.push_back(*target);
    staged_.push_back(store.staged_values(index));
  }
  return absl::OkStatus();
}

absl::Status StreamedUpdate::Finish(VariableStore& store) {
  for (size_t i = 0; i < indices_.size(); ++i) {
    PST_RETURN_IF_ERROR(store.FinishStage(indices_[i], targets_[i]));
  }
  return absl::OkStatus();
}

absl::Status StreamedUpdate::ApplyWhole(int tensor, int64_t elements, int64_t block,
                                        StagePart stage) {
  VariableStore::StageTarget& target = targets_[tensor];
  const int parts =
      elements < static_cast<int64_t>(kParallelElements) ? 1 : parts_;
  const int64_t blocks = (elements + block - 1) / block;
  const int64_t part_elements = (blocks + parts - 1) / parts * block;
  auto run = [&](VariableStore::StageTarget* part, int64_t begin, int64_t end) -> absl::Status {
    for (int64_t first = begin; first < end; first += block) {
      PST_RETURN_IF_ERROR(stage(part, first, std::min(block, end - first)));
      Progressed();
    }
    return absl::OkStatus();
  };
  std::vector<VariableStore::StageTarget> part_targets(parts - 1, target);
  std::vector<absl::Status> results(parts);
  {
    std::vector<ThreadPool::Task> tasks;
    for (int p = 1; p < parts; ++p) {
      const int64_t begin = std::min(elements, p * part_elements);
      const int64_t end = std::min(elements, (p + 1) * part_elements);
      tasks.push_back(threads_->Start(
          [&, p, begin, end] { results[p] = run(&part_targets[p - 1], begin, end); }));
    }
    results[0] = run(&target, 0, std::min(elements, part_elements));
  }  // the tasks' destructors wait for them
  for (const VariableStore::StageTarget& part : part_targets) target.Merge(part);
  for (absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

void StreamedUpdate::SetCancel(std::function<void()> cancel) {
  absl::MutexLock lock(&shard_->mu_);
  cancel_ = std::move(cancel);
}

}  // namespace pst
