// The server's end of the chunked data plane (common/tensor_stream.h,
// common/chunk_wire.h): reassembling a PushStream into a PushRequest and
// sending a pull as a PullStream, over raw gRPC byte buffers.
#ifndef PST_PS_SERVER_CHUNK_STREAMS_H_
#define PST_PS_SERVER_CHUNK_STREAMS_H_

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

// Reads a whole PushStream into `request`, whose buffers are reused from an
// earlier call: every field is overwritten, and a payload of the same size
// as before costs no allocation. The header is checked against `shard`
// before any payload is buffered; pieces must follow the stream rules, and
// are checked for non-finite values as they are copied in (so the caller
// can tell Push they were: PushChecked). On
// InvalidArgument or FailedPrecondition, `request` is garbage, the model
// untouched and the refusal counted in the shard's pushes_rejected; nothing
// is applied here either way (the caller calls Push).
absl::Status ReceivePushStream(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                               ParameterShard* shard, PushRequest* request);

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
