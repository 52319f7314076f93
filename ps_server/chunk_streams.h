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
// before any payload is buffered; pieces must follow the stream rules. On
// InvalidArgument or FailedPrecondition, `request` is garbage, the model
// untouched and the refusal counted in the shard's pushes_rejected; nothing
// is applied here either way (the caller calls Push).
absl::Status ReceivePushStream(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                               ParameterShard* shard, PushRequest* request);

// One pull's answer: the header and every requested variable's values at
// one version, encoded in the wire dtype back to back.
struct PullPayload {
  PullResponse header;                // version, tensors without data
  std::vector<int64_t> tensor_bytes;  // per header tensor
  std::vector<char> bytes;
};

// Encodes `variables` at `version` in wire type `dtype` into `out`, straight
// from the variables (meant for ParameterShard::PullVisit, under the shard's
// lock: this copy is what lets the model change while the answer is sent).
void EncodePullPayload(int64_t version, const std::vector<const Variable*>& variables,
                       DType dtype, PullPayload* out);

// Sends `payload` as PullStream messages, through `write`, whose pieces
// reference its bytes; the slices gRPC still holds keep `payload` pinned.
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
