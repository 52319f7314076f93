// Writes the seed inputs of shard_fuzzer (layout in fuzz/shard_input.h) into
// the directory given as the only argument: short RPC sequences in each mode
// that reach SYNC steps, ASYNC and SSP pushes, pulls in every wire type,
// embedding rows, liveness and snapshots, so fuzzing starts from the deep
// paths.
//
//   build-asan/bin/make_shard_corpus fuzz/corpus/shard
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "fuzz/shard_input.h"
#include "ps.pb.h"

namespace pst::fuzz {
namespace {

class Sequence {
 public:
  Sequence(uint8_t a, uint8_t b) : bytes_{static_cast<char>(a), static_cast<char>(b)} {}

  Sequence& Op(fuzz::Op op, const std::string& payload = "") {
    bytes_.push_back(static_cast<char>(op));
    bytes_.push_back(static_cast<char>(payload.size() & 0xff));
    bytes_.push_back(static_cast<char>(payload.size() >> 8));
    bytes_ += payload;
    return *this;
  }
  Sequence& Message(fuzz::Op op, const google::protobuf::MessageLite& message) {
    return Op(op, message.SerializeAsString());
  }
  // A structured push of small values (see kPushValues).
  Sequence& PushValues(int worker, int version_lag, int flags, int seed) {
    std::string p = {static_cast<char>(worker), static_cast<char>(version_lag),
                     static_cast<char>(flags)};
    for (int i = 0; i < 9; ++i) p.push_back(static_cast<char>((seed * 7 + i * 13) % 64 - 32));
    return Op(kPushValues, p);
  }
  // A structured push of raw float32 wire data (flags bit 4).
  Sequence& PushRawValues(int worker, int version_lag, float base, int flags = 0x18) {
    std::string p = {static_cast<char>(worker), static_cast<char>(version_lag),
                     static_cast<char>(flags | 0x10)};
    for (int i = 0; i < 9; ++i) {
      const float v = base * static_cast<float>(i - 4);
      p.append(reinterpret_cast<const char*>(&v), sizeof(v));
    }
    return Op(kPushValues, p);
  }
  // A structured push of embedding rows (see kPushRows): small values.
  Sequence& PushRows(int worker, int version_lag, int flags, const std::string& ids, int seed) {
    std::string p = {static_cast<char>(worker), static_cast<char>(version_lag),
                     static_cast<char>(flags), static_cast<char>(ids.size())};
    p += ids;
    for (int i = 0; i < 40; ++i) p.push_back(static_cast<char>((seed * 5 + i * 11) % 64 - 32));
    return Op(kPushRows, p);
  }
  Sequence& PullRows(int worker, int dtype, int flags, const std::string& ids) {
    std::string p = {static_cast<char>(worker), static_cast<char>(dtype),
                     static_cast<char>(flags), static_cast<char>(ids.size())};
    p += ids;
    return Op(kPullRows, p);
  }
  Sequence& PullValues(int worker, int dtype, int version, int names) {
    return Op(kPullValues, std::string{static_cast<char>(worker), static_cast<char>(dtype),
                                       static_cast<char>(version), static_cast<char>(names)});
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Option bytes (see shard_input.h).
constexpr uint8_t kSync = 0, kAsync = 1, kSsp = 2;
constexpr uint8_t Workers(int n) { return static_cast<uint8_t>((n - 1) << 2); }
constexpr uint8_t kStructured = 0x10, kLeaseZero = 0x20, kLrScaling = 0x40, kSnapshots = 0x80;
constexpr uint8_t kSgd = 0, kMomentum = 1, kAdam = 2, kAdagrad = 3;
constexpr uint8_t Replicas(int n) { return static_cast<uint8_t>(n << 2); }
constexpr uint8_t MaxStaleness(int n) { return static_cast<uint8_t>(n << 4); }
constexpr uint8_t Staleness(int n) { return static_cast<uint8_t>(n << 6); }

template <typename M>
M WithWorker(int worker) {
  M m;
  m.set_worker(worker);
  return m;
}

InitRequest RawInit(DType dtype) {
  InitRequest init;
  init.set_worker(0);
  const int64_t shape[] = {4};
  const float values[] = {1.0f, 2.0f, -3.0f, 0.5f};
  EncodeTensor("v", shape, values, init.add_variables(), dtype);
  return init;
}

PushRequest RawPush(int worker, int64_t version, DType dtype) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  const int64_t shape[] = {4};
  const float gradient[] = {0.5f, -0.25f, 1.0f, 0.0f};
  EncodeTensor("v", shape, gradient, push.add_gradients(), dtype);
  return push;
}

std::vector<std::pair<std::string, Sequence>> Seeds() {
  std::vector<std::pair<std::string, Sequence>> seeds;
  {  // SYNC, two workers: one full step, a late push, pulls and stats.
    Sequence s(kSync | Workers(2) | kStructured, kSgd);
    s.PushValues(0, 0, 0x08, 1).PushValues(1, 0, 0x08, 2).PullValues(0, 0, 1, 0);
    s.PushValues(1, 1, 0, 3).Op(kStats).Op(kSnapshotRoundTrip);
    seeds.emplace_back("sync_step", s);
  }
  {  // SYNC, three workers, two replicas, a lease of 0: backups and liveness.
    Sequence s(kSync | Workers(3) | kStructured | kLeaseZero, kMomentum | Replicas(2));
    s.PushValues(0, 0, 1, 4).Op(kStats).PushValues(2, 0, 2, 5).PushValues(1, 1, 0, 6);
    s.Message(kDone, WithWorker<DoneRequest>(1)).Op(kStats).PullValues(2, 1, 1, 1);
    seeds.emplace_back("sync_backup_lease", s);
  }
  {  // ASYNC, Adam, staleness scaling and bound: stale, future and raw pushes.
    Sequence s(kAsync | Workers(3) | kStructured | kLrScaling, kAdam | MaxStaleness(1));
    s.PushValues(0, 0, 0, 7).PushValues(1, 1, 0, 8).PushValues(2, 2, 0, 9);
    s.PushValues(0, 0x80, 0, 10).PushRawValues(1, 0, 1e3f).PullValues(1, 3, 1, 2);
    s.Message(kHeartbeat, WithWorker<HeartbeatRequest>(2)).Op(kStats);
    seeds.emplace_back("async_adam", s);
  }
  {  // ASYNC, Adam, pushes applied as they stream in, in pieces of 1-4
     // elements: a stale one, one that overflows Adam, a non-finite one.
    Sequence s(kAsync | Workers(2) | kStructured | kLrScaling, kAdam | MaxStaleness(2));
    s.PushValues(0, 0, 0x28, 15).PushValues(1, 0, 0x68, 16).PushValues(0, 1, 0xe8, 17);
    s.PushValues(1, 0, 0xa0, 18).PushRawValues(1, 0, 1e30f, 0x38).PushRawValues(0, 0, 1e38f, 0x38);
    s.PullValues(1, 0, 1, 0);
    s.Op(kStats).Op(kSnapshotRoundTrip);
    seeds.emplace_back("async_streamed", s);
  }
  {  // SSP with raw messages only: Init, Register, pushes, pulls, Done.
    Sequence s(kSsp | Workers(2), kAdagrad | Staleness(1));
    s.Message(kRegister, WithWorker<RegisterRequest>(1)).Message(kInit, RawInit(FLOAT32));
    s.Message(kPush, RawPush(0, 0, FLOAT32)).Message(kPush, RawPush(0, 1, FLOAT16));
    PullRequest pull = WithWorker<PullRequest>(0);
    pull.add_names("v");
    pull.set_dtype(BFLOAT16);
    s.Message(kPull, pull).Message(kDone, WithWorker<DoneRequest>(1)).Message(kPull, pull);
    s.Op(kStats);
    seeds.emplace_back("ssp_raw", s);
  }
  {  // Scheduled snapshots every 2 steps, then a shutdown.
    Sequence s(kAsync | Workers(1) | kStructured | kSnapshots, kSgd);
    s.PushValues(0, 0, 0, 12).PushValues(0, 0, 0, 13).Op(kTakeSnapshot).Op(kSnapshotRoundTrip);
    s.Op(kShutdown).PushValues(0, 0, 0, 14).PullValues(0, 0, 1, 0).Op(kStats);
    seeds.emplace_back("snapshot_shutdown", s);
  }
  {  // ASYNC rows: alone and beside the dense gradients, in every dtype, past
     // table "f"'s row limit, pulled with and without the dense variables.
    Sequence s(kAsync | Workers(2) | kStructured, kAdagrad);
    s.PushRows(0, 0, 0x00, "\x01\x02\x03", 1).PushRows(1, 0, 0x41, "\x02\x09", 2);
    s.PushRows(0, 0, 0x06, "\x01\x02\x03\x04\x05\x06", 3).PushRows(1, 0, 0x03, "\x07", 4);
    s.PullRows(0, 0, 0x14, "\x01\x02\x63").PullRows(1, 3, 0x19, "\x05\x06");
    s.Op(kStats).Op(kSnapshotRoundTrip);
    seeds.emplace_back("async_rows", s);
  }
  {  // SYNC rows beside every dense gradient: one step of two workers with
     // shared ids, then a push of rows alone (refused in SYNC).
    Sequence s(kSync | Workers(2) | kStructured, kAdam);
    s.PushRows(0, 0, 0x41, "\x01\x02", 5).PushRows(1, 0, 0x41, "\x02\x03", 6);
    s.PullRows(0, 1, 0x10, "\x01\x02\x03").PushRows(0, 0, 0x01, "\x01", 7);
    s.Op(kStats).Op(kSnapshotRoundTrip);
    seeds.emplace_back("sync_rows", s);
  }
  {  // Bad rows: an id twice, ids cut short, a row too wide, an unknown
     // table, non-finite raw values; each refused, the tables untouched.
    Sequence s(kAsync | Workers(1) | kStructured, kSgd);
    s.PushRows(0, 0, 0x01, "\x01\x01", 8).PushRows(0, 0, 0x11, "\x01\x02", 9);
    s.PushRows(0, 0, 0x21, "\x03", 10).PushRows(0, 0, 0x81, "\x04", 11);
    s.Op(kPushRows, std::string("\x00\x00\x09\x01\x05\x00\x00\xc0\x7f\x00\x00\x80\x3f", 13));
    s.PullRows(0, 0, 0x06, "\x01").Op(kStats);
    seeds.emplace_back("bad_rows", s);
  }
  {  // Refused requests: before Init, bad Init, unknown names, bad workers.
    Sequence s(kSync | Workers(4), kAdam);
    s.Message(kPush, RawPush(0, 0, FLOAT32)).Message(kPull, WithWorker<PullRequest>(0));
    InitRequest bad = RawInit(FLOAT32);
    bad.mutable_variables(0)->add_shape(2);
    s.Message(kInit, bad).Message(kInit, RawInit(BFLOAT16)).Message(kPush, RawPush(7, 0, FLOAT32));
    s.Message(kPush, RawPush(0, 3, FLOAT32)).PullValues(0, 0, 1, 3).Op(kStats);
    seeds.emplace_back("refused", s);
  }
  return seeds;
}

}  // namespace
}  // namespace pst::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  for (const auto& [name, sequence] : pst::fuzz::Seeds()) {
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << sequence.bytes();
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
