// A backup shard fed its primary's updates, each one possibly corrupted as
// the fuzzer's input says (ps_server/core/parameter_shard.h, "Replicas").
// The primary is trained once, at start: a dense variable and an evicting
// Adagrad table, 12 ASYNC pushes, each update it forwards kept. Then each
// input picks updates and what to break in them (epoch, versions, sizes,
// a byte of the payload, a value made NaN, a table renamed or dropped,
// a whole state made a delta and back, a worker named done that the job
// has or has not), or cuts it into pieces (ps_server/service/
// replica_pieces.h) and breaks the sequence (a piece dropped, repeated or
// moved, a total or offset changed), which a backup's assembly takes
// before the backup applies what comes out. After every call the backup must
// keep its promises:
//  - applied: it is at the update's version and every value it holds is
//    finite;
//  - refused while it held a state (the answer's version is not -1): its
//    state, version included, is what it was;
//  - it never crashes, whatever the update.
// A broken promise is reported on stderr and ends the run with a trap.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/replica_pieces.h"
#include "spdlog/spdlog.h"

namespace pst::fuzz {
namespace {

#define REPLICA_INVARIANT(cond)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "replica_fuzzer: invariant broken at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                        \
      __builtin_trap();                                                                           \
    }                                                                                             \
  } while (0)

constexpr int kDim = 4;

ShardOptions Options(int replica) {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.seed = 3;
  options.optimizer.mutable_adagrad()->set_learning_rate(0.1f);
  options.replicas = 2;
  options.replica = replica;
  return options;
}

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

// The primary's updates for its backup: the state whole, then one per push.
std::vector<ReplicaUpdate> TrainPrimary() {
  std::unique_ptr<ParameterShard> primary = *ParameterShard::Create(Options(0));
  InitRequest init;
  EncodeTensor("b", std::vector<int64_t>{3}, std::vector<float>{0, 1, 2}, init.add_variables());
  EmbeddingTableConfig* table = init.add_embeddings();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_max_rows_per_shard(6);
  InitResponse inited;
  REPLICA_INVARIANT(primary->Init(init, &inited).ok());
  std::vector<ReplicaUpdate> updates;
  auto take = [&] {
    absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> taken =
        primary->TakeReplicaUpdates(1, absl::Now());
    REPLICA_INVARIANT(taken.ok());
    for (const auto& update : *taken) {
      primary->ReplicaAcked(1, update->state().version());
      updates.push_back(*update);
    }
  };
  take();
  for (int step = 0; step < 12; ++step) {
    PushRequest push;
    push.set_worker(0);
    push.set_computed_at_version(primary->version());
    EncodeTensor("b", std::vector<int64_t>{3}, std::vector<float>{0.5f, -1, float(step)},
                 push.add_gradients());
    std::vector<uint64_t> ids = {uint64_t(step % 5), uint64_t(step + 7), uint64_t(3 * step + 40)};
    std::vector<float> gradients(ids.size() * kDim);
    for (size_t i = 0; i < gradients.size(); ++i) gradients[i] = 0.1f * float(i) - float(step);
    EmbeddingRows* rows = push.add_rows();
    rows->set_table("emb");
    rows->set_ids(Bytes(ids.data(), ids.size() * sizeof(uint64_t)));
    rows->set_dtype(FLOAT32);
    rows->set_data(Bytes(gradients.data(), gradients.size() * sizeof(float)));
    PushResponse response;
    const absl::Status pushed = Push(*primary, push, &response);
    if (!pushed.ok()) std::fprintf(stderr, "replica_fuzzer: %s\n", pushed.ToString().c_str());
    REPLICA_INVARIANT(pushed.ok());
    take();
  }
  return updates;
}

// Breaks `update` as `how` says, with `value` where it needs one.
void Corrupt(uint8_t how, uint8_t value, ReplicaUpdate* update) {
  ShardCheckpoint* state = update->mutable_state();
  auto some_bytes = [&]() -> std::string* {
    if (state->embeddings_size() == 0) return state->mutable_run_id();
    ShardCheckpoint::Embedding* e = state->mutable_embeddings(value % state->embeddings_size());
    switch ((value >> 3) % 5) {
      case 0:
        return e->mutable_ids();
      case 1:
        return e->mutable_values();
      case 2:
        return e->mutable_slots();
      case 3:
        return e->mutable_row_updates();
      default:
        return e->mutable_removed_ids();
    }
  };
  switch (how % 16) {
    case 0:
      return;  // intact
    case 1:
      update->set_epoch(update->epoch() + (value % 3) - 1);
      return;
    case 2:
      state->set_version(state->version() + (value % 5) - 2);
      return;
    case 3:
      state->set_parent_version(state->parent_version() + (value % 5) - 2);
      return;
    case 4:
      state->set_delta(!state->delta());
      return;
    case 5: {
      std::string* bytes = some_bytes();
      if (!bytes->empty()) (*bytes)[value % bytes->size()] ^= static_cast<char>(value | 1);
      return;
    }
    case 6: {
      std::string* bytes = some_bytes();
      if (!bytes->empty()) bytes->resize(bytes->size() - 1 - value % bytes->size());
      return;
    }
    case 7: {
      std::string* bytes = some_bytes();
      bytes->append(std::string(1 + value % 9, static_cast<char>(value)));
      return;
    }
    case 8: {
      const float nan = std::nanf("");
      std::string* values = state->embeddings_size() > 0
                                ? state->mutable_embeddings(0)->mutable_values()
                                : state->mutable_run_id();
      if (values->size() >= sizeof(float)) {
        std::memcpy(values->data() + (value % (values->size() / sizeof(float))) * sizeof(float),
                    &nan, sizeof(nan));
      }
      return;
    }
    case 9:
      if (state->embeddings_size() > 0) {
        state->mutable_embeddings(0)->mutable_config()->set_name(value % 2 ? "other" : "");
      }
      return;
    case 10:
      if (state->embeddings_size() > 0) state->mutable_embeddings()->RemoveLast();
      return;
    case 11:
      update->add_workers_done(value % 3 - 1);  // the job has worker 0 only
      return;
    case 12: {  // the dense variable's optimizer step
      if (update->dense_steps().steps_size() == 0) return;
      DenseStep* step = update->mutable_dense_steps()->mutable_steps(0);
      const float odd[] = {std::nanf(""), -1.0f, 3e38f, 0.0f};
      switch ((value >> 2) % 7) {
        case 0:
          step->set_name(value % 2 ? "emb" : "c");
          break;
        case 1:
          step->set_update(step->update() + (value % 3) - 1);
          break;
        case 2:
          step->mutable_gradient()->resize(value % 16);
          break;
        case 3:
          std::memcpy(step->mutable_gradient()->data(), &odd[value % 4], sizeof(float));
          break;
        case 4:
          step->set_lr_scale(odd[value % 4]);
          break;
        case 5:
          step->set_learning_rate(odd[value % 4]);
          break;
        default:
          *update->mutable_dense_steps()->add_steps() = *step;  // twice
          break;
      }
      return;
    }
    case 13:  // the dense variables whole and as steps, or neither
      if (value % 2) {
        const float values[] = {1, 2, 3};
        ShardCheckpoint::Variable* variable = state->add_variables();
        variable->set_name("b");
        variable->add_shape(3);
        variable->set_values(Bytes(values, sizeof(values)));
      } else {
        update->clear_dense_steps();
      }
      return;
    default:
      state->set_shard(value % 3);
      if (state->variables_size() > 0) {
        state->mutable_variables(0)->set_values(std::string(value % 16, '\x7f'));
      }
      return;
  }
}

bool AllFinite(const ShardCheckpoint& state) {
  auto finite = [](const std::string& bytes) {
    for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
      float x;
      std::memcpy(&x, bytes.data() + i, sizeof(x));
      if (!std::isfinite(x)) return false;
    }
    return true;
  };
  for (const auto& v : state.variables()) {
    if (!finite(v.values()) || !finite(v.slots())) return false;
  }
  for (const auto& e : state.embeddings()) {
    if (!finite(e.values()) || !finite(e.slots())) return false;
  }
  return true;
}

const std::vector<ReplicaUpdate>* updates = nullptr;

}  // namespace
}  // namespace pst::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  pst::fuzz::updates = new std::vector<pst::ReplicaUpdate>(pst::fuzz::TrainPrimary());
  return 0;
}

namespace pst::fuzz {
namespace {

// `update` in pieces of 16 to 1024 bytes, the sequence broken as `value`
// says, through `assembly`: the update that comes out, if any.
std::optional<ReplicaUpdate> ThroughPieces(const ReplicaUpdate& update, uint8_t value,
                                           ReplicaAssembly* assembly) {
  absl::StatusOr<std::vector<ReplicaUpdate>> pieces =
      SplitReplicaUpdate(update, 16 * (1 + value % 64));
  REPLICA_INVARIANT(pieces.ok());
  const size_t n = pieces->size();
  const size_t k = value % n;
  switch ((value >> 6) % 4) {
    case 0:
      break;  // whole
    case 1:
      pieces->erase(pieces->begin() + static_cast<std::ptrdiff_t>(k));
      break;
    case 2:
      pieces->insert(pieces->begin() + static_cast<std::ptrdiff_t>(k), (*pieces)[n - 1 - k]);
      break;
    default:
      (*pieces)[k].mutable_piece()->set_total((*pieces)[k].piece().total() + (value & 1 ? 1 : -1));
      (*pieces)[n - 1 - k].mutable_piece()->set_offset((*pieces)[n - 1 - k].piece().offset() ^ 1);
      break;
  }
  std::optional<ReplicaUpdate> out;
  for (const ReplicaUpdate& piece : *pieces) {
    absl::StatusOr<std::optional<ReplicaUpdate>> taken = assembly->Take(piece);
    REPLICA_INVARIANT(assembly->held_bytes() <= piece.piece().total() || !taken.ok());
    if (taken.ok() && taken->has_value()) out = std::move(**taken);
  }
  return out;
}

}  // namespace
}  // namespace pst::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pst;        // NOLINT(build/namespaces)
  using namespace pst::fuzz;  // NOLINT(build/namespaces)
  std::unique_ptr<ParameterShard> backup = *ParameterShard::Create(Options(1));
  ReplicaAssembly assembly;
  // Each call: which update (by 3 bytes), what to break in it, and with what.
  for (size_t at = 0; at + 3 <= size && at < 3 * 64; at += 3) {
    ReplicaUpdate update = (*updates)[data[at] % updates->size()];
    if (data[at + 1] % 14 == 12) {
      std::optional<ReplicaUpdate> whole = ThroughPieces(update, data[at + 2], &assembly);
      if (!whole) continue;
      update = *std::move(whole);
    } else {
      Corrupt(data[at + 1], data[at + 2], &update);
    }
    const ShardCheckpoint before = backup->Snapshot();
    const int64_t version = backup->version();
    ReplicaAck ack;
    int acknowledged = 0;
    const absl::Status applied =
        backup->ApplyReplicaUpdate(update, &ack, [&acknowledged] { ++acknowledged; });
    const ShardCheckpoint after = backup->Snapshot();
    REPLICA_INVARIANT(acknowledged <= 1);
    if (applied.ok()) {
      REPLICA_INVARIANT(acknowledged == 1);
      REPLICA_INVARIANT(ack.applied());
      REPLICA_INVARIANT(backup->version() == update.state().version());
      REPLICA_INVARIANT(ack.version() == backup->version());
      REPLICA_INVARIANT(AllFinite(after));
    } else if (acknowledged == 1) {
      // Acknowledged once checked, then failed while its rows were
      // written: the backup must ask for the state whole.
      REPLICA_INVARIANT(!backup->holds_state());
    } else {
      REPLICA_INVARIANT(!ack.applied());
      if (ack.version() != -1) {
        REPLICA_INVARIANT(backup->version() == version);
        REPLICA_INVARIANT(after.SerializeAsString() == before.SerializeAsString());
      }
    }
  }
  return 0;
}
