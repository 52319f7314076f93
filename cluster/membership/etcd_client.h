// A client of etcd's v3 API over gRPC: the few calls cluster membership
// makes, each bounded by a deadline. The messages are etcd's own
// (proto/etcd/, protobuf only); the channels and stubs stay in the .cc.
//
// Every call is retried while etcd answers UNAVAILABLE (an endpoint down or
// restarting, no leader yet), on the next endpoint after a short backoff,
// until its deadline; any other code ends the call at once. The callers'
// writes are guarded Txns, a lease grant (a repeat leaks a lease that
// lapses) or idempotent, so a repeat of a write that etcd applied is
// harmless. A call that finds etcd unreachable until its deadline answers
// DEADLINE_EXCEEDED, naming the last error.
#ifndef PST_CLUSTER_MEMBERSHIP_ETCD_CLIENT_H_
#define PST_CLUSTER_MEMBERSHIP_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/rpc.pb.h"

namespace pst {

class EtcdClient {
 public:
  // `endpoints`: etcd members' client addresses, "host:port" or
  // "http://host:port" (https is not supported). Checks the list and makes
  // the channels; connecting is lazy, so an etcd that is down is not an
  // error here but in the first call. InvalidArgument for an empty list or
  // a malformed endpoint.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const std::vector<std::string>& endpoints);

  virtual ~EtcdClient() = default;

  // The value of `key` (kvs empty if it does not exist) and, in the
  // header, the store's revision at the read.
  virtual absl::StatusOr<etcdserverpb::RangeResponse> Get(absl::string_view key,
                                                          absl::Time deadline) = 0;
  virtual absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request,
                                                        absl::Time deadline) = 0;

  struct Lease {
    int64_t id = 0;
    absl::Duration ttl;  // as granted: etcd raises a TTL below its minimum
  };
  // A new lease of `ttl` (whole seconds, at least 1).
  virtual absl::StatusOr<Lease> GrantLease(absl::Duration ttl, absl::Time deadline) = 0;
  // Ends the lease and deletes its keys. NotFound if it no longer exists.
  virtual absl::Status RevokeLease(int64_t id, absl::Time deadline) = 0;
  // Renews the lease once: its TTL counts again from etcd's receipt of the
  // request. The TTL renewed; NotFound if the lease no longer exists.
  virtual absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t id, absl::Time deadline) = 0;

  // Waits for changes of `key` after revision `after_revision` (a watch
  // from after_revision + 1, so nothing between a read at that revision and
  // this call is missed): the events of the first batch etcd reports, in
  // order. DEADLINE_EXCEEDED if none comes by `deadline`; OUT_OF_RANGE if
  // etcd has compacted that revision away (read the key again instead).
  virtual absl::StatusOr<std::vector<mvccpb::Event>> AwaitEvents(absl::string_view key,
                                                                 int64_t after_revision,
                                                                 absl::Time deadline) = 0;
};

}  // namespace pst

#endif  // PST_CLUSTER_MEMBERSHIP_ETCD_CLIENT_H_
