#include "cluster/membership/etcd_client.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "etcd/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// After an UNAVAILABLE answer the next attempt waits this long, doubling up
// to the cap: a restarting etcd is back within a few of them, and a backup
// campaigning after a failover loses at most the cap.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(250);

std::chrono::system_clock::time_point ToChrono(absl::Time deadline) {
  // gRPC takes system_clock deadlines; an infinite one would overflow.
  return absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Hours(24 * 365)));
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(std::vector<Endpoint> endpoints) : endpoints_(std::move(endpoints)) {}

  absl::StatusOr<etcdserverpb::RangeResponse> Get(absl::string_view key,
                                                  absl::Time deadline) override {
    etcdserverpb::RangeRequest request;
    request.set_key(std::string(key));
    etcdserverpb::RangeResponse response;
    absl::Status status = Call("Range", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->Range(context, request, &response);
    });
    if (!status.ok()) return status;
    return response;
  }

  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request,
                                                absl::Time deadline) override {
    etcdserverpb::TxnResponse response;
    absl::Status status = Call("Txn", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->Txn(context, request, &response);
    });
    if (!status.ok()) return status;
    return response;
  }

  absl::StatusOr<Lease> GrantLease(absl::Duration ttl, absl::Time deadline) override {
    const int64_t seconds = absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)));
    if (seconds < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a lease's TTL is at least 1 s, not ", absl::FormatDuration(ttl)));
    }
    etcdserverpb::LeaseGrantRequest request;
    request.set_ttl(seconds);
    etcdserverpb::LeaseGrantResponse response;
    absl::Status status =
        Call("LeaseGrant", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
          return e.lease->LeaseGrant(context, request, &response);
        });
    if (!status.ok()) return status;
    if (!response.error().empty()) {
      return absl::FailedPreconditionError(absl::StrCat("etcd LeaseGrant: ", response.error()));
    }
    return Lease{.id = response.id(), .ttl = absl::Seconds(response.ttl())};
  }

  absl::Status RevokeLease(int64_t id, absl::Time deadline) override {
    etcdserverpb::LeaseRevokeRequest request;
    request.set_id(id);
    etcdserverpb::LeaseRevokeResponse response;
    return Call("LeaseRevoke", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
      return e.lease->LeaseRevoke(context, request, &response);
    });
  }

  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t id, absl::Time deadline) override {
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(id);
    etcdserverpb::LeaseKeepAliveResponse response;
    // One short stream per renewal: a synchronous stream has no deadline per
    // message, so a stream kept open would leave a renewal that etcd never
    // answers unbounded; the context's deadline bounds this one.
    absl::Status status =
        Call("LeaseKeepAlive", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
          auto stream = e.lease->LeaseKeepAlive(context);
          if (stream->Write(request) && stream->Read(&response)) {
            context->TryCancel();  // the one answer is all this call reads
            stream->Finish().IgnoreError();
            return grpc::Status::OK;
          }
          return stream->Finish();
        });
    if (!status.ok()) return status;
    if (response.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat("etcd lease ", id, " no longer exists"));
    }
    return absl::Seconds(response.ttl());
  }

  absl::StatusOr<std::vector<mvccpb::Event>> AwaitEvents(absl::string_view key,
                                                         int64_t after_revision,
                                                         absl::Time deadline) override {
    etcdserverpb::WatchRequest request;
    request.mutable_create_request()->set_key(std::string(key));
    request.mutable_create_request()->set_start_revision(after_revision + 1);
    std::vector<mvccpb::Event> events;
    absl::Status outcome;  // what the watch said, apart from the stream's status
    absl::Status status = Call("Watch", deadline, [&](Endpoint& e, grpc::ClientContext* context) {
      auto stream = e.watch->Watch(context);
      if (!stream->Write(request)) return stream->Finish();
      etcdserverpb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.compact_revision() > 0) {
          outcome = absl::OutOfRangeError(
              absl::StrCat("etcd has compacted revision ", after_revision + 1, " of ", key,
                           " away (compacted up to ", response.compact_revision(), ")"));
        } else if (response.canceled()) {
          outcome = absl::AbortedError(
              absl::StrCat("etcd canceled the watch of ", key, ": ", response.cancel_reason()));
        } else if (response.events_size() == 0) {
          continue;  // the watch's creation, or a progress report
        } else {
          events.assign(response.events().begin(), response.events().end());
        }
        context->TryCancel();
        stream->Finish().IgnoreError();
        return grpc::Status::OK;
      }
      return stream->Finish();
    });
    if (!status.ok()) return status;
    if (!outcome.ok()) return outcome;
    return events;
  }

 private:
  using Attempt = std::function<grpc::Status(Endpoint&, grpc::ClientContext*)>;

  // Runs `attempt` against the current endpoint, moving on to the next one
  // and retrying while the answer is UNAVAILABLE and the deadline allows.
  absl::Status Call(absl::string_view method, absl::Time deadline, const Attempt& attempt) {
    absl::Duration backoff = kFirstBackoff;
    for (;;) {
      const size_t index = current_.load(std::memory_order_relaxed);
      Endpoint& endpoint = endpoints_[index % endpoints_.size()];
      grpc::ClientContext context;
      context.set_deadline(ToChrono(deadline));
      const grpc::Status status = attempt(endpoint, &context);
      if (status.ok()) return absl::OkStatus();
      const absl::Status error =
          FromGrpc(status, absl::StrCat("etcd ", endpoint.address, " ", method));
      if (status.error_code() == grpc::StatusCode::UNKNOWN && absl::Now() >= deadline) {
        // etcd ends a call whose (propagated) deadline passed on its side
        // with its context's error, which gRPC-Go sends as UNKNOWN; it can
        // come before our own timer's DEADLINE_EXCEEDED.
        return absl::DeadlineExceededError(error.message());
      }
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return error;
      // The next call starts at the next endpoint too, unless another call
      // has moved on already.
      size_t expected = index;
      current_.compare_exchange_strong(expected, index + 1, std::memory_order_relaxed);
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("etcd unreachable until the deadline; last: ", error.message()));
      }
      spdlog::debug("{}; retrying within {}", error.ToString(), absl::FormatDuration(backoff));
      const absl::Time retry_at = absl::Now() + std::min(backoff, left);
      grpc::Channel& next = *endpoints_[(index + 1) % endpoints_.size()].channel;
      if (next.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
        absl::SleepFor(retry_at - absl::Now());  // etcd itself said UNAVAILABLE (no leader)
      } else {
        // Waiting on the channel, not sleeping: a synchronous client's
        // connection attempt advances only while a thread polls its channel
        // (else gRPC's backup poller finds it seconds later).
        next.WaitForConnected(ToChrono(retry_at));
      }
      backoff = std::min(2 * backoff, kMaxBackoff);
    }
  }

  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const std::vector<std::string>& endpoints) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint given");
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s: a client would then
  // miss an etcd back from a restart for minutes. Membership calls are
  // rare, so trying again within a second costs nothing.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::vector<Endpoint> made;
  for (const std::string& endpoint : endpoints) {
    absl::string_view address = endpoint;
    if (absl::StartsWith(address, "https://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", endpoint, ": TLS is not supported; use http://"));
    }
    if (absl::ConsumePrefix(&address, "http://")) {
      while (absl::ConsumeSuffix(&address, "/")) {
      }
    }
    if (address.empty() || address.find(':') == absl::string_view::npos ||
        address.find('/') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", endpoint, "\" is not host:port or http://host:port"));
    }
    auto channel =
        grpc::CreateCustomChannel(std::string(address), grpc::InsecureChannelCredentials(), args);
    made.push_back(Endpoint{.address = std::string(address),
                            .channel = channel,
                            .kv = etcdserverpb::KV::NewStub(channel),
                            .lease = etcdserverpb::Lease::NewStub(channel),
                            .watch = etcdserverpb::Watch::NewStub(channel)});
  }
  return std::make_unique<GrpcEtcdClient>(std::move(made));
}

}  // namespace pst
