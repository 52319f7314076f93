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
// call), with the embedding rows `push` carries (inline, or already read
// out of the region by ReadShmRows), so that they are
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

// Copies the embedding rows `transfer` places in `region` (push_rows,
// pull_rows) into `push`'s rows and `pull`'s (null: the exchange pulls
// nothing), the very fields a TCP exchange carries them in, so that the
// shard checks and applies them as it does rows from a socket (ids of
// another shard, rows of the wrong width, non-finite values): the shard's
// code is the same for both paths, and what the worker writes to the
// region afterwards changes nothing. Nothing is read before every range
// is checked against the region and the region's size is checked again.
// InvalidArgument for a range outside the region, a region that has
// shrunk, lists that do not match the header's or the pull's tables, rows
// both inline and in the region, ids or data in a pull's list, more row
// bytes in a push than limits.max_request_bytes (as its header would be
// over TCP) or more ids in a pull than limits.max_rows_per_pull. A request
// without these lists is left as it is (its rows are inline).
absl::Status ReadShmRows(const ShmTransfer& transfer, const OpenedRegion& region,
                         const RpcLimits& limits, PushRequest* push, PullRequest* pull);

// Whether the answer's rows go into the region (the pull named its ids
// there, ShmTransfer.pull_rows).
inline bool RowsAnswerInRegion(const ShmTransfer& transfer) {
  return transfer.pull_rows_size() > 0;
}

// InvalidArgument unless `answer_bytes` bytes of rows (ParameterShard::
// RowsAnswerBytes of the pull) fit in `region` from
// transfer.rows_answer_offset: checked before a push is applied, so that
// a bad offset never leaves a push applied and its answer lost.
absl::Status CheckShmRowsAnswer(const ShmTransfer& transfer, int64_t answer_bytes,
                                const OpenedRegion& region);

// Writes the rows of a captured answer (`header`'s rows' data) into
// `region` from transfer.rows_answer_offset, table after table, and
// empties their data in `header`, which keeps their tables and dtype;
// `bytes` gets their size. InvalidArgument if they do not fit there.
absl::Status WriteShmRowsAnswer(const ShmTransfer& transfer, const OpenedRegion& region,
                                PullResponse* header, int64_t* bytes);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_SHM_EXCHANGE_H_
