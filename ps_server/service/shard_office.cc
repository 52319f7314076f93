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
                              [shard](const absl::Status&) { shard->StepDown(); });
  if (!membership.ok()) return membership.status();
  {
    absl::MutexLock lock(&office->mu_);
    office->membership_ = *std::move(membership);
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
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PrimaryView> view = membership_->Current(absl::Now() + kCall);
      if (!view.ok()) {
        Complain("read who is primary", view.status());
      } else if (view->primary.has_value()) {
        vacant_since = absl::InfiniteFuture();
        // Returns once the office changes hands or falls vacant.
        (void)membership_->AwaitChange(*view, absl::Now() + kWatch);
        continue;
      } else {
        vacant_since = std::min(vacant_since, absl::Now());
        if (MayTakeOver(vacant_since)) {
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
      Serve(*won);
      vacant_since = absl::InfiniteFuture();
    } else {
      stop_.WaitForNotificationWithTimeout(kWatch);
    }
  }
}

bool ShardOffice::MayTakeOver(absl::Time vacant_since) {
  absl::StatusOr<ReplicaChain> chain = membership_->ReadChain(absl::Now() + kCall);
  if (absl::IsNotFound(chain.status())) return shard_->replica() == 0;  // a new job
  if (!chain.ok()) {
    Complain("read the chain", chain.status());
    return false;
  }
  const std::string me = std::to_string(shard_->replica());
  const bool in_chain =
      std::find(chain->replicas.begin(), chain->replicas.end(), me) != chain->replicas.end();
  if (in_chain && shard_->holds_state() && shard_->epoch() >= chain->epoch) return true;
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
    return true;
  }
  if (absl::Now() - vacant_since >= kFallbackPatience * options_.lease) {
    Complain("find a replica to take the vacant office (every replica of the chain is gone)",
             absl::UnavailableError(absl::StrCat(
                 "chain ", absl::StrJoin(chain->replicas, ","), " of epoch ", chain->epoch,
                 "; restart a replica of it, or replica 0 with a checkpoint to restore")));
  }
  return false;
}

void ShardOffice::Serve(int64_t epoch) {
  if (absl::Status s = shard_->BecomePrimary(epoch); !s.ok()) {
    spdlog::error("{}: won epoch {} but cannot take office: {}", name_, epoch,
                  std::string(s.message()));
    absl::MutexLock lock(&mu_);
    (void)membership_->Resign(absl::Now() + kCall);
    return;
  }
  spdlog::info("{} is primary at epoch {}, version {}", name_, epoch, shard_->version());
  {
    absl::MutexLock lock(&mu_);
    in_office_ = true;
    if (absl::Status s = PublishLocked({}, absl::Now() + kCall); !s.ok()) {
      Complain("publish the chain", s);
    }
  }
  bool lost = false;
  while (!stop_.HasBeenNotified() && !lost) {
    {
      absl::MutexLock lock(&mu_);
      lost = !membership_->office_status().ok();
      if (!lost) {
        const std::vector<int> backups = shard_->CaughtUpBackups();
        if (backups != published_) {
          if (absl::Status s = PublishLocked(backups, absl::Now() + kCall); !s.ok()) {
            Complain("publish the chain", s);
          }
        }
      }
    }
    stop_.WaitForNotificationWithTimeout(kChainPoll);
  }
  absl::MutexLock lock(&mu_);
  in_office_ = false;
  shard_->StepDown();
  if (lost) {
    spdlog::error("{} lost its office at epoch {}: its lease in etcd may have lapsed", name_,
                  epoch);
  } else {
    (void)membership_->Resign(absl::Now() + kCall);  // a backup takes over at once
  }
}

absl::Status ShardOffice::PublishLocked(const std::vector<int>& backups, absl::Time deadline) {
  std::vector<std::string> chain = {std::to_string(shard_->replica())};
  for (int replica : backups) chain.push_back(std::to_string(replica));
  if (absl::Status s = membership_->PublishChain(chain, deadline); !s.ok()) return s;
  published_ = backups;
  spdlog::info("{}: chain of replicas {}", name_, absl::StrJoin(chain, ","));
  return absl::OkStatus();
}

absl::Status ShardOffice::Drop(int replica, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (in_office_) {
    std::vector<int> backups = published_;
    backups.erase(std::remove(backups.begin(), backups.end(), replica), backups.end());
    if (backups != published_) {
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
