// The server's end of an exchange whose tensor bytes lie in a worker's
// shared region (ExchangeChunk.shm in proto/ps.proto): reading the push out
// of the region and writing the answer into it. The calls and the shard
// are the caller's (ps_server/service/exchange_call.h, fuzz/shm_exchange_fuzzer.cc).
#ifndef PST_PS_SERVER_SERVICE_SHM_EXCHANGE_H_
#define PST_PS_SERVER_SERVICE_SHM_EXCHANGE_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/shared_memory.h"
#include "ps.pb.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/rpc_limits.h"
#include "ps_server/core/streamed_update.h"

namespace pst {

// Copies the gradients `push` announces out of `region`, from
// transfer.push_offset, into `buffer` (its memory reused from an earlier
// call), with the embedding rows `push` carries inline, so that they are
// checked there, as bytes from a socket are, before anything is applied:
// what the worker writes to the region afterwards changes nothing.
// Gradient i is gradient_bytes[i] bytes, the size the shard expects
// (ParameterShard::BeginStreamedPush). Every range is checked against the
// region before it is touched, and, if the exchange pulls (`answer_dtype`
// set), the answer's too, so that a bad offset never leaves a push applied
// and its answer lost. `finite` gets whether every gradient value read is
// finite (the shard refuses and counts a push that is not, and checks the
// rows itself), `bytes` the bytes read. InvalidArgument for a range outside
// the region, one that has shrunk since it was attached, or more gradients
// than the limits allow.
absl::Status ReadShmPush(const PushRequest& push, std::span<const int64_t> gradient_bytes,
                         const ShmTransfer& transfer, const DType* answer_dtype,
                         const OpenedRegion& region, const RpcLimits& limits,
                         PushRequest* buffer, bool* finite, int64_t* bytes);

// Applies the gradients `push` announces straight out of `region`, from
// transfer.push_offset, to `update` (ParameterShard::BeginStreamedPush), a
// block at a time; gradient i is gradient_bytes[i] bytes, the size the
// shard gave with the update (its own shapes: a header without a shape
// stages the whole variable, never part of it). A float32 block at an
// aligned offset is applied where it lies (the optimizer reads each value
// once; one that is not finite gives a result that is not, and the update
// is refused naming it); any other block is copied into a buffer of this
// thread's, checked and staged while it is in cache. No copy of the whole
// gradient is made, and what the worker writes into the region meanwhile
// never reaches the model unchecked. Every range is checked before
// anything is read, the answer's too if the exchange pulls (`answer_dtype`
// set). With `answer_as_staged` (a float32 answer of the pushed variables
// that may flow during the push: ConsistencyPolicy::
// AnswerMayStreamDuringPush), each block's new values are also written
// into the region from transfer.answer_offset, packed in header order, as
// soon as they are staged, while they are in cache; they are the answer
// once the update is committed. `bytes` gets the bytes read.
// InvalidArgument, with the update to be dropped, for a range outside the
// region, one that has shrunk since it was attached, a non-finite value or
// more gradients than the limits allow.
absl::Status StageShmPush(const PushRequest& push, std::span<const int64_t> gradient_bytes,
                          const ShmTransfer& transfer, const DType* answer_dtype,
                          const OpenedRegion& region, const RpcLimits& limits,
                          StreamedUpdate* update, int64_t* bytes, bool answer_as_staged = false);

// Writes a captured answer into `region` from `offset`, packed in header
// order, and drops the payload's references to the variables; `bytes` gets
// its size. InvalidArgument if it does not fit there.
absl::Status WriteShmAnswer(PullPayload* payload, const OpenedRegion& region, int64_t offset,
                            int64_t* bytes);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_SHM_EXCHANGE_H_
