#include "ps_server/shm/shm_regions.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "common/region_handoff.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/transient_refusal.h"
#include "spdlog/spdlog.h"

namespace pst {

ShmRegions::ShmRegions(bool enabled, int num_workers, int64_t max_region_bytes)
    : enabled_(enabled),
      num_workers_(std::max(num_workers, 0)),
      max_region_bytes_(max_region_bytes),
      boot_id_(HostBootId().value_or("")),
      by_worker_(static_cast<size_t>(num_workers_)) {
  if (!enabled_ || boot_id_.empty()) return;
  absl::StatusOr<std::unique_ptr<RegionInbox>> inbox = RegionInbox::Start(
      [this](absl::string_view nonce, int fd) { return AdoptSealed(nonce, fd); });
  if (inbox.ok()) {
    inbox_ = std::move(*inbox);
  } else {
    spdlog::warn("workers offer named shared regions only: {}",
                 std::string(inbox.status().message()));
  }
}

std::string ShmRegions::inbox_name() const { return inbox_ != nullptr ? inbox_->name() : ""; }

int64_t ShmRegions::handoffs_refused() const {
  return inbox_ != nullptr ? inbox_->refused() : 0;
}

absl::Status ShmRegions::CheckAttach(const ShmAttachRequest& request) const {
  if (!enabled_) {
    return absl::FailedPreconditionError(
        "this PS moves tensors over TCP only (cluster.shm: SHM_OFF)");
  }
  const int worker = request.worker();
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " is not one of the ",
                                                   num_workers_, " workers of this job"));
  }
  if (boot_id_.empty() || request.boot_id() != boot_id_) {
    return absl::FailedPreconditionError("the worker runs on another host");
  }
  if (request.bytes() <= 0 || request.bytes() > max_region_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("a shared region of ", request.bytes(),
                                                   " bytes; this PS takes one of 1 to ",
                                                   max_region_bytes_));
  }
  return absl::OkStatus();
}

absl::Status ShmRegions::Attach(const ShmAttachRequest& request, ShmAttachResponse* response) {
  PST_RETURN_IF_ERROR(CheckAttach(request));
  const int worker = request.worker();
  // The exchange reads rows out of the region (ReadShmRows).
  response->set_rows_in_region(true);
  if (request.sealed()) {
    if (inbox_ == nullptr) return absl::OkStatus();  // no socket: named regions only
    const std::string nonce = RandomBytes(kHandoffNonceBytes);
    {
      absl::MutexLock lock(&mu_);
      by_worker_[worker].handoff = {
          .nonce = nonce, .bytes = request.bytes(), .deadline = absl::Now() + kHandoffDeadline};
    }
    response->set_handoff_socket(inbox_->name());
    response->set_handoff_nonce(nonce);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<OpenedRegion>> region =
      OpenedRegion::Open(request.name(), request.bytes(), request.proof());
  if (!region.ok()) return region.status();
  response->set_region(Install(worker, std::move(*region)));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShmRegions::AdoptSealed(absl::string_view nonce, int fd) {
  int worker = -1;
  Handoff handoff;
  {
    absl::MutexLock lock(&mu_);
    for (size_t w = 0; w < by_worker_.size(); ++w) {
      Handoff& candidate = by_worker_[w].handoff;
      if (!candidate.nonce.empty() && ConstantTimeEquals(candidate.nonce, nonce)) {
        worker = static_cast<int>(w);
        handoff = std::move(candidate);
        candidate = {};  // once only
      }
    }
  }
  if (worker < 0 || absl::Now() > handoff.deadline) {
    close(fd);
    return absl::PermissionDeniedError(
        "no sealed attach waits for this region (its nonce is unknown, used or expired)");
  }
  absl::StatusOr<std::unique_ptr<OpenedRegion>> region = OpenedRegion::Adopt(fd, handoff.bytes);
  if (!region.ok()) return region.status();
  return Install(worker, std::move(*region));
}

uint64_t ShmRegions::Install(int worker, std::unique_ptr<OpenedRegion> region) {
  std::random_device random;
  uint64_t handle = 0;
  while (handle == 0) handle = (static_cast<uint64_t>(random()) << 32) | random();
  const int64_t bytes = region->size();
  const bool sealed = region->sealed();
  std::deque<Parked> replaced;
  {
    absl::MutexLock lock(&mu_);
    Attached& attached = by_worker_[worker];
    replaced.swap(attached.parked);
    attached.handle = handle;
    attached.region = std::move(region);
    attached.claimed = false;
  }
  for (Parked& parked : replaced) {
    std::move(parked.on_claimed)(MarkTransient(
        absl::NotFoundError(absl::StrCat(
            "worker ", worker, "'s shared region was replaced while an exchange waited for it")),
        TransientRefusal::kRegionLost));
  }
  spdlog::info("worker {} moves tensors through a {} shared region ({} bytes)", worker,
               sealed ? "sealed" : "named", bytes);
  return handle;
}

absl::StatusOr<ShmRegions::Claim> ShmRegions::TryClaim(uint64_t handle, int worker,
                                                       OnClaimed on_claimed) {
  absl::MutexLock lock(&mu_);
  Attached* attached = nullptr;
  for (Attached& candidate : by_worker_) {
    if (candidate.handle == handle && handle != 0) attached = &candidate;
  }
  if (attached == nullptr) {
    return MarkTransient(absl::NotFoundError(absl::StrCat(
                             "no shared region ", handle,
                             " here (the PS restarted, or the worker attached another)")),
                         TransientRefusal::kRegionLost);
  }
  if (attached - by_worker_.data() != worker) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared region ", handle, " is not worker ", worker, "'s"));
  }
  if (!attached->claimed) {
    attached->claimed = true;
    return Claim{.region = ClaimFor(worker, handle)};
  }
  const ClaimId id = next_claim_++;
  attached->parked.push_back({.id = id, .on_claimed = std::move(on_claimed)});
  return Claim{.region = {}, .parked = id};
}

bool ShmRegions::CancelClaim(ClaimId id) {
  OnClaimed dropped;  // destroyed after the lock is given up
  absl::MutexLock lock(&mu_);
  for (Attached& attached : by_worker_) {
    for (auto it = attached.parked.begin(); it != attached.parked.end(); ++it) {
      if (it->id != id) continue;
      dropped = std::move(it->on_claimed);
      attached.parked.erase(it);
      return true;
    }
  }
  return false;
}

ShmRegions::Claimed ShmRegions::ClaimFor(int worker, uint64_t handle) {
  // The pointer keeps the region open (a re-attach may replace it
  // meanwhile) and gives the claim back when the exchange drops it.
  std::shared_ptr<const OpenedRegion> region = by_worker_[worker].region;
  return Claimed(region.get(),
                 [this, worker, handle, region](const OpenedRegion*) { Release(worker, handle); });
}

void ShmRegions::Release(int worker, uint64_t handle) {
  Parked next;
  Claimed handed;
  {
    absl::MutexLock lock(&mu_);
    Attached& attached = by_worker_[worker];
    if (attached.handle != handle) return;
    if (attached.parked.empty()) {
      attached.claimed = false;
      return;
    }
    // Handed on while still claimed: nobody can slip in between.
    next = std::move(attached.parked.front());
    attached.parked.pop_front();
    handed = ClaimFor(worker, handle);
  }
  std::move(next.on_claimed)(std::move(handed));
}

int ShmRegions::waiting() const {
  absl::MutexLock lock(&mu_);
  int count = 0;
  for (const Attached& a : by_worker_) count += static_cast<int>(a.parked.size());
  return count;
}

int ShmRegions::attached() const {
  absl::MutexLock lock(&mu_);
  int count = 0;
  for (const Attached& a : by_worker_) count += a.region != nullptr ? 1 : 0;
  return count;
}

}  // namespace pst
