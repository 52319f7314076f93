// Who is primary of one parameter-server shard, its epoch and its replica
// chain, kept in etcd (docs/architecture.md, "Shard membership").
//
// Keys, for job J and shard I:
//   /pstrain/J/shard/I/primary  "<epoch> <address>", attached to the
//                               primary's lease: it goes when the lease does
//   /pstrain/J/shard/I/epoch    "<epoch>", the last epoch handed out; no
//                               lease, never deleted (epochs would restart)
//   /pstrain/J/shard/I/chain    "<epoch> <address>,<address>,...", written by
//                               the primary of that epoch; no lease
// A campaign creates the primary key only where none exists and raises the
// epoch key by one in the same Txn, so epochs strictly increase across
// primaries, and a replica can fence off writes from any older epoch.
//
// Every call takes a deadline and returns by it (etcd unreachable:
// DEADLINE_EXCEEDED). One thread at a time per object; objects for the same
// shard in any number of processes compete.
#ifndef PST_CLUSTER_MEMBERSHIP_SHARD_MEMBERSHIP_H_
#define PST_CLUSTER_MEMBERSHIP_SHARD_MEMBERSHIP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cluster/membership/etcd_client.h"
#include "cluster/membership/lease_keeper.h"

namespace pst {

struct ShardPrimary {
  std::string address;
  int64_t epoch = 0;
  bool operator==(const ShardPrimary&) const = default;
};

// The primary key as read at etcd revision `revision`.
struct PrimaryView {
  std::optional<ShardPrimary> primary;  // none: the shard has no primary
  int64_t revision = 0;
};

struct CampaignResult {
  bool elected = false;
  ShardPrimary primary;  // this process if elected, else the one in office
};

struct ReplicaChain {
  int64_t epoch = 0;  // of the primary that wrote it
  std::vector<std::string> replicas;
};

class ShardMembership {
 public:
  // `job`: non-empty, no '/' or whitespace; `shard` >= 0. `*client` must
  // outlive the object. `on_lease_lost`, if set, is called (on the lease's
  // thread; it must not call back into this object) when the lease of an
  // office, or of a campaign in flight, is lost (not when Resign, Abandon
  // or a lost campaign ends it): from then on this process may no longer
  // be primary.
  static absl::StatusOr<std::unique_ptr<ShardMembership>> Create(
      EtcdClient* client, absl::string_view job, int shard,
      LeaseKeeper::LostCallback on_lease_lost = nullptr);
  // Abandon (no call to etcd without a deadline): the office passes on once
  // the TTL lapses, as after a crash. Call Resign first to hand it over at
  // once.
  ~ShardMembership() { Abandon(); }

  // Tries once to become primary at `my_address` (no whitespace or ','),
  // under a new lease of `lease_ttl` (whole seconds; etcd's minimum applies)
  // renewed on a thread until Resign, loss or destruction. Elected: the new
  // epoch (the previous one + 1). Not elected: the primary in office, and
  // no lease is kept. FAILED_PRECONDITION while this object holds office.
  // On an error the campaign's lease is revoked where etcd can be reached;
  // else an office it may have taken (a Txn applied whose answer was lost)
  // lapses within the TTL, as a crashed primary's would.
  absl::StatusOr<CampaignResult> Campaign(absl::string_view my_address, absl::Duration lease_ttl,
                                          absl::Time deadline);
  // Campaigns whenever the shard has no primary, waiting for the office to
  // fall vacant in between (a watch: no polling), until elected or until
  // `deadline` (DEADLINE_EXCEEDED). What a backup runs to take over.
  absl::StatusOr<CampaignResult> CampaignUntilElected(absl::string_view my_address,
                                                      absl::Duration lease_ttl,
                                                      absl::Time deadline);
  // Gives up office: revokes the lease, which deletes the primary key at
  // once. The lease stops being renewed even when the revocation fails (it
  // then lapses after its TTL). OK if this object held no office.
  absl::Status Resign(absl::Time deadline);
  // Stops renewing the lease without revoking it, and leaves office: etcd
  // deletes the primary key once the lease lapses, as if this process had
  // died. Returns until when the lease surely lives (it ends at most a
  // round trip later): the earliest a successor can take over.
  // InfinitePast if this object held no office.
  absl::Time Abandon();

  // Ends `suspect`'s office, if etcd still holds it, without waiting for
  // its lease: for a replica that found the primary gone before its lease
  // ran out (a dead process answers no call). True if the key was deleted;
  // false if another office holds it or it was vacant. The deposed primary,
  // if it still runs, is fenced by its successor's epoch; its own chain
  // writes fail from now on. Touches only etcd: safe beside any other call.
  absl::StatusOr<bool> Depose(const ShardPrimary& suspect, absl::Time deadline) const;
  // The office as etcd holds it now.
  absl::StatusOr<PrimaryView> Current(absl::Time deadline);
  // Waits for the primary key to change after `seen` (a campaign won, the
  // key deleted by a resignation or a lease's expiry) and returns it as
  // changed. DEADLINE_EXCEEDED if it does not change by `deadline`.
  absl::StatusOr<PrimaryView> AwaitChange(const PrimaryView& seen, absl::Time deadline);

  // This object's office: the primary it was elected as, while the lease
  // is kept; nullopt before, after Resign, or once the lease is lost.
  std::optional<ShardPrimary> elected() const;
  // OK while in office; else why not (LeaseKeeper::status's codes once
  // lost; FAILED_PRECONDITION when never elected or resigned).
  absl::Status office_status() const;
  // Until when this object is surely primary (InfinitePast when not): the
  // lease surely lives until then. A primary stops acting as one past it.
  absl::Time SurelyPrimaryUntil() const;
  // Waits until the office is lost (true) or `deadline` passes (false);
  // true at once when not in office.
  bool AwaitOfficeLost(absl::Time deadline) const;

  // Writes the shard's replica chain (in order, the primary first by
  // convention) under this primary's epoch; FAILED_PRECONDITION unless this
  // object holds office and etcd still has its primary key.
  absl::Status PublishChain(const std::vector<std::string>& replicas, absl::Time deadline);
  // The last chain a primary wrote; NOT_FOUND if none ever was.
  absl::StatusOr<ReplicaChain> ReadChain(absl::Time deadline);

  const std::string& primary_key() const { return primary_key_; }

 private:
  ShardMembership(EtcdClient* client, std::string prefix, LeaseKeeper::LostCallback on_lease_lost);

  EtcdClient* const client_;
  const std::string primary_key_;
  const std::string epoch_key_;
  const std::string chain_key_;
  const LeaseKeeper::LostCallback on_lease_lost_;
  // Set while elected: the lease, the office, and the primary key's
  // creation revision, which identifies this office's key in a Txn.
  std::unique_ptr<LeaseKeeper> lease_;
  ShardPrimary office_;
  int64_t office_revision_ = 0;
};

}  // namespace pst

#endif  // PST_CLUSTER_MEMBERSHIP_SHARD_MEMBERSHIP_H_
