#include "ps_server/shm_regions.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace pst {

ShmRegions::ShmRegions(bool enabled, int num_workers, int64_t max_region_bytes)
    : enabled_(enabled),
      max_region_bytes_(max_region_bytes),
      boot_id_(HostBootId().value_or("")),
      by_worker_(static_cast<size_t>(std::max(num_workers, 0))) {}

absl::Status ShmRegions::Attach(const ShmAttachRequest& request, ShmAttachResponse* response) {
  if (!enabled_) {
    return absl::FailedPreconditionError(
        "this PS moves tensors over TCP only (cluster.shm: SHM_OFF)");
  }
  const int worker = request.worker();
  if (worker < 0 || worker >= static_cast<int>(by_worker_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " is not one of the ",
                                                   by_worker_.size(), " workers of this job"));
  }
  if (boot_id_.empty() || request.boot_id() != boot_id_) {
    return absl::FailedPreconditionError("the worker runs on another host");
  }
  if (request.bytes() <= 0 || request.bytes() > max_region_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("a shared region of ", request.bytes(),
                                                   " bytes; this PS takes one of 1 to ",
                                                   max_region_bytes_));
  }
  absl::StatusOr<std::unique_ptr<OpenedRegion>> region =
      OpenedRegion::Open(request.name(), request.bytes());
  if (!region.ok()) return region.status();
  std::random_device random;
  uint64_t handle = 0;
  while (handle == 0) handle = (static_cast<uint64_t>(random()) << 32) | random();
  absl::MutexLock lock(&mu_);
  by_worker_[worker] = {handle, std::move(*region)};
  response->set_region(handle);
  spdlog::info("worker {} moves tensors through shared memory ({} bytes)", worker, request.bytes());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const OpenedRegion>> ShmRegions::Claim(uint64_t handle, int worker,
                                                                      absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Attached* {
    for (Attached& attached : by_worker_) {
      if (attached.handle == handle && handle != 0) return &attached;
    }
    return nullptr;
  };
  Attached* attached = find();
  if (attached == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no shared region ", handle, " here (the PS restarted, or the worker attached another)"));
  }
  if (attached - by_worker_.data() != worker) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared region ", handle, " is not worker ", worker, "'s"));
  }
  ++waiting_;
  const auto free_or_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return by_worker_[worker].handle != handle || !by_worker_[worker].claimed;
  };
  const bool in_time = mu_.AwaitWithDeadline(absl::Condition(&free_or_gone), deadline);
  --waiting_;
  if (by_worker_[worker].handle != handle) {
    return absl::NotFoundError(
        absl::StrCat("shared region ", handle, " was replaced while an exchange waited for it"));
  }
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat("worker ", worker, "'s shared region stayed busy with an earlier exchange"));
  }
  by_worker_[worker].claimed = true;
  // The pointer keeps the region open (a re-attach may replace it
  // meanwhile) and gives the claim back when the exchange drops it.
  std::shared_ptr<const OpenedRegion> region = by_worker_[worker].region;
  return std::shared_ptr<const OpenedRegion>(
      region.get(),
      [this, worker, handle, region](const OpenedRegion*) { Release(worker, handle); });
}

void ShmRegions::Release(int worker, uint64_t handle) {
  absl::MutexLock lock(&mu_);
  if (by_worker_[worker].handle == handle) by_worker_[worker].claimed = false;
}

int ShmRegions::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

int ShmRegions::attached() const {
  absl::MutexLock lock(&mu_);
  int count = 0;
  for (const Attached& a : by_worker_) count += a.region != nullptr ? 1 : 0;
  return count;
}

}  // namespace pst
