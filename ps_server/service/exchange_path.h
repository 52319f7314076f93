// How an exchange's bytes travel, for its call (ps_server/service/exchange_call.h):
// a strategy picked once from the exchange's header. Over TCP (TcpPath,
// exchange_tcp_path.h) the push arrives as pieces in the call's messages
// and the answer leaves as messages; through a worker's shared region
// (ShmPath, exchange_shm_path.h) both lie in the region and the messages
// carry headers only. The call drives its path through the phases of
// exchange_phase.h, one step at a time: a path is not thread-safe.
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_PATH_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_PATH_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "ps.pb.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/open_streams.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/rpc_limits.h"

namespace pst {

// What an exchange asks, read from its first message; a path never changes it.
struct ExchangeAsks {
  PushRequest header;    // the push's gradients, without data, and the worker
  // Its pull, if it pulls: the worker's, naming the pushed variables if it
  // pushes, and the rows it names.
  PullRequest pull;
  ShmTransfer transfer;  // where in the worker's region, if shared
  bool pushes = false;   // the header carries gradients or rows
  // The answer carries dense variables: false for a push of rows alone,
  // whose pushed variables are none.
  bool pulls_variables = true;
  bool pulls = false;    // the first message carries a pull
  bool shared = false;   // the first message names a region
};

// The bytes an exchange took in and sent, for its metrics.
struct ExchangeTraffic {
  int64_t in = 0;
  int64_t out = 0;
};

// What a path works with; the call's, all of it outliving the path.
struct PathContext {
  const ExchangeAsks* asks;
  ParameterShard* shard;
  const RpcLimits* limits;
  OpenStreams::Stream* stream;
  grpc::ServerContext* call;  // cancelled when a streamed push stalls others
  PullPayloadPool* payloads;
  // Where a push is reassembled, or read out of a region: reused memory.
  PushRequest* buffer;
  ExchangeTraffic* traffic;
};

// The pull's wire dtype: float32 unless it names another.
DType AnswerDType(const PullRequest& pull);

class ExchangePath {
 public:
  // Queues one of the answer's messages on the call.
  using Write = absl::FunctionRef<void(grpc::ByteBuffer message)>;

  virtual ~ExchangePath() = default;

  // Starts the exchange, its header taken: names the worker on the stream
  // (OpenStreams::Stream::ClaimWorker) and, for a TCP push, admits it
  // (rpc_limits.h) and begins its intake. An error ends the call.
  virtual absl::Status Begin() = 0;
  // Takes one message's pieces (there are some). An answer that flows
  // while the push streams in is written as its values are staged.
  virtual absl::Status TakePieces(const ReceivedChunk& chunk, Write write) = 0;
  // Whether the request holds all the exchange needs: nothing more is read.
  virtual bool RequestComplete() const = 0;
  // Applies the push, once the request is complete: nullopt, with nothing
  // applied, while it must wait for its turn (ParameterShard::
  // AwaitUpdateTurnOrWait); then called again. `response` gets the outcome.
  virtual std::optional<absl::Status> ApplyPush(PushResponse* response) = 0;
  // Once the push is applied, `done` holding its outcome: the answer's last
  // message if the push is the whole answer (the exchange pulls nothing, or
  // its answer was made as the push was staged: `done` gets its version);
  // nullopt when the answer is to be pulled.
  virtual std::optional<grpc::ByteBuffer> AnswerOfThePush(ExchangeDone* done) = 0;
  // Sends a pulled answer, and `done` in its last message. Drops the
  // payload's references to the variables.
  virtual absl::Status SendPulled(const std::shared_ptr<PullPayload>& payload,
                                  const ExchangeDone& done, Write write) = 0;

 protected:
  explicit ExchangePath(const PathContext& context) : context_(context) {}
  // A malformed push, counted as a rejected one.
  absl::Status Refuse(absl::Status status) const;

  const PathContext context_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_PATH_H_
