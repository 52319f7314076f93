// A replica's part in its shard's membership in etcd
// (cluster/membership/shard_membership.h): it campaigns for the office when
// it may take over, makes the shard primary at the epoch it wins
// (ParameterShard::BecomePrimary), publishes the chain of replicas that hold
// the office's state, and steps the shard down the moment its lease may
// have lapsed where etcd says so (the lease is gone).
//
// Who may take over a vacant office: while no chain was ever published,
// replica 0 (a new job). A new job's office publishes its first chain once
// every backup it waits for holds its state (a backup that does not come
// up within the sender's patience is dropped), and acknowledges nothing
// to a worker before then: a primary lost before it has told no worker of
// anything, and replica 0, restarted, starts the job again (the workers
// give a shard that comes back without the model its initial values
// again). After that, a replica in the last published chain
// that holds a state of that chain's epoch or newer (not a process that
// restarted since, nor a backup the primary dropped). Replica 0, if it
// restored a checkpoint at start, takes it too once it has stayed vacant
// for kFallbackPatience leases: every replica that held the state is gone,
// and training goes on from the checkpoint (the workers end the run if
// that loses more than a checkpoint interval). Without one the office
// stays vacant, said in the log: a shard never starts over from nothing.
//
// The chain is published before a backup leaves the commit rule (Drop), so
// a backup that stopped receiving updates never takes over. With etcd
// unreachable, training goes on while nothing changes: the primary serves
// on past its lease, since it acknowledges nothing the chain's backups
// lack, and a backup of the chain that took over where etcd is reachable
// fences its updates (their epoch is older), so a primary cut off from
// etcd cannot acknowledge what its successor lacks. Meanwhile a backup that
// fails stays in the commit rule, holding updates back, and a vacant office
// stays vacant, each said in the log every few seconds, until etcd answers;
// then the primary takes the office anew (a new lease and epoch; the
// backups take the state whole again while training goes on) unless
// another replica holds it.
//
// A dead primary is found faster than its lease where workers look for
// it: a worker whose call failed asks the other replicas, and a backup so
// asked (PrimarySought) asks the primary itself; if it does not answer as
// primary and the backup may take over, the backup deposes it in etcd and
// the office falls vacant at once. A replica that finds the office held at
// its own address (by the process it replaced, which died) deposes it as
// well. Deposing a primary that is alive after all (slow, or cut off)
// costs a failover, never an update: it is fenced by its successor's epoch
// as after a partition.
#ifndef PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_
#define PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/membership/etcd_client.h"
#include "cluster/membership/shard_membership.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {

class ShardOffice {
 public:
  struct Options {
    std::vector<std::string> etcd_endpoints;
    std::string job = "pstrain";
    // Where this replica serves, as the primary key in etcd names it. The
    // chain names replicas by their places (0: cluster.ps[shard]), which a
    // restart keeps where a port the system picked may change.
    std::string address;
    absl::Duration lease = absl::Seconds(1);
    // The shard's state came from a checkpoint at start.
    bool restored = false;
    // Whether `primary` answers, within a fraction of a lease, as the
    // shard's primary at its epoch (ps_server's: its Stats over the
    // cluster's channel). Unset: a dead primary is found by its lease alone.
    std::function<bool(const ShardPrimary& primary)> primary_answers;
  };
  static constexpr int kFallbackPatience = 3;

  // Starts taking part at once, on a thread of its own. `*shard` (made with
  // ShardOptions.elected) must outlive the office. InvalidArgument for a
  // bad endpoint or job name; etcd itself is first called on the thread.
  static absl::StatusOr<std::unique_ptr<ShardOffice>> Start(ParameterShard* shard, Options options);
  // Leaves office (resigning, so that a backup takes over at once) and joins.
  ~ShardOffice();
  ShardOffice(const ShardOffice&) = delete;
  ShardOffice& operator=(const ShardOffice&) = delete;

  // Takes backup `replica` out of the commit rule (SetReplicaLive false),
  // in office after publishing the chain without it. An error (etcd
  // unreachable, the office lost) leaves it in the commit rule.
  absl::Status Drop(int replica, absl::Time deadline);

  // A worker looked for the primary here (this replica refused it as a
  // backup): it may have found the primary gone. Wakes the office's
  // prober, which asks the primary (Options.primary_answers) and, if it
  // does not answer as primary and this replica may take over, deposes it
  // in etcd without waiting for its lease; the office then campaigns as
  // for any vacancy. Never blocks.
  void PrimarySought();

 private:
  ShardOffice(ParameterShard* shard, Options options, std::unique_ptr<EtcdClient> client);
  void Run();
  // Which office this replica may campaign for, vacant since
  // `vacant_since` (a job's first, where no chain was ever published);
  // nullopt if none.
  std::optional<ParameterShard::Office> MayTakeOver(absl::Time vacant_since)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holds the office won at `epoch` until it is lost or the office stops.
  void Serve(int64_t epoch, ParameterShard::Office office);
  // Publishes the chain as this replica alone (after a chain), then makes
  // the shard primary at `epoch`; false (resigned) if either fails.
  bool TakeOfficeLocked(int64_t epoch, ParameterShard::Office office)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The office's lease lapsed (`lapsed`: etcd did not answer its renewals):
  // true while this replica goes on as primary, waiting for etcd, or once
  // it has taken the office anew at a new `*epoch`; false once another
  // holds it (or won it in between).
  bool RegainLocked(const absl::Status& lapsed, int64_t* epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PublishLocked(const std::vector<int>& backups, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The prober's loop (PrimarySought).
  void Probe();
  bool ProbeWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(probe_mu_) {
    return sought_ || probe_stop_;
  }
  // Whether this replica may take over from the chain's primary: in the
  // chain, holding a state of its epoch or newer.
  bool MayFollowInOffice(const ReplicaChain& chain) const;
  // Says `status` of etcd at most every few seconds.
  void Complain(absl::string_view doing, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterShard* const shard_;
  const Options options_;
  const std::string name_;  // "shard I replica K", for the log
  const std::unique_ptr<EtcdClient> client_;
  absl::Mutex mu_;  // one membership call at a time, and the chain as published
  std::unique_ptr<ShardMembership> membership_ ABSL_GUARDED_BY(mu_);
  bool in_office_ ABSL_GUARDED_BY(mu_) = false;
  // The backups in the chain this office published; none yet in a job's
  // first office before its first chain.
  std::optional<std::vector<int>> published_ ABSL_GUARDED_BY(mu_);
  absl::Time complained_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Notification stop_;
  std::thread thread_;
  // The prober's: its own membership object (it only reads and deposes),
  // and whether a worker sought the primary since it last looked.
  std::unique_ptr<ShardMembership> probe_membership_;
  mutable absl::Mutex probe_mu_;
  bool sought_ ABSL_GUARDED_BY(probe_mu_) = false;
  bool probe_stop_ ABSL_GUARDED_BY(probe_mu_) = false;
  std::thread prober_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_
