// A replica's part in its shard's membership in etcd
// (cluster/membership/shard_membership.h): it campaigns for the office when
// it may take over, makes the shard primary at the epoch it wins
// (ParameterShard::BecomePrimary), publishes the chain of replicas that hold
// the office's state, and steps the shard down the moment its lease may
// have lapsed, so that a primary cut off from etcd acknowledges nothing
// once a successor may be elected.
//
// Who may take over a vacant office: while no chain was ever published,
// replica 0 (a new job); after that, a replica in the last published chain
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
// unreachable, training goes on while nothing changes; a backup that
// fails stays in the commit rule, holding updates back, and a vacant office
// stays vacant, each said in the log every few seconds, until etcd answers.
#ifndef PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_
#define PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_

#include <atomic>
#include <memory>
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

 private:
  ShardOffice(ParameterShard* shard, Options options, std::unique_ptr<EtcdClient> client);
  void Run();
  // Whether this replica may campaign for the office, vacant since `vacant_since`.
  bool MayTakeOver(absl::Time vacant_since) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holds the office won at `epoch` until it is lost or the office stops.
  void Serve(int64_t epoch);
  absl::Status PublishLocked(const std::vector<int>& backups, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::vector<int> published_ ABSL_GUARDED_BY(mu_);  // the backups in the chain
  absl::Time complained_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_SHARD_OFFICE_H_
