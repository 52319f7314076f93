#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "grpcpp/channel.h"
#include "grpcpp/create_channel.h"
#include "rpc/chunk_wire.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"
#include "rpc/worker_session.h"
#include "spdlog/spdlog.h"
#include "worker/client/backoff.h"
#include "worker/client/shard_channel.h"
#include "worker/client/worker_metrics.h"

namespace pst {
namespace {

// What a message adds to the rows it carries: the header's fields (the
// worker, versions, the pull's settings), and per variable slice its name,
// shape and framing.
constexpr int64_t kMessageFraming = 4096;
constexpr int64_t kSliceFraming = 256;
// A shard whose limits are not known (no Register yet) bounds nothing here;
// far below overflow when budgets are subtracted from it.
constexpr int64_t kNoLimit = int64_t{1} << 60;

}  // namespace

void ShardChannel::PrepareContext(grpc::ClientContext* context, absl::Duration from_now) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + from_now));
  AddProcessSession(context);
}

absl::StatusOr<std::unique_ptr<ShardChannel>> ShardChannel::Connect(
    const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
    const ClusterSecurity& security, const std::vector<std::vector<std::string>>& backups) {
  std::unique_ptr<ShardChannel> client(new ShardChannel(worker));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect to a restarted shard within a second or two, not gRPC's
  // default of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  const bool replicated = std::any_of(backups.begin(), backups.end(),
                                      [](const std::vector<std::string>& b) { return !b.empty(); });
  if (replicated) {
    // A primary cut off by the network answers nothing and closes nothing:
    // without pings a call to it waits for its deadline (minutes), while
    // its backup takes over within a lease. The PS accepts pings this often
    // (StartGrpcServer).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  ConfigureChannel(security, &args);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + connect_timeout;
  for (size_t s = 0; s < addresses.size(); ++s) {
    Shard shard;
    std::vector<std::string> replicas = {addresses[s]};
    if (s < backups.size()) replicas.insert(replicas.end(), backups[s].begin(), backups[s].end());
    for (const std::string& address : replicas) {
      auto endpoint = std::make_unique<Endpoint>();
      endpoint->address = address;
      endpoint->channel = grpc::CreateCustomChannel(address, ChannelCredentials(security), args);
      endpoint->stub = ParameterServer::NewStub(endpoint->channel);
      endpoint->generic = std::make_unique<grpc::GenericStub>(endpoint->channel);
      shard.endpoints.push_back(std::move(endpoint));
    }
    // Any replica will do: Register finds the primary. A wait says so at
    // once and every few seconds: nothing else shows a worker is waiting
    // rather than stuck.
    constexpr absl::Duration kSayEvery = absl::Seconds(5);
    constexpr absl::Duration kTry = absl::Milliseconds(200);
    absl::Time say_at = start;
    bool connected = false;
    while (!connected) {
      for (size_t r = 0; r < shard.endpoints.size() && !connected; ++r) {
        connected = shard.endpoints[r]->channel->WaitForConnected(
            absl::ToChronoTime(std::min(deadline, absl::Now() + kTry)));
        if (connected) shard.at = static_cast<int>(r);
      }
      if (connected || absl::Now() >= deadline) break;
      if (absl::Now() >= say_at) {
        spdlog::info("waiting for ps:{} at {} ({} s so far, up to {} s)", s,
                     absl::StrJoin(replicas, " or "), absl::ToInt64Seconds(absl::Now() - start),
                     absl::ToInt64Seconds(connect_timeout));
        say_at = absl::Now() + kSayEvery;
      }
    }
    if (!connected) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach ps:", s, " at ", absl::StrJoin(replicas, " or "), " within ",
                       absl::FormatDuration(connect_timeout), "; is ps_server running there?",
                       security.ConnectFailureHint()));
    }
    client->shards_.push_back(std::move(shard));
  }
  return client;
}

ShardChannel::Endpoint& ShardChannel::endpoint(int shard) const {
  absl::MutexLock lock(&endpoint_mu_);
  const Shard& at = shards_[shard];
  return *at.endpoints[at.at];
}

const std::string& ShardChannel::address(int shard) const { return endpoint(shard).address; }

absl::Status ShardChannel::PushesAnswered(absl::Status exchange) {
  // Only a whole exchange counts: one that failed after a shard took its
  // push is sent again with the same sequence, and answered DUPLICATE.
  if (!exchange.ok()) return exchange;
  for (Shard& shard : shards_) {
    if (shard.pushes >= 0) ++shard.pushes;
    shard.version_after_failover = -1;
  }
  return exchange;
}

void ShardChannel::TagPush(int s, int64_t computed_at, PushRequest* header) const {
  const int64_t held = shards_[s].version_after_failover;
  header->set_computed_at_version(held >= 0 ? std::min(computed_at, held) : computed_at);
  if (shards_[s].pushes >= 0) header->set_sequence(shards_[s].pushes);
}

void ShardChannel::SetVariables(const std::vector<VariableSpec>& variables) {
  slices_ = PlaceModel(variables, num_shards());
  variable_names_.clear();
  for (const VariableSpec& v : variables) variable_names_.push_back(v.name);
  for (Shard& shard : shards_) shard.slices.clear();
  for (size_t i = 0; i < slices_.size(); ++i) shards_[slices_[i].shard].slices.push_back(i);
}

int ShardChannel::FindEmbeddingTable(absl::string_view name) const {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].name() == name) return static_cast<int>(t);
  }
  return -1;
}

absl::StatusOr<std::optional<RowSplit>> ShardChannel::SplitRows(std::span<const RowGradients> push,
                                                            std::span<const RowValues> pull,
                                                            bool pushes) const {
  if (push.empty() && pull.empty() && (!pushes || tables_.empty())) return std::nullopt;
  PST_ASSIGN_OR_RETURN(RowSplit split, RowSplit::Make(tables_, num_shards(), wire_dtype_, push,
                                                      pull, /*push_every_table=*/pushes));
  for (int s = 0; s < num_shards(); ++s) {
    const Shard& shard = shards_[s];
    const int64_t max_request = shard.max_request_bytes > 0 ? shard.max_request_bytes : kNoLimit;
    const int64_t max_reply = shard.max_reply_bytes > 0 ? shard.max_reply_bytes : kNoLimit;
    const int64_t push_bytes = split.push_rows_bytes(s);
    if (push_bytes > max_request) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ps:", s, " (", address(s), "): the rows this push carries to it (", push_bytes,
          " bytes) are more than it takes in one request (", shard.max_request_bytes,
          " bytes, ps_server --max_message_bytes); a push is one update and is not pieced: "
          "use a smaller batch or more PS shards, or raise --max_message_bytes"));
    }
    if (!split.pulls()) continue;
    // What else the exchange's first message carries: its header, one
    // chunk of a dense push, and, in a 16-bit wire type, the dense answer
    // (the shard encodes it beside the rows).
    const int64_t framing =
        kMessageFraming + kSliceFraming * static_cast<int64_t>(shard.slices.size());
    const int64_t dense_pushed = pushes ? std::min(kChunkBytes, WireBytes(s)) : 0;
    const int64_t dense_answered = DTypeBytes(wire_dtype_) != sizeof(float) ? WireBytes(s) : 0;
    // The ids one call names are bounded by count as well as by bytes.
    const int64_t max_ids_bytes = shard.max_rows_per_pull > 0
                                      ? shard.max_rows_per_pull * int64_t{sizeof(uint64_t)}
                                      : kNoLimit;
    const RowSplit::PullBudget first{
        .request_bytes =
            std::min(max_ids_bytes, max_request - framing - push_bytes - dense_pushed),
        .reply_bytes = max_reply - framing - dense_answered};
    const RowSplit::PullBudget rest{
        .request_bytes = std::min(max_ids_bytes, max_request - kMessageFraming),
        .reply_bytes = max_reply - kMessageFraming};
    if (absl::Status pieced = split.PieceOutPull(s, first, rest); !pieced.ok()) {
      return absl::Status(pieced.code(),
                          absl::StrCat("ps:", s, " (", address(s), "): ", pieced.message()));
    }
  }
  return split;
}

absl::Status ShardChannel::PullRemainingRows(RowSplit* split, const std::vector<int64_t>& versions,
                                         absl::Duration timeout) {
  static const std::vector<std::span<float>> kNoVariables;
  int parts = 0;
  for (int s = 0; s < num_shards(); ++s) parts = std::max(parts, split->pull_parts(s));
  std::vector<int64_t> answered(shards_.size());
  for (int part = 1; part < parts; ++part) {
    std::vector<ShardExchange> exchanges;
    for (int s = 0; s < num_shards(); ++s) {
      if (split->pull_parts(s) <= part) continue;
      ShardExchange& exchange = exchanges.emplace_back();
      exchange.shard = s;
      exchange.rows_part = part;
      exchange.rows = split;
      exchange.pull = MakePullRequest(s, versions[s], timeout);
      exchange.pull->set_rows_only(true);
      split->MovePullRows(s, part, &*exchange.pull);
      exchange.out = &kNoVariables;
      exchange.version = &answered[s];
    }
    PST_RETURN_IF_ERROR(RunExchanges(exchanges));
  }
  return absl::OkStatus();
}

void ShardChannel::AttachRows(std::optional<RowSplit>& split, std::vector<ShardExchange>* exchanges) {
  if (!split) return;
  for (ShardExchange& exchange : *exchanges) {
    exchange.rows = &*split;
    if (exchange.pull) split->MovePullRows(exchange.shard, /*part=*/0, &*exchange.pull);
  }
}

absl::Status ShardChannel::ShardError(int shard, const grpc::Status& status) const {
  return ShardError(shard, FromGrpcStatus(status));
}

namespace {

// Marks an error as a shard's answer (the value: the shard's index).
constexpr char kShardAnswerPayload[] = "type.pstrain/shard_answer";

}  // namespace

bool NamesItsShard(const absl::Status& status) {
  return status.GetPayload(kShardAnswerPayload).has_value();
}

std::optional<TransientRefusal> TransientRefusalOf(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  if (std::optional<TransientRefusal> marked = MarkedTransient(status)) return marked;
  if (absl::IsUnavailable(status)) return TransientRefusal::kRestarting;
  if (absl::IsCancelled(status) && NamesItsShard(status)) return TransientRefusal::kRestarting;
  return std::nullopt;
}

absl::Status ShardChannel::ShardError(int shard, const absl::Status& status) const {
  absl::Status answer =
      Reworded(status, absl::StrCat("ps:", shard, " (", address(shard), "): ", status.message()));
  answer.SetPayload(kShardAnswerPayload, absl::Cord(absl::StrCat(shard)));
  return answer;
}

absl::Status ShardChannel::Patiently(absl::FunctionRef<absl::Status()> call) {
  absl::Status status = call();
  if (status.ok() || !IsTransientShardError(status) || call_patience_ <= absl::ZeroDuration()) {
    return status;
  }
  Retry retry = NewRetry(call_patience_, worker_);
  while (!status.ok() && IsTransientShardError(status)) {
    PST_RETURN_IF_ERROR(BackOff(status, &retry));
    status = call();
  }
  return status;
}

absl::Status ShardChannel::ForEachShard(absl::FunctionRef<absl::Status(int)> call) {
  std::vector<absl::Status> results(shards_.size());
  std::vector<ThreadPool::Task> tasks;
  for (size_t s = 1; s < shards_.size(); ++s) {
    tasks.push_back(threads_.Start([&, s] { results[s] = call(static_cast<int>(s)); }));
  }
  results[0] = call(0);
  for (ThreadPool::Task& task : tasks) task.Wait();
  for (absl::Status& status : results) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardChannel::Init(const std::vector<std::span<const float>>& values,
                                        std::span<const RowGradients> initial_rows) {
  if (tables_.empty()) PST_RETURN_IF_ERROR(CheckEveryShardHoldsASlice(slices_, num_shards()));
  std::optional<RowSplit> seeds;
  if (!initial_rows.empty()) {
    PST_ASSIGN_OR_RETURN(seeds, RowSplit::Make(tables_, num_shards(), FLOAT32, initial_rows, {},
                                               /*push_every_table=*/false));
  }
  std::vector<InitResponse> responses(shards_.size());
  PST_RETURN_IF_ERROR(ForEachShard([&](int s) {
    InitRequest request;
    request.set_worker(worker_);
    request.mutable_embeddings()->Assign(tables_.begin(), tables_.end());
    if (dense_optimizer_.has_value()) *request.mutable_optimizer() = *dense_optimizer_;
    if (seeds.has_value()) *request.mutable_rows() = *seeds->push_rows(s);
    for (size_t i : shards_[s].slices) {
      const VariableSlice& slice = slices_[i];
      EncodeTensor(slice.name, slice.shape, values[slice.variable].subspan(slice.offset, slice.count),
                   request.add_variables());
    }
    return Patiently([&]() -> absl::Status {
      grpc::ClientContext context;
      PrepareContext(&context, kRpcDeadline);
      grpc::Status rpc = endpoint(s).stub->Init(&context, request, &responses[s]);
      // Init is the one call that carries a shard's whole share at once, so
      // a RESOURCE_EXHAUSTED the shard did not mark as an overload
      // (common/transient_refusal.h) is gRPC's refusal of a message over
      // its size limit: about the share. A marked one (the shard busy with
      // other Inits) is the shard's to explain, in its own words.
      if (rpc.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          !MarkedTransient(FromGrpcStatus(rpc)).has_value()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "ps:", s, " (", address(s), "): its share of the model (", request.ByteSizeLong(),
            " bytes) is more than it accepts in one request; raise "
            "ps_server --max_message_bytes or spread the model over more PS shards (",
            rpc.error_message(), ")"));
      }
      return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
    });
  }));
  return responses[0].accepted();
}

int64_t ShardChannel::WireBytes(int shard) const {
  int64_t bytes = 0;
  for (size_t i : shards_[shard].slices) bytes += slices_[i].count * DTypeBytes(wire_dtype_);
  return bytes;
}

absl::Status ShardChannel::Pull(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                            const std::vector<std::span<float>>& out,
                            std::vector<int64_t>* versions, std::span<const RowValues> rows) {
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split, SplitRows({}, rows, /*pushes=*/false));
  versions->resize(shards_.size());
  std::vector<ShardExchange> exchanges(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    ShardExchange& exchange = exchanges[s];
    exchange.shard = static_cast<int>(s);
    exchange.pull = MakePullRequest(s, min_versions[s], timeout);
    for (size_t i : shards_[s].slices) exchange.pull->add_names(slices_[i].name);
    exchange.out = &out;
    exchange.version = &(*versions)[s];
  }
  AttachRows(split, &exchanges);
  PST_RETURN_IF_ERROR(RunExchanges(exchanges));
  return split ? PullRemainingRows(&*split, *versions, timeout) : absl::OkStatus();
}

absl::Status ShardChannel::PullRows(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                                std::span<const RowValues> rows, std::vector<int64_t>* versions) {
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split, SplitRows({}, rows, /*pushes=*/false));
  static const std::vector<std::span<float>> kNoVariables;
  versions->resize(shards_.size());
  std::vector<ShardExchange> exchanges(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    ShardExchange& exchange = exchanges[s];
    exchange.shard = static_cast<int>(s);
    exchange.pull = MakePullRequest(s, min_versions[s], timeout);
    exchange.pull->set_rows_only(true);
    exchange.out = &kNoVariables;
    exchange.version = &(*versions)[s];
  }
  AttachRows(split, &exchanges);
  PST_RETURN_IF_ERROR(RunExchanges(exchanges));
  return split ? PullRemainingRows(&*split, *versions, timeout) : absl::OkStatus();
}

PullRequest ShardChannel::MakePullRequest(int s, int64_t min_version,
                                          absl::Duration timeout) const {
  PullRequest request;
  request.set_worker(worker_);
  // After a failover the read waits for no more than the step the new
  // primary makes next: a primary that went on from its checkpoint holds
  // less than this worker saw, and the versions it lost do not come back.
  const int64_t held = shards_[s].version_after_failover;
  request.set_min_version(held >= 0 ? std::min(min_version, held + 1) : min_version);
  request.set_timeout_ms(static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  request.set_dtype(wire_dtype_);
  return request;
}

absl::Status ShardChannel::Push(const std::vector<int64_t>& computed_at,
                            const std::vector<std::span<const float>>& gradients,
                            std::vector<PushResponse>* responses,
                            std::span<const RowGradients> rows) {
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split, SplitRows(rows, {}, /*pushes=*/true));
  responses->resize(shards_.size());
  std::vector<ShardExchange> exchanges(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    ShardExchange& exchange = exchanges[s];
    exchange.shard = static_cast<int>(s);
    exchange.computed_at = computed_at[s];
    exchange.gradients = &gradients;
    exchange.response = &(*responses)[s];
  }
  AttachRows(split, &exchanges);
  return PushesAnswered(RunExchanges(exchanges));
}

absl::Status ShardChannel::PushRows(const std::vector<int64_t>& computed_at,
                                std::span<const RowGradients> rows,
                                std::vector<PushResponse>* responses) {
  if (tables_.empty()) {
    return absl::FailedPreconditionError("a push of rows in a model without embedding tables");
  }
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split, SplitRows(rows, {}, /*pushes=*/true));
  responses->resize(shards_.size());
  std::vector<ShardExchange> exchanges(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    ShardExchange& exchange = exchanges[s];
    exchange.shard = static_cast<int>(s);
    exchange.computed_at = computed_at[s];
    exchange.response = &(*responses)[s];
  }
  AttachRows(split, &exchanges);
  return PushesAnswered(RunExchanges(exchanges));
}

absl::Status ShardChannel::PushPull(const std::vector<int64_t>& computed_at,
                                const std::vector<std::span<const float>>& gradients,
                                const std::vector<int64_t>& min_versions, absl::Duration timeout,
                                const std::vector<std::span<float>>& out,
                                std::vector<int64_t>* versions,
                                std::vector<PushResponse>* responses, const StepRows& rows) {
  PST_ASSIGN_OR_RETURN(std::optional<RowSplit> split,
                       SplitRows(rows.push, rows.pull, /*pushes=*/true));
  versions->resize(shards_.size());
  responses->resize(shards_.size());
  std::vector<ShardExchange> exchanges(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    ShardExchange& exchange = exchanges[s];
    exchange.shard = static_cast<int>(s);
    exchange.computed_at = computed_at[s];
    exchange.gradients = &gradients;
    // No names: an exchange that pushes answers with the pushed variables.
    exchange.pull = MakePullRequest(s, min_versions[s], timeout);
    exchange.out = &out;
    exchange.version = &(*versions)[s];
    exchange.response = &(*responses)[s];
  }
  AttachRows(split, &exchanges);
  PST_RETURN_IF_ERROR(RunExchanges(exchanges));
  return PushesAnswered(split ? PullRemainingRows(&*split, *versions, timeout) : absl::OkStatus());
}

}  // namespace pst
