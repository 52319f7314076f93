// The server's end of the chunked data plane (common/tensor_stream.h):
// reassembling a PushStream into a PushRequest and cutting a PullResponse
// into a PullStream.
#ifndef PST_PS_SERVER_CHUNK_STREAMS_H_
#define PST_PS_SERVER_CHUNK_STREAMS_H_

#include "absl/status/status.h"
#include "grpcpp/support/sync_stream.h"
#include "ps.pb.h"
#include "ps_server/parameter_shard.h"

namespace pst {

// Reads a whole PushStream into `request` (cleared, or reused from an earlier
// call: its buffers are reused). The header is checked against `shard` before
// any payload is buffered; pieces must follow the stream rules. On
// InvalidArgument or FailedPrecondition, `request` is garbage, the model
// untouched and the refusal counted in the shard's pushes_rejected; nothing
// is applied here either way (the caller calls Push).
absl::Status ReceivePushStream(grpc::ServerReaderInterface<PushChunk>* reader,
                               ParameterShard* shard, PushRequest* request);

// A pull's messages: the header, then pieces of at most kChunkBytes each.
// Cleared messages keep their buffers, so a reused PullChunks encodes the
// next pull into warm memory.
struct PullChunks {
  std::vector<PullChunk> messages;
  size_t used = 0;
  void Clear() {
    for (PullChunk& message : messages) message.Clear();
    used = 0;
  }
};

// Encodes `variables` at `version` in wire type `dtype` into `out`, straight
// from the variables (meant for ParameterShard::PullVisit).
void EncodePullChunks(int64_t version, const std::vector<const Variable*>& variables,
                      DType dtype, PullChunks* out);

// Writes the messages; false if the client went away.
bool SendPullChunks(const PullChunks& chunks, grpc::ServerWriterInterface<PullChunk>* writer);

}  // namespace pst

#endif  // PST_PS_SERVER_CHUNK_STREAMS_H_
