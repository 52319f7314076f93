// The byte layout shard_fuzzer reads, shared with make_shard_corpus, which
// writes the seed inputs in it.
//
//   byte 0  shard options: bits 0-1 mode (SYNC, ASYNC, SSP, SYNC);
//           bits 2-3 workers - 1; bit 4 start with the structured Init;
//           bit 5 lease 0 (an idle worker leaves the live set at once, else
//           5 s); bit 6 staleness_lr_scaling; bit 7 snapshot_every_steps 2.
//   byte 1  bits 0-1 optimizer (sgd, momentum, adam, adagrad);
//           bits 2-3 replicas_to_aggregate (at most the workers);
//           bits 4-5 max_staleness; bits 6-7 staleness (SSP).
//   then    records until the input ends: one op byte (taken modulo
//           kOpCount), a 16-bit little-endian payload length, the payload
//           (cut short where the input ends).
//
// The raw ops parse their payload as the request message (and skip it if it
// does not parse). The structured ops build a request against the two
// variables of the structured Init from a few payload bytes, so that the
// deep Push paths are reached without the fuzzer having to discover the
// variable names and payload sizes.
#ifndef PST_FUZZ_SHARD_INPUT_H_
#define PST_FUZZ_SHARD_INPUT_H_

#include <cstdint>

namespace pst::fuzz {

enum Op : uint8_t {
  kInit = 0,       // InitRequest
  kPush,           // PushRequest
  kPull,           // PullRequest, with an immediate deadline
  kHeartbeat,      // HeartbeatRequest
  kDone,           // DoneRequest
  kRegister,       // RegisterRequest
  kStats,          // no payload
  // Structured push: [worker][version][flags][gradient bytes...]. worker is
  // taken modulo workers + 1 (the last one is out of range). version: bit 7
  // set claims version + 1, else the current version minus (bits 0-1).
  // flags: bits 0-1 dtype; bit 2 leave out "b"; bit 3 send the shape;
  // bit 4 the gradient bytes are raw wire data, else each byte is a small
  // value (int8 / 16); bit 5 deliver it as an exchange would, in pieces of
  // (bits 6-7) + 1 elements (ParameterShard::BeginStreamedPush).
  kPushValues,
  // Structured pull: [worker][dtype][version][names]: min_version is the
  // current version + (version % 3) - 1; names % 4 picks every variable,
  // "w", "b" or an unknown one.
  kPullValues,
  kSnapshotRoundTrip,  // Snapshot, Restore into a fresh shard, compare
  kTakeSnapshot,       // TakeScheduledSnapshot with an immediate deadline
  kShutdown,           // BeginShutdown
  // Structured push of embedding rows: [worker][version][flags][count]
  // [ids...][values...]. worker and version as kPushValues. flags: bits
  // 0-1 dtype; bit 2 table "f" (else "e"); bit 3 the values are raw wire
  // bytes (else each byte a small value, int8 / 16); bit 4 the ids cut
  // short by 3 bytes; bit 5 one value more per row than the table's dim;
  // bit 6 with the structured dense gradients ("w", "b") beside the rows;
  // bit 7 name an unknown table "x". count % 9 ids follow, one byte each
  // (so that ids repeat, within a push and across pushes).
  kPushRows,
  // Structured pull of rows: [worker][dtype][flags][count][ids...]:
  // min_version as kPullValues' with (flags >> 4) % 3; flags bit 0 table
  // "f" (else "e"); bit 1 name an unknown table; bit 2 rows only (else
  // every dense variable too); bit 3 also the other table. count % 9 ids.
  kPullRows,
  kOpCount,
};

// The structured Init: "w" of shape {2, 3} and "b" of shape {3}, and the
// embedding tables "e" of dim 2 and "f" of dim 1, whose row limit (4) the
// one-byte ids soon exceed.
inline constexpr int64_t kWeightShape[] = {2, 3};
inline constexpr int64_t kBiasShape[] = {3};
inline constexpr int kRowsDimE = 2;
inline constexpr int kRowsDimF = 1;
inline constexpr int64_t kRowsLimitF = 4;

}  // namespace pst::fuzz

#endif  // PST_FUZZ_SHARD_INPUT_H_
