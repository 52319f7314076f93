// An exchange over TCP (exchange_path.h): the push arrives as pieces in
// the call's messages, streamed into the shard's update or reassembled
// (PushIntake), and the answer leaves as messages, during the push where
// the consistency policy lets it (StagedAnswer), else once pulled.
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_TCP_PATH_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_TCP_PATH_H_

#include <optional>

#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/exchange_path.h"

namespace pst {

class TcpPath final : public ExchangePath {
 public:
  explicit TcpPath(const PathContext& context) : ExchangePath(context) {}

  absl::Status Begin() override;
  absl::Status TakePieces(const ReceivedChunk& chunk, Write write) override;
  bool RequestComplete() const override;
  std::optional<absl::Status> ApplyPush(PushResponse* response) override;
  std::optional<grpc::ByteBuffer> AnswerOfThePush(ExchangeDone* done) override;
  absl::Status SendPulled(const std::shared_ptr<PullPayload>& payload, const ExchangeDone& done,
                          Write write) override;

 private:
  // PushIntake's Admit: the push within the limits, its worker named, and
  // the bytes it reassembles reserved.
  absl::Status Admit(const PushRequest& header, int64_t buffered) const;

  std::optional<PushIntake> intake_;    // if it pushes
  std::optional<StagedAnswer> staged_;  // the answer streams during the push
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_TCP_PATH_H_
