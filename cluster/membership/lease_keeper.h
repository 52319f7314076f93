// One etcd lease kept alive by a thread of its own, and how long it surely
// lives: what a primary's claim to its shard rests on.
#ifndef PST_CLUSTER_MEMBERSHIP_LEASE_KEEPER_H_
#define PST_CLUSTER_MEMBERSHIP_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/membership/etcd_client.h"

namespace pst {

class LeaseKeeper {
 public:
  // Called once, on the keeper's thread, when the lease is lost (after
  // status() and AwaitLost see the loss); not when Stop or Revoke end it. It
  // must not Stop, Revoke or destroy the keeper.
  using LostCallback = std::function<void(const absl::Status&)>;

  // Grants a lease of `ttl` (whole seconds; etcd may raise it) and renews it
  // every third of its TTL until Stop, Revoke or destruction. `*client`
  // must outlive the keeper.
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Grant(EtcdClient* client, absl::Duration ttl,
                                                            absl::Time deadline,
                                                            LostCallback on_lost = nullptr);
  // Stops renewing without revoking: the lease lapses after its TTL, as it
  // would if this process died.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t id() const { return id_; }
  absl::Duration ttl() const { return ttl_; }

  // Until when the lease surely lives: the sending time of the last renewal
  // etcd answered, plus the TTL it renewed (etcd counts from its receipt,
  // later). Past it the lease may be gone and, with it, its keys.
  absl::Time SureUntil() const ABSL_LOCKS_EXCLUDED(mu_);
  // OK while the lease is kept. Once lost, why, for good:
  // UNAVAILABLE: no renewal was answered before SureUntil (etcd unreachable);
  // NOT_FOUND: etcd says the lease is gone (expired, revoked);
  // CANCELLED: Stop or Revoke ended it.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the lease is lost (true) or `deadline` passes (false).
  bool AwaitLost(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

  // Stops renewing (the lease lapses after its TTL). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops renewing and revokes the lease, which deletes its keys at once.
  // NotFound (the lease was gone already) counts as done.
  absl::Status Revoke(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LeaseKeeper(EtcdClient* client, const EtcdClient::Lease& lease, absl::Time sure_until,
              LostCallback on_lost);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE: the lease outlived what this process knows of it.
  absl::Status LapsedError() const;
  // Records the loss (the first reason stays); true if this call lost it.
  bool Lose(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EtcdClient* const client_;
  const int64_t id_;
  const absl::Duration ttl_;
  const LostCallback on_lost_;
  mutable absl::Mutex mu_;
  absl::Time sure_until_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_CLUSTER_MEMBERSHIP_LEASE_KEEPER_H_
