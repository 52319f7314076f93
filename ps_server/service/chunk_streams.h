// The server's end of the chunked data plane (common/tensor_stream.h,
// rpc/chunk_wire.h), free of any call: taking an exchange's push a message
// at a time (applied as it streams in, or reassembled into a PushRequest),
// the answer's messages while the push streams in, and a pull's answer as
// messages, over raw gRPC byte buffers. ps_server/service/exchange_call.h drives
// them from a call's completion-queue events.
#ifndef PST_PS_SERVER_SERVICE_CHUNK_STREAMS_H_
#define PST_PS_SERVER_SERVICE_CHUNK_STREAMS_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "common/tensor_stream.h"
#include "ps.pb.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/streamed_update.h"
#include "rpc/chunk_wire.h"

namespace pst {

// An exchange's push, taken a message at a time. When the shard can apply
// it as it streams in (ParameterShard::BeginStreamedPush), each piece is
// staged as it lands, straight from gRPC's buffers, and the update is
// committed once the stream has ended. Otherwise the pieces are
// reassembled into `buffer`, whose memory is reused from an earlier call
// (every field is overwritten; a payload of the same size costs no
// allocation), with the embedding rows the header carries inline (a push
// with rows is always reassembled), and the request is pushed once
// complete. Either way the
// header is checked against the shard before any payload is taken, pieces
// must follow the stream rules, and every value is checked to be finite as
// it is copied, before anything of the push is applied. A refused push
// leaves the model untouched and is counted in pushes_rejected (refusals
// by `admit` excepted). Not thread-safe: one call's events drive it, one
// at a time.
class PushIntake {
 public:
  // Given the header, once the shard has accepted it, and the bytes the
  // push will hold until it is applied (its share, when it is reassembled;
  // 0 when it streams into the update). An error refuses the push before
  // any payload is taken, uncounted: e.g. the limits of rpc_limits.h.
  using Admit = std::function<absl::Status(const PushRequest& header, int64_t buffered_bytes)>;

  // `shard` and `buffer` must outlive the intake.
  PushIntake(ParameterShard* shard, PushRequest* buffer) : shard_(shard), buffer_(buffer) {}

  // Starts the push `header` announces. `cancel` ends the call: the shard
  // uses it on a streamed push that stalls while other updates wait.
  absl::Status Begin(const PushRequest& header, const Admit& admit, std::function<void()> cancel);
  // Takes the pieces of one message (the first included).
  absl::Status Take(const ReceivedChunk& chunk);
  // Whether every byte the header announced has arrived.
  bool complete() const { return sequence_.has_value() && sequence_->Finish().ok(); }
  // The update the push streams into; null when it is reassembled.
  const StreamedUpdate* update() const { return update_.get(); }

  // Once the request stream has ended: commits the streamed update, or
  // pushes the reassembled request. nullopt, with nothing done, when the
  // push would wait for its turn (ParameterShard::TryPush): call again once
  // ParameterShard::AwaitUpdateTurnOrWait wakes. `response` gets what
  // became of the push.
  std::optional<absl::Status> Finish(PushResponse* response);

 private:
  absl::Status Refuse(absl::Status status);

  ParameterShard* const shard_;
  PushRequest* const buffer_;
  PushRequest header_;
  std::optional<PieceSequence> sequence_;
  std::unique_ptr<StreamedUpdate> update_;  // null: reassembled
};

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

// Sends `payload` as answer messages, through `write`. float32 pieces
// reference the variables' buffers, 16-bit ones the encoding made here
// (outside the shard's lock); the slices gRPC still holds keep what they
// reference alive. Drops the payload's references to the variables.
// Returns the bytes written, or -1 if a write failed (the client went away).
// `last_extra`, if given, goes into the last message as its field 3
// (ExchangeAnswer.done). An answer of at most one chunk is one message.
// `write` is told which message is the answer's last.
using WriteMessage = absl::FunctionRef<bool(const grpc::ByteBuffer&, bool last)>;
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

// Makes `pull` the pull half of an exchange that pushes: this worker's,
// asking for the pushed variables: in the order the pull names them if it
// names exactly those (the worker's next forward pass wants its first
// layer first, while the push came last layer first), else in the push's
// order.
void AskForPushedVariables(const PushRequest& push, PullRequest* pull);

// The header of an answer of the pushed variables' new values, in the
// push's order, as `dtype`: names and shapes, no data, version 0.
PullResponse PushedVariablesHeader(const PushRequest& push, DType dtype);

// The answer of an exchange whose push streams into the update and whose
// answer may flow during the push (ConsistencyPolicy::
// AnswerMayStreamDuringPush): each message's new values as soon as they
// are staged, from the staging buffers themselves (float32) or encoded
// into `payload`. The header goes with the first values, at version 0.
class StagedAnswer {
 public:
  // `header` is the push's; `dtype` the pull's wire type.
  StagedAnswer(const PushRequest& header, DType dtype, std::shared_ptr<PullPayload> payload);
  // Adds the new values of `chunk`'s pieces, just staged into `update`, to
  // the message being built.
  void Add(const ReceivedChunk& chunk, const StreamedUpdate& update);
  // The message built since the last Take, with `done` in it if given;
  // the builder starts afresh.
  grpc::ByteBuffer Take(const ExchangeDone* done);

 private:
  // 16-bit answers are encoded into the payload's buffer, one region per
  // variable.
  void PrepareEncoding(const StreamedUpdate& update);

  DType dtype_;
  std::shared_ptr<PullPayload> payload_;
  PullResponse answer_;  // the header: the pushed variables, no data
  std::vector<int> gradient_element_bytes_;
  std::vector<char*> encoded_;
  bool header_sent_ = false;
  ChunkBuilder builder_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_CHUNK_STREAMS_H_
