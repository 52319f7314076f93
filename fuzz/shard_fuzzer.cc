// One ParameterShard driven by a sequence of RPCs read from the fuzzer's
// input (layout in fuzz/shard_input.h). After every call the shard must
// still keep its promises:
//  - every variable value it holds or serves as float32 is finite;
//  - its version never decreases, and a push moves it by one exactly when
//    the push says APPLIED (or SKIPPED: a SYNC step that would have overflowed);
//  - a refused call leaves the variables, their optimizer state and the
//    version untouched;
//  - a pull answers with the requested variables at the current version,
//    each payload the size its shape and dtype say, and with the rows it
//    names, each table's the size its ids, dim and dtype say;
//  - every value the shard holds is finite, the embedding rows' too, and a
//    table never holds more rows than its limit;
//  - version == pushes applied, and Snapshot -> Restore -> Snapshot is exact.
// A broken promise is reported on stderr and ends the run with a trap.
// With SHARD_FUZZER_TRACE set, each call and its outcome go to stderr, to
// read what a reproducer does: SHARD_FUZZER_TRACE=1 shard_fuzzer crash-...
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/push_outcome.h"
#include "common/tensor_codec.h"
#include "fuzz/shard_input.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst::fuzz {
namespace {

#define SHARD_INVARIANT(cond)                                                \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "shard_fuzzer: invariant broken at %s:%d: %s\n",  \
                   __FILE__, __LINE__, #cond);                               \
      __builtin_trap();                                                      \
    }                                                                        \
  } while (0)

// Reads the input front to back; reads past the end give zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return pos_ < size_ ? size_ - pos_ : 0; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // The next `n` bytes, or fewer where the input ends.
  std::span<const uint8_t> Bytes(size_t n) {
    n = std::min(n, size_ - std::min(pos_, size_));
    std::span<const uint8_t> out(data_ + pos_, n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

ShardOptions OptionsFrom(uint8_t a, uint8_t b) {
  static constexpr Mode kModes[] = {SYNC, ASYNC, SSP, SYNC};
  ShardOptions options;
  options.mode = kModes[a & 3];
  options.num_workers = ((a >> 2) & 3) + 1;
  // The shortest lease: it runs out at the next tick of the driver's clock
  // (CheckStats), so workers leave the live set between calls.
  options.lease = (a & 0x20) ? absl::Nanoseconds(1) : absl::Seconds(5);
  options.staleness_lr_scaling = (a & 0x40) != 0;
  options.snapshot_every_steps = (a & 0x80) ? 2 : 0;
  switch (b & 3) {
    case 0: options.optimizer.mutable_sgd()->set_learning_rate(0.5f); break;
    case 1:
      options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
      options.optimizer.mutable_sgd()->set_momentum(0.9f);
      options.optimizer.mutable_sgd()->set_nesterov(true);
      break;
    case 2: options.optimizer.mutable_adam()->set_learning_rate(0.01f); break;
    case 3:
      options.optimizer.mutable_adagrad()->set_learning_rate(0.1f);
      options.optimizer.set_decay_rate(0.5f);
      options.optimizer.set_decay_steps(3);
      break;
  }
  options.replicas_to_aggregate = std::min<int>((b >> 2) & 3, options.num_workers);
  options.max_staleness = (b >> 4) & 3;
  options.staleness = (b >> 6) & 3;
  return options;
}

InitRequest StructuredInit() {
  InitRequest request;
  const float w[] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f};
  const float b[] = {0.0f, 0.25f, -0.25f};
  EncodeTensor("w", kWeightShape, w, request.add_variables());
  EncodeTensor("b", kBiasShape, b, request.add_variables());
  EmbeddingTableConfig* e = request.add_embeddings();
  e->set_name("e");
  e->set_dim(kRowsDimE);
  EmbeddingTableConfig* f = request.add_embeddings();
  f->set_name("f");
  f->set_dim(kRowsDimF);
  f->set_max_rows_per_shard(kRowsLimitF);
  return request;
}

// One byte per id (see kPushRows), little-endian uint64 each.
std::string RowIds(std::span<const uint8_t> ids) {
  std::string out;
  for (uint8_t id : ids) {
    const uint64_t wide = id;
    out.append(reinterpret_cast<const char*>(&wide), sizeof(wide));
  }
  return out;
}

// One gradient tensor of a structured push, from the payload's bytes.
void FillGradient(const std::string& name, std::span<const int64_t> shape, DType dtype,
                  uint8_t flags, Input& bytes, Tensor* out) {
  const int64_t elements = NumElements(shape);
  if (flags & 0x10) {
    out->set_name(name);
    out->set_dtype(dtype);
    std::span<const uint8_t> raw = bytes.Bytes(elements * DTypeBytes(dtype));
    out->set_data(reinterpret_cast<const char*>(raw.data()), raw.size());
  } else {
    std::vector<float> values(elements);
    for (float& v : values) v = static_cast<float>(static_cast<int8_t>(bytes.Byte())) / 16.0f;
    EncodeTensor(name, shape, values, out, dtype);
  }
  if (!(flags & 0x08)) out->clear_shape();
}

class ShardDriver {
 public:
  ShardDriver(ShardOptions options, std::unique_ptr<ParameterShard> shard,
              ManualLeaseClock* clock)
      : options_(std::move(options)), shard_(std::move(shard)), clock_(clock) {
    state_ = State();
  }

  void Run(Op op, Input& payload) {
    if (trace_) std::fprintf(stderr, "op %d, %zu payload bytes\n", op, payload.remaining());
    switch (op) {
      case kInit: {
        InitRequest request;
        if (Parse(payload, &request)) Init(request);
        break;
      }
      case kPush: {
        PushRequest request;
        if (Parse(payload, &request)) Push(request);
        break;
      }
      case kPull: {
        PullRequest request;
        if (Parse(payload, &request)) Pull(request);
        break;
      }
      case kHeartbeat: {
        HeartbeatRequest request;
        HeartbeatResponse response;
        if (!Parse(payload, &request)) break;
        absl::Status s = shard_->Heartbeat(request, &response);
        AfterCall(s, s.ok() ? response.version() : last_version_);
        break;
      }
      case kDone: {
        DoneRequest request;
        DoneResponse response;
        if (!Parse(payload, &request)) break;
        absl::Status s = shard_->Done(request, &response);
        if (s.ok()) SHARD_INVARIANT(response.workers_done() <= options_.num_workers);
        AfterCall(s, last_version_);
        break;
      }
      case kRegister: {
        RegisterRequest request;
        RegisterResponse response;
        if (!Parse(payload, &request)) break;
        absl::Status s = shard_->Register(request, &response);
        AfterCall(s, s.ok() ? response.version() : last_version_);
        break;
      }
      case kStats: CheckStats(); break;
      case kPushValues: {
        uint8_t flags = 0;
        PushRequest request = StructuredPush(payload, &flags);
        if (flags & 0x20) {
          StreamedPush(request, (flags >> 6) + 1);
        } else {
          Push(request);
        }
        break;
      }
      case kPullValues: Pull(StructuredPull(payload)); break;
      case kPushRows: Push(StructuredRowPush(payload)); break;
      case kPullRows: Pull(StructuredRowPull(payload)); break;
      case kSnapshotRoundTrip: CheckRoundTrip(); break;
      case kTakeSnapshot: {
        std::optional<ShardCheckpoint> snapshot = shard_->TakeScheduledSnapshot(absl::Now());
        if (snapshot) {
          SHARD_INVARIANT(options_.snapshot_every_steps > 0);
          SHARD_INVARIANT(snapshot->version() % options_.snapshot_every_steps == 0);
          SHARD_INVARIANT(snapshot->version() <= shard_->version());
          CheckValuesFinite(*snapshot);
        }
        break;
      }
      case kShutdown: shard_->BeginShutdown(); break;
      default: break;
    }
  }

  void Init(const InitRequest& request) {
    InitResponse response;
    absl::Status s = shard_->Init(request, &response);
    AfterCall(s, s.ok() ? response.version() : last_version_);
  }

 private:
  template <typename Message>
  static bool Parse(Input& payload, Message* message) {
    std::span<const uint8_t> bytes = payload.Bytes(SIZE_MAX);
    return message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  }

  PushRequest StructuredPush(Input& p, uint8_t* flags_out) {
    PushRequest request;
    request.set_worker(p.Byte() % (options_.num_workers + 1));
    const uint8_t version = p.Byte();
    request.set_computed_at_version((version & 0x80) ? last_version_ + 1
                                                     : last_version_ - (version & 3));
    const uint8_t flags = p.Byte();
    *flags_out = flags;
    const DType dtype = static_cast<DType>(flags & 3);
    FillGradient("w", kWeightShape, dtype, flags, p, request.add_gradients());
    if (!(flags & 0x04)) FillGradient("b", kBiasShape, dtype, flags, p, request.add_gradients());
    return request;
  }

  PullRequest StructuredPull(Input& p) {
    PullRequest request;
    request.set_worker(p.Byte() % (options_.num_workers + 1));
    request.set_dtype(static_cast<DType>(p.Byte() % 4));
    request.set_min_version(last_version_ + p.Byte() % 3 - 1);
    static const char* const kNames[] = {nullptr, "w", "b", "x"};
    if (const char* name = kNames[p.Byte() % 4]) request.add_names(name);
    return request;
  }

  PushRequest StructuredRowPush(Input& p) {
    PushRequest request;
    request.set_worker(p.Byte() % (options_.num_workers + 1));
    const uint8_t version = p.Byte();
    request.set_computed_at_version((version & 0x80) ? last_version_ + 1
                                                     : last_version_ - (version & 3));
    const uint8_t flags = p.Byte();
    const DType dtype = static_cast<DType>(flags & 3);
    const bool f = (flags & 0x04) != 0;
    std::span<const uint8_t> ids = p.Bytes(p.Byte() % 9);
    EmbeddingRows* rows = request.add_rows();
    rows->set_table((flags & 0x80) ? "x" : f ? "f" : "e");
    rows->set_dtype(dtype);
    std::string id_bytes = RowIds(ids);
    if (flags & 0x10) id_bytes.resize(id_bytes.size() > 3 ? id_bytes.size() - 3 : 0);
    rows->set_ids(id_bytes);
    const int width = (f ? kRowsDimF : kRowsDimE) + ((flags & 0x20) ? 1 : 0);
    const size_t values = ids.size() * width;
    if (flags & 0x08) {
      std::span<const uint8_t> raw = p.Bytes(values * std::max(DTypeBytes(dtype), 1));
      rows->set_data(reinterpret_cast<const char*>(raw.data()), raw.size());
    } else {
      std::vector<float> small(values);
      for (float& v : small) v = static_cast<float>(static_cast<int8_t>(p.Byte())) / 16.0f;
      EncodeValues(small, dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype, rows->mutable_data());
    }
    if (flags & 0x40) {
      FillGradient("w", kWeightShape, FLOAT32, 0x08, p, request.add_gradients());
      FillGradient("b", kBiasShape, FLOAT32, 0x08, p, request.add_gradients());
    }
    return request;
  }

  PullRequest StructuredRowPull(Input& p) {
    PullRequest request;
    request.set_worker(p.Byte() % (options_.num_workers + 1));
    request.set_dtype(static_cast<DType>(p.Byte() % 4));
    const uint8_t flags = p.Byte();
    request.set_min_version(last_version_ + (flags >> 4) % 3 - 1);
    const std::string ids = RowIds(p.Bytes(p.Byte() % 9));
    const bool f = (flags & 0x01) != 0;
    EmbeddingRows* rows = request.add_rows();
    rows->set_table((flags & 0x02) ? "x" : f ? "f" : "e");
    rows->set_ids(ids);
    if (flags & 0x08) {
      EmbeddingRows* other = request.add_rows();
      other->set_table(f ? "e" : "f");
      other->set_ids(ids);
    }
    request.set_rows_only((flags & 0x04) != 0);
    return request;
  }

  void Push(const PushRequest& request) {
    PushResponse response;
    const int64_t before = last_version_;
    absl::Status s = pst::Push(*shard_, request, &response);
    if (trace_) std::fprintf(stderr, "  push outcome %d\n", response.outcome());
    if (s.ok()) {
      SHARD_INVARIANT(response.outcome() != PushResponse::OUTCOME_UNSPECIFIED);
      SHARD_INVARIANT(response.version() == shard_->version());
      const int64_t advanced = response.version() - before;
      SHARD_INVARIANT(advanced == (AdvancedTheVersion(response.outcome()) ? 1 : 0));
      if (options_.mode != SYNC) SHARD_INVARIANT(response.outcome() != PushResponse::AGGREGATED);
    }
    AfterCall(s, s.ok() ? response.version() : last_version_);
  }

  // `request` as an exchange delivers it, in pieces of `piece` elements:
  // applied as it streams in when the shard allows, which must end exactly
  // as Push on a copy of the shard does (state, status, response), or
  // reassembled and pushed.
  void StreamedPush(const PushRequest& request, int piece) {
    const ShardCheckpoint before = shard_->Snapshot();
    PushRequest header = request;
    for (Tensor& t : *header.mutable_gradients()) t.clear_data();
    absl::StatusOr<ParameterShard::StreamedPush> push = shard_->BeginStreamedPush(header);
    if (!push.ok()) {
      AfterCall(push.status(), last_version_);
      return;
    }
    if (push->update == nullptr) {
      Push(request);
      return;
    }
    // The stream receiver's own checks: sizes and finiteness, piece by piece.
    std::vector<std::vector<float>> gradients;
    for (int i = 0; i < request.gradients_size(); ++i) {
      const Tensor& t = request.gradients(i);
      if (static_cast<int64_t>(t.data().size()) != push->bytes[i] ||
          !EncodedFinite(t.data(), t.dtype())) {
        push->update.reset();  // the receiver drops the stream
        shard_->CountRejectedPush();
        AfterCall(absl::InvalidArgumentError("bad piece"), last_version_);
        return;
      }
      gradients.emplace_back(push->bytes[i] / DTypeBytes(t.dtype()));
      DecodeTensor(t, gradients.back());
    }
    for (size_t i = 0; i < gradients.size(); ++i) {
      const std::span<const float> all(gradients[i]);
      for (size_t first = 0; first < all.size(); first += piece) {
        push->update->Apply(static_cast<int>(i), static_cast<int64_t>(first),
                            all.subspan(first, std::min<size_t>(piece, all.size() - first)));
      }
    }
    PushResponse response;
    absl::Status s = shard_->CommitStreamedPush(std::move(push->update), &response);
    absl::StatusOr<std::unique_ptr<ParameterShard>> reference = ParameterShard::Create(options_);
    SHARD_INVARIANT(reference.ok());
    SHARD_INVARIANT((*reference)->Restore(before).ok());
    PushResponse expected;
    absl::Status e = pst::Push(**reference, request, &expected);
    if (trace_) std::fprintf(stderr, "  streamed: %s; as a push: %s\n", s.ToString().c_str(),
                             e.ToString().c_str());
    SHARD_INVARIANT(s.code() == e.code());
    if (s.ok()) {
      SHARD_INVARIANT(response.outcome() == expected.outcome());
      SHARD_INVARIANT(response.version() == expected.version());
      SHARD_INVARIANT(response.version() == shard_->version());
    }
    SHARD_INVARIANT(shard_->Snapshot().SerializeAsString() ==
                    (*reference)->Snapshot().SerializeAsString());
    AfterCall(s, s.ok() ? response.version() : last_version_);
  }

  void Pull(const PullRequest& request) {
    PullResponse response;
    absl::Status s = pst::Pull(*shard_, request, absl::Now(), &response);
    if (s.ok()) {
      SHARD_INVARIANT(response.version() == shard_->version());
      SHARD_INVARIANT(response.version() >= request.min_version());
      if (request.names_size() > 0) {
        SHARD_INVARIANT(response.variables_size() == request.names_size());
      }
      for (int i = 0; i < response.variables_size(); ++i) {
        const Tensor& t = response.variables(i);
        if (request.names_size() > 0) SHARD_INVARIANT(t.name() == request.names(i));
        const int64_t elements =
            NumElements({t.shape().data(), static_cast<size_t>(t.shape_size())});
        SHARD_INVARIANT(CheckTensorPayload(t, elements).ok());
        const DType wanted = request.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : request.dtype();
        SHARD_INVARIANT(t.dtype() == wanted);
        // 16-bit wire types round large finite values to infinity by design;
        // float32 is the shard's own value.
        if (wanted == FLOAT32) {
          std::vector<float> values(elements);
          DecodeTensor(t, values);
          for (float v : values) SHARD_INVARIANT(std::isfinite(v));
        }
      }
      SHARD_INVARIANT(response.rows_size() == request.rows_size());
      for (int i = 0; i < response.rows_size(); ++i) {
        const EmbeddingRows& rows = response.rows(i);
        SHARD_INVARIANT(rows.table() == request.rows(i).table());
        const int dim = rows.table() == "f" ? kRowsDimF : kRowsDimE;
        const size_t count = request.rows(i).ids().size() / sizeof(uint64_t);
        const DType wanted = request.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : request.dtype();
        SHARD_INVARIANT(rows.data().size() == count * dim * DTypeBytes(wanted));
        SHARD_INVARIANT(wanted != FLOAT32 || EncodedFinite(rows.data(), FLOAT32));
      }
    }
    AfterCall(s, s.ok() ? response.version() : last_version_);
  }

  // `seen_version` is the version the call reported (or the last one known).
  void AfterCall(const absl::Status& status, int64_t seen_version) {
    if (trace_) {
      std::fprintf(stderr, "  -> %s; version %lld\n", status.ToString().c_str(),
                   static_cast<long long>(shard_->version()));
    }
    SHARD_INVARIANT(seen_version >= last_version_);
    std::string state = State();
    if (!status.ok()) SHARD_INVARIANT(state == state_);
    state_ = std::move(state);
  }

  // The shard's checkpointable state, after checking its invariants.
  std::string State() {
    ShardCheckpoint snapshot = shard_->Snapshot();
    SHARD_INVARIANT(snapshot.version() >= last_version_);
    last_version_ = snapshot.version();
    CheckValuesFinite(snapshot);
    return snapshot.SerializeAsString();
  }

  static void CheckValuesFinite(const ShardCheckpoint& snapshot) {
    for (const ShardCheckpoint::Variable& v : snapshot.variables()) {
      SHARD_INVARIANT(v.values().size() % sizeof(float) == 0);
      SHARD_INVARIANT(EncodedFinite(v.values(), FLOAT32));
    }
    for (const ShardCheckpoint::Embedding& e : snapshot.embeddings()) {
      SHARD_INVARIANT(e.values().size() % sizeof(float) == 0);
      SHARD_INVARIANT(EncodedFinite(e.values(), FLOAT32));
      const int64_t rows = static_cast<int64_t>(e.ids().size() / sizeof(uint64_t));
      SHARD_INVARIANT(rows <= e.config().max_rows_per_shard());
      SHARD_INVARIANT(e.values().size() == rows * e.config().dim() * sizeof(float));
    }
  }

  void CheckStats() {
    // A moment passes: a zero lease runs out for every worker not in a call,
    // which can complete a SYNC step. Waits until the lease tracker has
    // acted on the new time (it is back asleep), so the state read after is
    // the state.
    clock_->Advance(absl::Nanoseconds(1));
    while (clock_->sleepers() < 1) std::this_thread::yield();
    StatsResponse stats;
    shard_->Stats(&stats);
    SHARD_INVARIANT(stats.version() >= last_version_);
    // Nothing is restored into this shard: the version counts applied steps.
    SHARD_INVARIANT(stats.version() == stats.pushes_applied());
    SHARD_INVARIANT(stats.workers_size() == options_.num_workers);
    SHARD_INVARIANT(stats.live_workers() >= 0 && stats.live_workers() <= options_.num_workers);
    SHARD_INVARIANT(stats.workers_done() <= options_.num_workers);
    SHARD_INVARIANT(stats.clock_spread() >= 0);
    AfterCall(absl::OkStatus(), stats.version());
  }

  void CheckRoundTrip() {
    const ShardCheckpoint snapshot = shard_->Snapshot();
    if (snapshot.variables_size() == 0) return;
    absl::StatusOr<std::unique_ptr<ParameterShard>> fresh = ParameterShard::Create(options_);
    SHARD_INVARIANT(fresh.ok());
    SHARD_INVARIANT((*fresh)->Restore(snapshot).ok());
    SHARD_INVARIANT((*fresh)->Snapshot().SerializeAsString() == snapshot.SerializeAsString());
    SHARD_INVARIANT((*fresh)->version() == snapshot.version());
  }

  const ShardOptions options_;
  std::unique_ptr<ParameterShard> shard_;
  ManualLeaseClock* const clock_;
  int64_t last_version_ = 0;
  std::string state_;
  const bool trace_ = std::getenv("SHARD_FUZZER_TRACE") != nullptr;
};

}  // namespace
}  // namespace pst::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pst::fuzz;
  Input input(data, size);
  const uint8_t a = input.Byte();
  const uint8_t b = input.Byte();
  // Leases run on a clock that moves only when the driver says (CheckStats),
  // so nothing changes the shard between calls.
  pst::ManualLeaseClock clock;
  pst::ShardOptions options = OptionsFrom(a, b);
  options.lease_clock = &clock;
  absl::StatusOr<std::unique_ptr<pst::ParameterShard>> shard = pst::ParameterShard::Create(options);
  SHARD_INVARIANT(shard.ok());
  ShardDriver driver(options, std::move(*shard), &clock);
  if (a & 0x10) driver.Init(StructuredInit());
  while (!input.empty()) {
    const Op op = static_cast<Op>(input.Byte() % kOpCount);
    const size_t length = input.Byte() | (size_t{input.Byte()} << 8);
    std::span<const uint8_t> bytes = input.Bytes(length);
    Input payload(bytes.data(), bytes.size());
    driver.Run(op, payload);
  }
  return 0;
}
