// The server's end of the chunked data plane (common/tensor_stream.h,
// common/chunk_wire.h): reassembling a PushStream into a PushRequest and
// sending a pull as a PullStream, over raw gRPC byte buffers.
#ifndef PST_PS_SERVER_CHUNK_STREAMS_H_
#define PST_PS_SERVER_CHUNK_STREAMS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "ps.pb.h"
#include "ps_server/parameter_shard.h"

namespace pst {

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
// `cancel` ends the call (ServerContext::TryCancel): the shard uses it on a
// stream that stalls while other updates wait for it. `received` gets what
// the metrics want to know of the push.
struct ReceivedPush {
  int64_t bytes = 0;  // on the wire
  int64_t computed_at_version = 0;
};
absl::Status ServePushStream(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                             std::function<void()> cancel, ParameterShard* shard,
                             PushRequest* buffer, PushResponse* response, ReceivedPush* received);

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
using WriteMessage = absl::FunctionRef<bool(const grpc::ByteBuffer&, grpc::WriteOptions)>;
int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write);

// Pull payloads for reuse, so that a pull encodes into warm memory. A
// payload is handed out again only once nothing but the pool holds it,
// i.e. gRPC has released every slice of the answer it was sent in.
class PullPayloadPool {
 public:
  std::shared_ptr<PullPayload> Take();

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<PullPayload>> payloads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst

#endif  // PST_PS_SERVER_CHUNK_STREAMS_H_
