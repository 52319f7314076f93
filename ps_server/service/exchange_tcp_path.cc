#include "ps_server/service/exchange_tcp_path.h"

#include "common/status_macros.h"

namespace pst {

absl::Status TcpPath::Begin() {
  const ExchangeAsks& asks = *context_.asks;
  if (!asks.pushes) return context_.stream->ClaimWorker(asks.header.worker());
  intake_.emplace(context_.shard, context_.buffer);
  const PushIntake::Admit admit = [this](const PushRequest& header, int64_t buffered) {
    return Admit(header, buffered);
  };
  // Called with the shard's lock held, while the update exists: the call
  // is not done (it drops the update, which takes that lock, once done),
  // and TryCancel runs none of its events here.
  auto cancel = [call = context_.call] { call->TryCancel(); };
  PST_RETURN_IF_ERROR(intake_->Begin(asks.header, admit, cancel));
  // Rows are answered once the push is in (an answer flowing during the
  // push holds the pushed variables only).
  if (asks.pulls && asks.pull.rows().empty() && intake_->update() != nullptr &&
      context_.shard->AnswerMayStreamDuringPush(*intake_->update(), asks.pull.min_version())) {
    staged_.emplace(asks.header, asks.pull.dtype(), context_.payloads->Take());
  }
  return absl::OkStatus();
}

absl::Status TcpPath::Admit(const PushRequest& header, int64_t buffered) const {
  PST_RETURN_IF_ERROR(CheckPushSize(header, *context_.limits));
  PST_RETURN_IF_ERROR(context_.stream->ClaimWorker(header.worker()));
  if (buffered > 0) return context_.stream->ReservePushBuffer(buffered);
  return absl::OkStatus();
}

absl::Status TcpPath::TakePieces(const ReceivedChunk& chunk, Write write) {
  if (!context_.asks->pushes) {
    return Refuse(absl::InvalidArgumentError(
        "an exchange that pushes nothing (no gradients or rows in its header) carries pieces"));
  }
  PST_RETURN_IF_ERROR(intake_->Take(chunk));
  if (staged_) {
    staged_->Add(chunk, *intake_->update());
    // The last values wait for the push's outcome, so that an exchange of
    // one chunk is answered in one message.
    if (!intake_->complete()) write(staged_->Take(nullptr));
  }
  return absl::OkStatus();
}

bool TcpPath::RequestComplete() const {
  return !context_.asks->pushes || (intake_.has_value() && intake_->complete());
}

std::optional<absl::Status> TcpPath::ApplyPush(PushResponse* response) {
  return intake_->Finish(response);
}

std::optional<grpc::ByteBuffer> TcpPath::AnswerOfThePush(ExchangeDone* done) {
  if (!context_.asks->pulls) {
    ChunkBuilder builder;
    builder.SetExtra(*done);
    return builder.Finish();
  }
  if (!staged_) return std::nullopt;
  // The answer went out as it was staged; the push is committed now.
  done->set_version(done->push().version());
  return staged_->Take(done);
}

absl::Status TcpPath::SendPulled(const std::shared_ptr<PullPayload>& payload,
                                 const ExchangeDone& done, Write write) {
  context_.traffic->out += SendPullPayload(
      payload,
      [write](const grpc::ByteBuffer& message, bool /*last: the call ends after it*/) {
        write(message);
        return true;
      },
      &done);
  return absl::OkStatus();
}

}  // namespace pst
