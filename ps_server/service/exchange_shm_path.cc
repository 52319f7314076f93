#include "ps_server/service/exchange_shm_path.h"

#include "common/tensor_codec.h"
#include "ps_server/service/shm_exchange.h"

namespace pst {

absl::Status ShmPath::Begin() {
  return context_.stream->ClaimWorker(context_.asks->header.worker());
}

absl::Status ShmPath::TakePieces(const ReceivedChunk& /*chunk*/, Write /*write*/) {
  return Refuse(
      absl::InvalidArgumentError("an exchange through shared memory carries no pieces"));
}

absl::Status ShmPath::TakeRegion(ShmRegions::Claimed region) {
  region_ = std::move(region);
  // A push's ranges are checked as they are read; a pull alone checks here.
  return context_.asks->pushes ? absl::OkStatus() : region_->CheckNotShrunk();
}

std::optional<absl::Status> ShmPath::ApplyPush(PushResponse* response) {
  if (push_ == Push::kInRegion) {
    std::optional<absl::Status> taken = TakePush();
    if (!taken || !taken->ok()) return taken;
  }
  if (push_ == Push::kRead) {
    // A non-finite value is left to the shard to refuse (and count).
    return context_.shard->TryPush(*context_.buffer, response, {.values_finite = finite_});
  }
  return context_.shard->CommitStreamedPush(std::move(update_), response);
}

std::optional<absl::Status> ShmPath::TakePush() {
  const ExchangeAsks& asks = *context_.asks;
  const DType dtype = asks.pull.dtype();
  const DType* answer_dtype = asks.pulls ? &dtype : nullptr;
  absl::StatusOr<ParameterShard::StreamedPush> push =
      context_.shard->BeginStreamedPush(asks.header);
  if (!push.ok()) return push.status();  // counted by the shard
  // The gradient waits where it lies for the update staging before it,
  // then is staged out of the region: a copy of it would be one more pass.
  if (push->update == nullptr && push->awaits_turn) return std::nullopt;
  if (push->update == nullptr) {
    // Read whole, for TryPush to apply in its turn (SYNC sums it into the
    // step); a non-finite value is left to the shard to refuse (and count).
    absl::Status read =
        ReadShmPush(asks.header, push->bytes, asks.transfer, answer_dtype, *region_,
                    *context_.limits, context_.buffer, &finite_, &context_.traffic->in);
    if (!read.ok()) return Refuse(read);
    push_ = Push::kRead;
    return absl::OkStatus();
  }
  // Where the answer may flow during the push (as a TCP exchange's
  // streams), each block's new values are written into the region as they
  // are staged, from cache; otherwise the answer is pulled once the update
  // is committed, as for a push read whole.
  const bool answer_as_staged = asks.pulls && AnswerIsThePush() &&
                                context_.shard->AnswerMayStreamDuringPush(
                                    *push->update, asks.pull.min_version());
  if (absl::Status staged = StageShmPush(asks.header, push->bytes, asks.transfer, answer_dtype,
                                         *region_, *context_.limits, push->update.get(),
                                         &context_.traffic->in, answer_as_staged);
      !staged.ok()) {
    return Refuse(staged);  // the update is dropped: nothing of it lands
  }
  if (answer_as_staged) {
    for (int i = 0; i < asks.header.gradients_size(); ++i) {
      context_.traffic->out += push->bytes[i] / DTypeBytes(asks.header.gradients(i).dtype()) *
                               static_cast<int64_t>(sizeof(float));
    }
  }
  push_ = answer_as_staged ? Push::kStagedWithAnswer : Push::kStaged;
  update_ = std::move(push->update);
  return absl::OkStatus();
}

bool ShmPath::AnswerIsThePush() const {
  const ExchangeAsks& asks = *context_.asks;
  if (AnswerDType(asks.pull) != FLOAT32 || !asks.pull.rows().empty() ||
      asks.pull.names_size() != asks.header.gradients_size()) {
    return false;
  }
  for (int i = 0; i < asks.header.gradients_size(); ++i) {
    const Tensor& gradient = asks.header.gradients(i);
    if (asks.pull.names(i) != gradient.name() || gradient.shape().empty()) return false;
  }
  return true;
}

std::optional<grpc::ByteBuffer> ShmPath::AnswerOfThePush(ExchangeDone* done) {
  if (!context_.asks->pulls) {
    region_.reset();  // the worker's next exchange may claim it
    ChunkBuilder builder;
    builder.SetExtra(*done);
    return builder.Finish();
  }
  if (push_ != Push::kStagedWithAnswer) return std::nullopt;
  // The answer was written into the region as it was staged: the
  // committed values.
  region_.reset();
  PullResponse answer = PushedVariablesHeader(context_.asks->header, FLOAT32);
  answer.set_version(done->push().version());
  done->set_version(done->push().version());
  ChunkBuilder builder;
  builder.SetHeader(answer);
  builder.SetExtra(*done);
  return builder.Finish();
}

absl::Status ShmPath::SendPulled(const std::shared_ptr<PullPayload>& payload,
                                 const ExchangeDone& done, Write write) {
  const ShmTransfer& transfer = context_.asks->transfer;
  int64_t written = 0;
  absl::Status status = WriteShmAnswer(payload.get(), *region_, transfer.answer_offset(), &written);
  int64_t rows_written = 0;
  if (status.ok() && RowsAnswerInRegion(transfer)) {
    // The header keeps the tables and dtype; their values go to the region.
    status = WriteShmRowsAnswer(transfer, *region_, &payload->header, &rows_written);
  }
  region_.reset();  // the worker's next exchange may claim it
  if (!status.ok()) return status;
  context_.traffic->out += written + rows_written;
  ChunkBuilder builder;
  builder.SetHeader(payload->header);
  builder.SetExtra(done);
  write(builder.Finish());
  return absl::OkStatus();
}

}  // namespace pst
