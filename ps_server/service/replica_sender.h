// Forwards a primary shard's updates to one of its backups
// (ps_server/core/parameter_shard.h, "Replicas") over gRPC: one Replicate
// call at a time, in version order, on a thread of its own.
//
// An answer that the update was applied acknowledges it to the shard
// (ReplicaAcked). A refusal of an update that does not follow what the
// backup holds sends again from there (ReplicaResync). A refusal from a
// newer epoch means another replica is primary now: the sender stops
// forwarding and says so, and the shard, whose pulls wait for this
// backup, acknowledges nothing more (fencing). A call that fails (the
// backup is down, or slower than `timeout`) takes the backup out of the
// commit rule (Options.drop), so that the workers wait for it no longer;
// the sender asks it, each `retry`, whether it answers (its Stats), with or
// without updates to forward; once it does, it is offered the state whole,
// and the first answer to that brings it back in (and sends it the state
// whole again, from the version it is then at). In a job's first office,
// which acknowledges nothing before its first chain
// (ParameterShard::Office::kFirstOfJob), a backup that has not answered
// once since the sender started is given up to `start_patience` from then
// to come up (asked each `retry`) before it is taken out, so that the
// backups started beside a new job's primary hold its state from its first
// step on. An update larger than a message goes in pieces
// (replica_pieces.h), each call's deadline grown with its bytes.
#ifndef PST_PS_SERVER_SERVICE_REPLICA_SENDER_H_
#define PST_PS_SERVER_SERVICE_REPLICA_SENDER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ps.grpc.pb.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {

class ReplicaSender {
 public:
  struct Options {
    int replica = 1;
    // For the log: where the backup listens.
    std::string address;
    // A call's deadline: `timeout`, plus the time its bytes take at
    // `bytes_per_second` (a backup applying a large state whole).
    absl::Duration timeout = absl::Seconds(2);
    double bytes_per_second = 64e6;
    // An update that serializes to more goes in pieces of at most this
    // many bytes (replica_pieces.h): at most the backup's message limit
    // (--max_message_bytes), less room for the message's framing. 0: none.
    int64_t max_message_bytes = 0;
    absl::Duration retry = absl::Milliseconds(100);
    absl::Duration start_patience = absl::Seconds(30);
    // Takes the backup out of the commit rule (ShardOffice::Drop: the chain
    // without it first); an error keeps it in, and the next failed call
    // tries again. Unset: ParameterShard::SetReplicaLive(replica, false).
    std::function<absl::Status(int replica)> drop;
  };
  // Starts forwarding at once. `*shard` must outlive the sender.
  ReplicaSender(ParameterShard* shard, std::unique_ptr<ParameterServer::StubInterface> stub,
                Options options);
  // Stops (a call in flight ends by its deadline) and joins.
  ~ReplicaSender();
  ReplicaSender(const ReplicaSender&) = delete;
  ReplicaSender& operator=(const ReplicaSender&) = delete;

 private:
  void Run();
  // Sends one update, in pieces where it is too large for one message;
  // false when the rest of its batch must not follow (the backup missed
  // it, or it is taken whole next).
  bool Send(const ReplicaUpdate& update);
  // Sends one message: an update, or a piece of one (`version`, for the
  // log, is the update's; `last`: the update's last piece, or itself).
  // `apply_bytes`: what the backup takes in on the answer's way.
  bool SendMessage(const ReplicaUpdate& message, int64_t version, bool last, int64_t apply_bytes);
  // Whether the backup answers a call (its Stats) within the timeout.
  bool Answers();
  // Whether a backup not up yet is still waited for (the start patience).
  bool WaitsForStart() const;
  // Takes the backup out of the commit rule (Options.drop), saying that it
  // `failed` (what it did not do, and why).
  void GoOnWithout(const std::string& failed);

  ParameterShard* const shard_;
  const std::unique_ptr<ParameterServer::StubInterface> stub_;
  const Options options_;
  const absl::Time started_ = absl::Now();
  bool answered_ = false;  // once, since started_
  bool awaiting_start_ = false;
  bool live_ = true;
  bool drop_pending_ = false;
  bool deposed_ = false;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_REPLICA_SENDER_H_
