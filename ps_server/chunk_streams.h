// The server's end of the chunked data plane (common/tensor_stream.h,
// rpc/chunk_wire.h): taking a PushStream (applied as it streams in, or
// reassembled into a PushRequest), sending a pull as a PullStream, and
// PushPull, which does both in one call, over raw gRPC byte buffers.
#ifndef PST_PS_SERVER_CHUNK_STREAMS_H_
#define PST_PS_SERVER_CHUNK_STREAMS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "ps.pb.h"
#include "ps_server/parameter_shard.h"
#include "rpc/chunk_wire.h"

namespace pst {

// Reads the next message of a stream into its argument; false at the end
// of the stream or when the call failed.
using ReadMessage = absl::FunctionRef<bool(grpc::ByteBuffer*)>;

// What a PushPull adds to serving its push stream (ServePushStream).
class PushEcho {
 public:
  virtual ~PushEcho() = default;
  // Given the stream's first message and its header (already checked
  // against the shard), and whether the push is applied while it streams
  // in (a StreamedUpdate) or reassembled. An error refuses the stream.
  virtual absl::Status Start(const ReceivedChunk& first, const PushRequest& header,
                             bool streamed) = 0;
  // The pieces of `chunk` have just been staged into `update` (streamed
  // pushes only).
  virtual absl::Status Staged(const ReceivedChunk& chunk, const StreamedUpdate& update) = 0;
};

// Serves one PushStream: reads it and pushes it to `shard`. When the shard
// can apply the push as it streams in (ParameterShard::BeginStreamedPush),
// each piece is staged as it lands, straight from gRPC's buffers, and the
// update is committed at the end of the stream. Otherwise the pieces are
// reassembled into `buffer`, whose memory is reused from an earlier call
// (every field is overwritten; a payload of the same size costs no
// allocation), and the request is pushed once complete. Either way the
// header is checked against the shard before any payload is taken, pieces
// must follow the stream rules, and every value is checked to be finite as
// it is copied, before anything of the push is applied. A refused stream
// leaves the model untouched and is counted in pushes_rejected.
// `hooks` are the caller's say in the stream (below). `received` gets what
// the metrics want to know of the push. `echo`, if given, is told of the
// stream's start and of every chunk staged.
struct PushStreamHooks {
  // Ends the call (ServerContext::TryCancel): the shard uses it on a
  // stream that stalls while other updates wait for it.
  std::function<void()> cancel;
  // Given the header, once the shard has accepted it, and the bytes the
  // push will hold until it is applied (its share, when it is reassembled;
  // 0 when it streams into the update). An error refuses the stream before
  // any payload is taken, and is not counted as a rejected push: e.g. the
  // limits of rpc_limits.h. Unset: everything is admitted.
  std::function<absl::Status(const PushRequest& header, int64_t buffered_bytes)> admit;
};
struct ReceivedPush {
  int64_t bytes = 0;  // on the wire
  int64_t computed_at_version = 0;
};
absl::Status ServePushStream(ReadMessage read, const PushStreamHooks& hooks,
                             ParameterShard* shard, PushRequest* buffer, PushResponse* response,
                             ReceivedPush* received, PushEcho* echo = nullptr);

// One pull's answer: the header, and the requested variables' values at
// one version, in the wire dtype.
struct PullPayload {
  PullResponse header;  // version, tensors without data
  DType dtype = FLOAT32;
  // The variables' own value buffers, which no update writes while they
  // are held (variable_store.h: Values), in header order.
  std::vector<Values> values;
  std::vector<char> encoded;  // 16-bit wire types: the values encoded
};

// Takes `variables` at `version` into `out`: the header and a reference to
// each variable's values, no copy (meant for ParameterShard::PullVisit,
// under the shard's lock, which this holds for microseconds).
void CapturePull(int64_t version, const std::vector<const Variable*>& variables, DType dtype,
                 PullPayload* out);

// Sends `payload` as PullStream messages, through `write`. float32 pieces
// reference the variables' buffers, 16-bit ones the encoding made here
// (outside the shard's lock); the slices gRPC still holds keep what they
// reference alive. Drops the payload's references to the variables.
// Returns the bytes written, or -1 if a write failed (the client went away).
// `last_extra`, if given, goes into the last message as its field 3
// (PushPullChunk.done).
using WriteMessage = absl::FunctionRef<bool(const grpc::ByteBuffer&, grpc::WriteOptions)>;
int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write,
                        const google::protobuf::MessageLite* last_extra = nullptr);

// Pull payloads for reuse, so that a pull encodes into warm memory. A
// payload is handed out again only once nothing but the pool holds it,
// i.e. gRPC has released every slice of the answer it was sent in. The
// pool keeps at most `max_kept` payloads; beyond that (more pulls at once
// than training makes), a payload is the caller's alone and freed after.
class PullPayloadPool {
 public:
  explicit PullPayloadPool(size_t max_kept = 64) : max_kept_(max_kept) {}
  std::shared_ptr<PullPayload> Take();

 private:
  const size_t max_kept_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<PullPayload>> payloads_ ABSL_GUARDED_BY(mu_);
};

// Makes `pull` the pull half of a PushPull (streamed or PushPullSmall):
// this worker's, asking for the pushed variables: in the order the pull
// names them if it names exactly those (the worker's next forward pass
// wants its first layer first, while the push came last layer first), else
// in the push's order.
void AskForPushedVariables(const PushRequest& push, PullRequest* pull);

// Serves one PushPull: the push stream as ServePushStream does, then the
// pushed variables' values, in the pull's dtype, at a version that
// includes the push and is at least pull.min_version (waiting for it until
// `pull_deadline`), as PushPullChunk messages through `write`; the last
// carries the push's response and the values' version (PushPullDone).
// On an ASYNC shard that applies the push as it streams in, and when the
// pull needs no wait, each chunk's new values are written as soon as they
// are staged, from the staging buffers themselves (float32) or encoded
// into a pooled payload; the push and the answer then flow at once.
// Otherwise (SYNC, SSP, a reassembled push, a pull that must wait) the
// answer is a pull once the push is in.
// `bytes_sent` gets the answer's size on the wire.
struct PushPullContext {
  ParameterShard* shard;
  PushRequest* buffer;         // as ServePushStream's
  PullPayloadPool* payloads;   // encodings of 16-bit answers
  ThreadPool* threads;         // where the answer is written from
  // When the pull's wait ends, given its request.
  std::function<absl::Time(const PullRequest&)> pull_deadline;
  // Whether the worker has gone, polled while the pull waits.
  std::function<bool()> caller_gone;
};
// `hooks` as ServePushStream's.
absl::Status ServePushPull(ReadMessage read, WriteMessage write, const PushStreamHooks& hooks,
                           const PushPullContext& context, PushResponse* response,
                           ReceivedPush* received, int64_t* bytes_sent);

}  // namespace pst

#endif  // PST_PS_SERVER_CHUNK_STREAMS_H_
