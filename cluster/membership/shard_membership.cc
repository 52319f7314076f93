#include "cluster/membership/shard_membership.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

bool HasSpaceOrComma(absl::string_view text) {
  for (char c : text) {
    if (c == ',' || absl::ascii_isspace(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

// "<epoch> <rest>", the layout of the primary and chain values.
absl::Status SplitEpoch(absl::string_view key, absl::string_view value, int64_t* epoch,
                        absl::string_view* rest) {
  const size_t space = value.find(' ');
  if (space == absl::string_view::npos || !absl::SimpleAtoi(value.substr(0, space), epoch) ||
      *epoch < 1) {
    return absl::DataLossError(
        absl::StrCat("etcd key ", key, " holds \"", value, "\", not \"<epoch> ...\""));
  }
  *rest = value.substr(space + 1);
  return absl::OkStatus();
}

absl::StatusOr<ShardPrimary> ParsePrimary(const mvccpb::KeyValue& kv) {
  ShardPrimary primary;
  absl::string_view address;
  absl::Status status = SplitEpoch(kv.key(), kv.value(), &primary.epoch, &address);
  if (!status.ok()) return status;
  primary.address = std::string(address);
  return primary;
}

std::string PrimaryValue(const ShardPrimary& primary) {
  return absl::StrCat(primary.epoch, " ", primary.address);
}

etcdserverpb::Compare* AddCompare(etcdserverpb::TxnRequest* txn, const std::string& key,
                                  etcdserverpb::Compare::CompareTarget target) {
  etcdserverpb::Compare* compare = txn->add_compare();
  compare->set_key(key);
  compare->set_target(target);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  return compare;
}

void AddPut(google::protobuf::RepeatedPtrField<etcdserverpb::RequestOp>* ops,
            const std::string& key, std::string value, int64_t lease) {
  etcdserverpb::PutRequest* put = ops->Add()->mutable_request_put();
  put->set_key(key);
  put->set_value(std::move(value));
  put->set_lease(lease);
}

void AddRange(google::protobuf::RepeatedPtrField<etcdserverpb::RequestOp>* ops,
              const std::string& key) {
  ops->Add()->mutable_request_range()->set_key(key);
}

// The key a Range op of a Txn's answer found, or nullptr if none.
const mvccpb::KeyValue* RangeFound(const etcdserverpb::TxnResponse& txn, int op) {
  if (op >= txn.responses_size()) return nullptr;
  const etcdserverpb::RangeResponse& range = txn.responses(op).response_range();
  return range.kvs_size() > 0 ? &range.kvs(0) : nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardMembership>> ShardMembership::Create(
    EtcdClient* client, absl::string_view job, int shard, LeaseKeeper::LostCallback on_lease_lost) {
  if (job.empty() || job.find('/') != absl::string_view::npos || HasSpaceOrComma(job)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id \"", job, "\" must be non-empty, without '/', ',' or whitespace"));
  }
  if (shard < 0) return absl::InvalidArgumentError(absl::StrCat("shard index ", shard, " < 0"));
  return std::unique_ptr<ShardMembership>(new ShardMembership(
      client, absl::StrCat("/pstrain/", job, "/shard/", shard, "/"), std::move(on_lease_lost)));
}

ShardMembership::ShardMembership(EtcdClient* client, std::string prefix,
                                 LeaseKeeper::LostCallback on_lease_lost)
    : client_(client),
      primary_key_(prefix + "primary"),
      epoch_key_(prefix + "epoch"),
      chain_key_(prefix + "chain"),
      on_lease_lost_(std::move(on_lease_lost)) {}

absl::StatusOr<CampaignResult> ShardMembership::Campaign(absl::string_view my_address,
                                                         absl::Duration lease_ttl,
                                                         absl::Time deadline) {
  if (my_address.empty() || HasSpaceOrComma(my_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "primary address \"", my_address, "\" must be non-empty, without ',' or whitespace"));
  }
  if (elected().has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        primary_key_, ": this process is primary already (epoch ", office_.epoch, ")"));
  }
  lease_.reset();  // a lost office's lease, if any
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease =
      LeaseKeeper::Grant(client_, lease_ttl, deadline, on_lease_lost_);
  if (!lease.ok()) return lease.status();

  // The epoch key as last seen: (its value, its mod revision); a missing key
  // compares as revision 0. The first guess is a shard never campaigned for;
  // a wrong guess costs one more Txn, whose failure branch reads the truth.
  int64_t epoch = 0;
  int64_t epoch_revision = 0;
  for (;;) {
    const ShardPrimary me{.address = std::string(my_address), .epoch = epoch + 1};
    etcdserverpb::TxnRequest txn;
    AddCompare(&txn, primary_key_, etcdserverpb::Compare::CREATE)->set_create_revision(0);
    AddCompare(&txn, epoch_key_, etcdserverpb::Compare::MOD)->set_mod_revision(epoch_revision);
    AddPut(txn.mutable_success(), primary_key_, PrimaryValue(me), (*lease)->id());
    AddPut(txn.mutable_success(), epoch_key_, absl::StrCat(me.epoch), 0);
    AddRange(txn.mutable_failure(), primary_key_);
    AddRange(txn.mutable_failure(), epoch_key_);
    absl::StatusOr<etcdserverpb::TxnResponse> answer = client_->Txn(txn, deadline);
    if (!answer.ok()) {
      (*lease)->Revoke(deadline).IgnoreError();  // else it lapses after its TTL
      return answer.status();
    }
    if (answer->succeeded()) {
      lease_ = std::move(*lease);
      office_ = me;
      office_revision_ = answer->header().revision();  // the puts' revision
      spdlog::info("{}: {} is primary, epoch {} (lease {}, TTL {})", primary_key_, me.address,
                   me.epoch, lease_->id(), absl::FormatDuration(lease_->ttl()));
      return CampaignResult{.elected = true, .primary = me};
    }
    if (const mvccpb::KeyValue* primary = RangeFound(*answer, 0)) {
      absl::StatusOr<ShardPrimary> holder = ParsePrimary(*primary);
      if (!holder.ok()) {
        (*lease)->Revoke(deadline).IgnoreError();
        return holder.status();
      }
      if (primary->lease() == (*lease)->id()) {
        // A Txn etcd applied but whose answer was lost, repeated by the
        // client: the key under this lease is this campaign's.
        lease_ = std::move(*lease);
        office_ = *holder;
        office_revision_ = primary->create_revision();
        return CampaignResult{.elected = true, .primary = office_};
      }
      (*lease)->Revoke(deadline).IgnoreError();
      return CampaignResult{.elected = false, .primary = *std::move(holder)};
    }
    // No primary, but the epoch moved since the guess: try again from it.
    const mvccpb::KeyValue* epoch_kv = RangeFound(*answer, 1);
    epoch = 0;
    epoch_revision = 0;
    if (epoch_kv != nullptr) {
      if (!absl::SimpleAtoi(epoch_kv->value(), &epoch)) {
        (*lease)->Revoke(deadline).IgnoreError();
        return absl::DataLossError(
            absl::StrCat("etcd key ", epoch_key_, " holds \"", epoch_kv->value(), "\""));
      }
      epoch_revision = epoch_kv->mod_revision();
    }
    if (absl::Now() >= deadline) {
      (*lease)->Revoke(deadline).IgnoreError();
      return absl::DeadlineExceededError(absl::StrCat(primary_key_, ": campaign not decided"));
    }
  }
}

absl::StatusOr<CampaignResult> ShardMembership::CampaignUntilElected(absl::string_view my_address,
                                                                     absl::Duration lease_ttl,
                                                                     absl::Time deadline) {
  absl::StatusOr<PrimaryView> view = Current(deadline);
  for (;;) {
    if (!view.ok()) return view.status();
    if (!view->primary.has_value()) {
      absl::StatusOr<CampaignResult> result = Campaign(my_address, lease_ttl, deadline);
      if (!result.ok() || result->elected) return result;
      // Lost to a rival: wait from its key on. Current reads its revision;
      // a campaign's failure branch does not report it.
      view = Current(deadline);
      continue;
    }
    view = AwaitChange(*view, deadline);
  }
}

absl::Status ShardMembership::Resign(absl::Time deadline) {
  if (lease_ == nullptr) return absl::OkStatus();
  std::unique_ptr<LeaseKeeper> lease = std::move(lease_);
  absl::Status status = lease->Revoke(deadline);
  if (status.ok())
    spdlog::info("{}: {} resigned, epoch {}", primary_key_, office_.address, office_.epoch);
  return status;
}

absl::Time ShardMembership::Abandon() {
  if (lease_ == nullptr) return absl::InfinitePast();
  lease_->Stop();
  const absl::Time sure_until = lease_->SureUntil();
  lease_.reset();
  return sure_until;
}

absl::StatusOr<bool> ShardMembership::Depose(const ShardPrimary& suspect,
                                             absl::Time deadline) const {
  etcdserverpb::TxnRequest txn;
  AddCompare(&txn, primary_key_, etcdserverpb::Compare::VALUE)->set_value(PrimaryValue(suspect));
  txn.mutable_success()->Add()->mutable_request_delete_range()->set_key(primary_key_);
  absl::StatusOr<etcdserverpb::TxnResponse> answer = client_->Txn(txn, deadline);
  if (!answer.ok()) return answer.status();
  if (answer->succeeded()) {
    spdlog::warn("{}: {} deposed at epoch {}", primary_key_, suspect.address, suspect.epoch);
  }
  return answer->succeeded();
}

absl::StatusOr<PrimaryView> ShardMembership::Current(absl::Time deadline) {
  absl::StatusOr<etcdserverpb::RangeResponse> range = client_->Get(primary_key_, deadline);
  if (!range.ok()) return range.status();
  PrimaryView view{.primary = std::nullopt, .revision = range->header().revision()};
  if (range->kvs_size() > 0) {
    absl::StatusOr<ShardPrimary> primary = ParsePrimary(range->kvs(0));
    if (!primary.ok()) return primary.status();
    view.primary = *std::move(primary);
  }
  return view;
}

absl::StatusOr<PrimaryView> ShardMembership::AwaitChange(const PrimaryView& seen,
                                                         absl::Time deadline) {
  absl::StatusOr<std::vector<mvccpb::Event>> events =
      client_->AwaitEvents(primary_key_, seen.revision, deadline);
  if (absl::IsOutOfRange(events.status())) return Current(deadline);  // compacted: read afresh
  if (!events.ok()) return events.status();
  // The last event is the key as it stands at that event's revision.
  const mvccpb::Event& last = events->back();
  PrimaryView view{.primary = std::nullopt, .revision = last.kv().mod_revision()};
  if (last.type() == mvccpb::Event::PUT) {
    absl::StatusOr<ShardPrimary> primary = ParsePrimary(last.kv());
    if (!primary.ok()) return primary.status();
    view.primary = *std::move(primary);
  }
  return view;
}

std::optional<ShardPrimary> ShardMembership::elected() const {
  if (!office_status().ok()) return std::nullopt;
  return office_;
}

absl::Status ShardMembership::office_status() const {
  if (lease_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(primary_key_, ": not primary"));
  }
  return lease_->status();
}

absl::Time ShardMembership::SurelyPrimaryUntil() const {
  if (!office_status().ok()) return absl::InfinitePast();
  return lease_->SureUntil();
}

bool ShardMembership::AwaitOfficeLost(absl::Time deadline) const {
  return lease_ == nullptr || lease_->AwaitLost(deadline);
}

absl::Status ShardMembership::PublishChain(const std::vector<std::string>& replicas,
                                           absl::Time deadline) {
  for (const std::string& replica : replicas) {
    if (replica.empty() || HasSpaceOrComma(replica)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica address \"", replica, "\" must be non-empty, without ',' or whitespace"));
    }
  }
  absl::Status office = office_status();
  if (!office.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("only the primary writes the chain: ", office.message()));
  }
  // Written only while etcd still holds this office's key (created at
  // office_revision_ with this epoch): a deposed primary cannot overwrite
  // its successor's chain.
  etcdserverpb::TxnRequest txn;
  AddCompare(&txn, primary_key_, etcdserverpb::Compare::CREATE)
      ->set_create_revision(office_revision_);
  AddCompare(&txn, primary_key_, etcdserverpb::Compare::VALUE)->set_value(PrimaryValue(office_));
  AddPut(txn.mutable_success(), chain_key_,
         absl::StrCat(office_.epoch, " ", absl::StrJoin(replicas, ",")), 0);
  absl::StatusOr<etcdserverpb::TxnResponse> answer = client_->Txn(txn, deadline);
  if (!answer.ok()) return answer.status();
  if (!answer->succeeded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        primary_key_, ": epoch ", office_.epoch, " is no longer in office; chain not written"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplicaChain> ShardMembership::ReadChain(absl::Time deadline) {
  absl::StatusOr<etcdserverpb::RangeResponse> range = client_->Get(chain_key_, deadline);
  if (!range.ok()) return range.status();
  if (range->kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat(chain_key_, ": no chain written"));
  }
  ReplicaChain chain;
  absl::string_view replicas;
  absl::Status status = SplitEpoch(chain_key_, range->kvs(0).value(), &chain.epoch, &replicas);
  if (!status.ok()) return status;
  chain.replicas = absl::StrSplit(replicas, ',', absl::SkipEmpty());
  return chain;
}

}  // namespace pst
