#include "cluster/membership/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// A renewal waits at most this long for etcd (less where the lease would
// lapse sooner), so that Stop never waits longer for the thread, and a
// failed renewal is followed by another while the lease still lives.
constexpr absl::Duration kMaxRenewalWait = absl::Seconds(1);
constexpr absl::Duration kMinRetryDelay = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Grant(EtcdClient* client,
                                                                absl::Duration ttl,
                                                                absl::Time deadline,
                                                                LostCallback on_lost) {
  const absl::Time sent = absl::Now();
  absl::StatusOr<EtcdClient::Lease> lease = client->GrantLease(ttl, deadline);
  if (!lease.ok()) return lease.status();
  return std::unique_ptr<LeaseKeeper>(
      new LeaseKeeper(client, *lease, sent + lease->ttl, std::move(on_lost)));
}

LeaseKeeper::LeaseKeeper(EtcdClient* client, const EtcdClient::Lease& lease, absl::Time sure_until,
                         LostCallback on_lost)
    : client_(client),
      id_(lease.id),
      ttl_(lease.ttl),
      on_lost_(std::move(on_lost)),
      sure_until_(sure_until) {
  thread_ = std::thread([this] { Run(); });
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

absl::Time LeaseKeeper::SureUntil() const {
  absl::MutexLock lock(&mu_);
  return sure_until_;
}

absl::Status LeaseKeeper::status() const {
  absl::MutexLock lock(&mu_);
  // The thread marks the loss when it wakes at sure_until_; a reader asking
  // in between is told already.
  if (status_.ok() && absl::Now() >= sure_until_) return LapsedError();
  return status_;
}

bool LeaseKeeper::AwaitLost(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const absl::Condition lost(
      +[](const absl::Status* status) { return !status->ok(); }, &status_);
  return mu_.AwaitWithDeadline(lost, deadline);
}

void LeaseKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    Lose(absl::CancelledError(absl::StrCat("etcd lease ", id_, ": no longer kept alive")));
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status LeaseKeeper::Revoke(absl::Time deadline) {
  Stop();
  absl::Status status = client_->RevokeLease(id_, deadline);
  return absl::IsNotFound(status) ? absl::OkStatus() : status;
}

absl::Status LeaseKeeper::LapsedError() const {
  return absl::UnavailableError(
      absl::StrCat("etcd lease ", id_, ": no renewal answered within its TTL of ",
                   absl::FormatDuration(ttl_), "; it may have expired, and its keys with it"));
}

bool LeaseKeeper::Lose(const absl::Status& why) {
  if (!status_.ok()) return false;
  status_ = why;
  return true;
}

void LeaseKeeper::Run() {
  absl::Time next = absl::Now() + ttl_ / 3;
  absl::Status lost;
  for (;;) {
    absl::Time sure_until;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), std::min(next, sure_until_));
      if (stopping_) return;
      if (absl::Now() >= sure_until_) {
        lost = LapsedError();
        Lose(lost);
        break;
      }
      sure_until = sure_until_;
    }
    const absl::Time sent = absl::Now();
    const absl::StatusOr<absl::Duration> renewed = client_->KeepAliveOnce(
        id_, std::min({sure_until, sent + ttl_ / 3, sent + kMaxRenewalWait}));
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (absl::Now() >= sure_until_) {
      // A renewal answered too late still counts as a loss: status() may
      // have reported it already, and a loss is final.
      lost = LapsedError();
      Lose(lost);
      break;
    }
    if (renewed.ok()) {
      sure_until_ = std::max(sure_until_, sent + *renewed);
      next = sent + ttl_ / 3;
    } else if (absl::IsNotFound(renewed.status())) {
      lost = renewed.status();
      Lose(lost);
      break;
    } else {
      spdlog::warn("etcd lease {}: renewal failed ({}); the lease surely lives {} more", id_,
                   renewed.status().ToString(), absl::FormatDuration(sure_until_ - absl::Now()));
      next = absl::Now() + std::max(kMinRetryDelay, ttl_ / 10);
    }
  }
  spdlog::warn("{}", lost.ToString());
  if (on_lost_) on_lost_(lost);
}

}  // namespace pst
