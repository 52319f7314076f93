#include "ps_server/service/shard_office.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// A membership call's bound: etcd answers within milliseconds when it is up.
constexpr absl::Duration kCall = absl::Seconds(1);
// How long a watch of the office waits before the loop looks again (and
// sees a stop).
constexpr absl::Duration kWatch = absl::Milliseconds(250);
// How often an office holder compares the chain with the commit rule's.
constexpr absl::Duration kChainPoll = absl::Milliseconds(20);
constexpr absl::Duration kComplainEvery = absl::Seconds(5);

}  // namespace

absl::StatusOr<std::unique_ptr<ShardOffice>> ShardOffice::Start(ParameterShard* shard,
                                                                Options options) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options.etcd_endpoints);
  if (!client.ok()) return client.status();
  std::unique_ptr<ShardOffice> office(
      new ShardOffice(shard, std::move(options), *std::move(client)));
  absl::StatusOr<std::unique_ptr<ShardMembership>> membership =
      ShardMembership::Create(office->client_.get(), office->options_.job, shard->shard(),
                              [shard](const absl::Status& lost) {
                                // etcd unreachable: nobody can take over
                                // meanwhile, and a rival elected where
                                // etcd is reachable fences this primary
                                // through the backups (shard_office.h).
                                if (!absl::IsUnavailable(lost)) shard->StepDown();
                              });
  if (!membership.ok()) return membership.status();
  {
    absl::MutexLock lock(&office->mu_);
    office->membership_ = *std::move(membership);
  }
  if (office->options_.primary_answers) {
    absl::StatusOr<std::unique_ptr<ShardMembership>> prober =
        ShardMembership::Create(office->client_.get(), office->options_.job, shard->shard());
    if (!prober.ok()) return prober.status();
    office->probe_membership_ = *std::move(prober);
    office->prober_ = std::thread([office = office.get()] { office->Probe(); });
  }
  office->thread_ = std::thread([office = office.get()] { office->Run(); });
  return office;
}

ShardOffice::ShardOffice(ParameterShard* shard, Options options, std::unique_ptr<EtcdClient> client)
    : shard_(shard),
      options_(std::move(options)),
      name_(absl::StrCat("shard ", shard->shard(), " replica ", shard->replica())),
      client_(std::move(client)) {}

ShardOffice::~ShardOffice() {
  stop_.Notify();
  {
    absl::MutexLock lock(&probe_mu_);
    probe_stop_ = true;
  }
  if (prober_.joinable()) prober_.join();
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  membership_.reset();  // after the thread: it abandons what Serve did not resign
}

void ShardOffice::Complain(absl::string_view doing, const absl::Status& status) {
  const absl::Time now = absl::Now();
  if (now - complained_ < kComplainEvery) return;
  complained_ = now;
  spdlog::error(
      "{}: cannot {} in etcd ({}): {}; training goes on while nothing changes, but a "
      "failover waits until etcd at {} answers",
      name_, std::string(doing), static_cast<int>(status.code()), std::string(status.message()),
      absl::StrJoin(options_.etcd_endpoints, ","));
}

void ShardOffice::Run() {
  absl::Time vacant_since = absl::InfiniteFuture();
  while (!stop_.HasBeenNotified()) {
    std::optional<int64_t> won;
    ParameterShard::Office office = ParameterShard::Office::kAfterAChain;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PrimaryView> view = membership_->Current(absl::Now() + kCall);
      if (!view.ok()) {
        Complain("read who is primary", view.status());
      } else if (view->primary.has_value()) {
        vacant_since = absl::InfiniteFuture();
        if (view->primary->address == options_.address) {
          // Held at this replica's own address, not by this process (it
          // serves the office elsewhere, in Serve): by the process it
          // replaced, which died. Deposed now rather than after its lease,
          // the office goes to whoever may take it (this replica too, at
          // a new job's start). Alive after all, that process is fenced
          // by its successor's epoch, as after a partition.
          spdlog::warn(
              "{}: the office is held at this replica's address ({}, epoch {}) by the "
              "process this one replaced: deposing it",
              name_, view->primary->address, view->primary->epoch);
          absl::StatusOr<bool> deposed = membership_->Depose(*view->primary, absl::Now() + kCall);
          if (!deposed.ok()) Complain("depose the replaced process's office", deposed.status());
          if (deposed.ok() && *deposed) continue;
        }
        // Returns once the office changes hands or falls vacant.
        (void)membership_->AwaitChange(*view, absl::Now() + kWatch);
        continue;
      } else {
        vacant_since = std::min(vacant_since, absl::Now());
        if (std::optional<ParameterShard::Office> may = MayTakeOver(vacant_since)) {
          office = *may;
          absl::StatusOr<CampaignResult> result =
              membership_->Campaign(options_.address, options_.lease, absl::Now() + kCall);
          if (!result.ok()) {
            Complain("campaign for the office", result.status());
          } else if (result->elected) {
            won = result->primary.epoch;
          }
        } else {
          (void)membership_->AwaitChange(*view, absl::Now() + kWatch);
          continue;
        }
      }
    }
    if (won.has_value()) {
      Serve(*won, office);
      vacant_since = absl::InfiniteFuture();
    } else {
      stop_.WaitForNotificationWithTimeout(kWatch);
    }
  }
}

std::optional<ParameterShard::Office> ShardOffice::MayTakeOver(absl::Time vacant_since) {
  using Office = ParameterShard::Office;
  absl::StatusOr<ReplicaChain> chain = membership_->ReadChain(absl::Now() + kCall);
  if (absl::IsNotFound(chain.status())) {
    if (shard_->replica() == 0) return Office::kFirstOfJob;
    return std::nullopt;
  }
  if (!chain.ok()) {
    Complain("read the chain", chain.status());
    return std::nullopt;
  }
  if (MayFollowInOffice(*chain)) return Office::kAfterAChain;
  if (shard_->replica() == 0 && options_.restored &&
      absl::Now() - vacant_since >= kFallbackPatience * options_.lease) {
    // Every replica that held the state is gone: the shard goes on from
    // replica 0's checkpoint, and the workers, who know what they read,
    // end the run if that loses more than a checkpoint interval.
    spdlog::warn(
        "{}: the office has been vacant for {} and no replica of the chain ({}, epoch {}) took "
        "it: campaigning with the checkpoint restored at version {}; the updates after it are "
        "lost",
        name_, absl::FormatDuration(absl::Now() - vacant_since),
        absl::StrJoin(chain->replicas, ","), chain->epoch, shard_->version());
    return Office::kAfterAChain;
  }
  if (absl::Now() - vacant_since >= kFallbackPatience * options_.lease) {
    Complain("find a replica to take the vacant office (every replica of the chain is gone)",
             absl::UnavailableError(absl::StrCat(
                 "chain ", absl::StrJoin(chain->replicas, ","), " of epoch ", chain->epoch,
                 "; restart a replica of it, or replica 0 with a checkpoint to restore")));
  }
  return std::nullopt;
}

bool ShardOffice::MayFollowInOffice(const ReplicaChain& chain) const {
  const std::string me = std::to_string(shard_->replica());
  const bool in_chain =
      std::find(chain.replicas.begin(), chain.replicas.end(), me) != chain.replicas.end();
  return in_chain && shard_->holds_state() && shard_->epoch() >= chain.epoch;
}

void ShardOffice::PrimarySought() {
  absl::MutexLock lock(&probe_mu_);
  sought_ = true;
}

void ShardOffice::Probe() {
  // A primary that answered is not asked again for this long: workers ask
  // the backups many times while they look.
  constexpr absl::Duration kQuiet = absl::Milliseconds(200);
  for (;;) {
    {
      absl::MutexLock lock(&probe_mu_);
      probe_mu_.Await(absl::Condition(this, &ShardOffice::ProbeWanted));
      if (probe_stop_) return;
      sought_ = false;
    }
    if (shard_->primary()) continue;
    const absl::Time deadline = absl::Now() + kCall;
    absl::StatusOr<PrimaryView> view = probe_membership_->Current(deadline);
    if (!view.ok() || !view->primary.has_value() || view->primary->address == options_.address) {
      continue;  // etcd down (the office says so), or vacant: the office campaigns
    }
    absl::StatusOr<ReplicaChain> chain = probe_membership_->ReadChain(deadline);
    if (!chain.ok() || chain->epoch != view->primary->epoch || !MayFollowInOffice(*chain)) {
      continue;  // another replica's to take, or nobody's
    }
    if (options_.primary_answers(*view->primary)) {
      absl::MutexLock lock(&probe_mu_);
      probe_mu_.AwaitWithTimeout(absl::Condition(&probe_stop_), kQuiet);
      continue;
    }
    spdlog::warn("{}: a worker looks for the primary, and {} (epoch {}) does not answer as one",
                 name_, view->primary->address, view->primary->epoch);
    absl::StatusOr<bool> deposed = probe_membership_->Depose(*view->primary, deadline);
    if (!deposed.ok()) {
      spdlog::warn("{}: could not depose {} in etcd: {}", name_, view->primary->address,
                   deposed.status().ToString());
    }
  }
}

void ShardOffice::Serve(int64_t epoch, ParameterShard::Office office) {
  {
    absl::MutexLock lock(&mu_);
    if (!TakeOfficeLocked(epoch, office)) return;
  }
  bool deposed = false;
  while (!stop_.HasBeenNotified() && !deposed) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Status held = membership_->office_status();
      if (!shard_->primary()) {
        // Fenced: a backup has seen a newer epoch (ReplicaSender).
        spdlog::warn("{} left office at epoch {}: another replica holds a newer one", name_, epoch);
        deposed = true;
      } else if (held.ok()) {
        const std::optional<std::vector<int>> backups = shard_->ChainToPublish();
        if (backups.has_value() && backups != published_) {
          absl::Status s = PublishLocked(*backups, absl::Now() + kCall);
          if (absl::IsFailedPrecondition(s)) {
            // Deposed: another replica took the office without waiting
            // for this one's lease.
            spdlog::warn("{} left office at epoch {}: {}", name_, epoch, std::string(s.message()));
            deposed = true;
          } else if (!s.ok()) {
            Complain("publish the chain", s);
          }
        }
      } else if (absl::IsUnavailable(held)) {
        deposed = !RegainLocked(held, &epoch);
      } else {
        spdlog::error("{} lost its office at epoch {}: {}", name_, epoch,
                      std::string(held.message()));
        deposed = true;
      }
    }
    stop_.WaitForNotificationWithTimeout(kChainPoll);
  }
  absl::MutexLock lock(&mu_);
  in_office_ = false;
  shard_->StepDown();
  // Stopping: a backup takes over at once. Deposed: the lease, if etcd
  // still keeps it, ends now rather than after its TTL.
  (void)membership_->Resign(absl::Now() + kCall);
}

bool ShardOffice::TakeOfficeLocked(int64_t epoch, ParameterShard::Office office) {
  // After a chain, this office's starts as this replica alone before it
  // serves: a replica of the last chain must not take over once this one
  // has acknowledged an update it may lack. A job's first chain waits for
  // the backups (ParameterShard::Office), and nothing is acknowledged
  // before it.
  published_.reset();
  if (office == ParameterShard::Office::kAfterAChain) {
    if (absl::Status s = PublishLocked({}, absl::Now() + kCall); !s.ok()) {
      Complain("publish the chain of a new office", s);
      (void)membership_->Resign(absl::Now() + kCall);
      return false;
    }
  }
  if (absl::Status s = shard_->BecomePrimary(epoch, office); !s.ok()) {
    spdlog::error("{}: won epoch {} but cannot take office: {}", name_, epoch,
                  std::string(s.message()));
    (void)membership_->Resign(absl::Now() + kCall);
    return false;
  }
  spdlog::info("{} is primary at epoch {}, version {}{}", name_, epoch, shard_->version(),
               office == ParameterShard::Office::kFirstOfJob
                   ? "; a new job: it acknowledges nothing until its backups hold its state"
                   : "");
  in_office_ = true;
  return true;
}

bool ShardOffice::RegainLocked(const absl::Status& lapsed, int64_t* epoch) {
  absl::StatusOr<PrimaryView> view = membership_->Current(absl::Now() + kCall);
  if (!view.ok()) {
    Complain(absl::StrCat("renew the lease of the office (serving on as primary at epoch ", *epoch,
                          ": nothing is acknowledged that the chain's backups lack, "
                          "and no replica can take over meanwhile)"),
             lapsed);
    return true;
  }
  if (view->primary.has_value() &&
      !(view->primary->address == options_.address && view->primary->epoch == *epoch)) {
    spdlog::warn("{}: etcd answers again, and {} holds the office at epoch {}", name_,
                 view->primary->address, view->primary->epoch);
    return false;
  }
  // The office is vacant, or still this replica's under the lapsed lease:
  // it is taken anew, under a new lease and epoch. A backup of the chain
  // may win it first; then this replica follows it. A job's first office
  // that published no chain yet is still one.
  const ParameterShard::Office office = published_.has_value()
                                            ? ParameterShard::Office::kAfterAChain
                                            : ParameterShard::Office::kFirstOfJob;
  (void)membership_->Resign(absl::Now() + kCall);
  in_office_ = false;
  absl::StatusOr<CampaignResult> result =
      membership_->Campaign(options_.address, options_.lease, absl::Now() + kCall);
  if (!result.ok() || !result->elected) {
    spdlog::warn("{}: etcd answers again, but the office went to {}", name_,
                 result.ok() ? result->primary.address : result.status().ToString());
    return false;
  }
  spdlog::info("{}: etcd answers again; office taken anew at epoch {}", name_,
               result->primary.epoch);
  if (!TakeOfficeLocked(result->primary.epoch, office)) return false;
  *epoch = result->primary.epoch;
  return true;
}

absl::Status ShardOffice::PublishLocked(const std::vector<int>& backups, absl::Time deadline) {
  std::vector<std::string> chain = {std::to_string(shard_->replica())};
  for (int replica : backups) chain.push_back(std::to_string(replica));
  if (absl::Status s = membership_->PublishChain(chain, deadline); !s.ok()) return s;
  published_ = backups;
  shard_->ChainPublished(backups);
  spdlog::info("{}: chain of replicas {}", name_, absl::StrJoin(chain, ","));
  return absl::OkStatus();
}

absl::Status ShardOffice::Drop(int replica, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (in_office_ && published_.has_value()) {
    std::vector<int> backups = *published_;
    backups.erase(std::remove(backups.begin(), backups.end(), replica), backups.end());
    if (backups != *published_) {
      if (absl::Status s = PublishLocked(backups, deadline); !s.ok()) {
        Complain("publish the chain without a failed backup", s);
        return s;
      }
    }
  }
  shard_->SetReplicaLive(replica, false);
  return absl::OkStatus();
}

}  // namespace pst
