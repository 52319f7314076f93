// An exchange through its worker's shared region (exchange_path.h,
// ps_server/service/shm_exchange.h): the push is staged straight out of the region
// when the shard can stream it, else read whole into the push buffer; the
// answer is written into the region, as the push is staged where the
// consistency policy lets it, else once pulled; embedding rows named in
// the region are read out of it by the call (ReadShmRows) before the push
// is applied, and the rows answered are written into it. The messages
// carry headers only. The region is claimed by the call (ShmRegions::TryClaim) and handed
// over with TakeRegion before the push is applied or the pull answered.
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_SHM_PATH_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_SHM_PATH_H_

#include <memory>

#include "ps_server/service/exchange_path.h"
#include "ps_server/shm/shm_regions.h"
#include "ps_server/core/streamed_update.h"

namespace pst {

class ShmPath final : public ExchangePath {
 public:
  explicit ShmPath(const PathContext& context) : ExchangePath(context) {}

  // The region the exchange names, and the call's once claimed; held until
  // the exchange is answered, then given back for the worker's next one.
  uint64_t region_handle() const { return context_.asks->transfer.region(); }
  absl::Status TakeRegion(ShmRegions::Claimed region);
  // The claimed region (after TakeRegion, until the exchange is answered).
  const OpenedRegion& region() const { return *region_; }

  absl::Status Begin() override;
  absl::Status TakePieces(const ReceivedChunk& chunk, Write write) override;
  bool RequestComplete() const override { return true; }
  std::optional<absl::Status> ApplyPush(PushResponse* response) override;
  std::optional<grpc::ByteBuffer> AnswerOfThePush(ExchangeDone* done) override;
  absl::Status SendPulled(const std::shared_ptr<PullPayload>& payload, const ExchangeDone& done,
                          Write write) override;

 private:
  // Where the push stands: still in the region, staged into update_ (with
  // its answer written into the region as it was), or read into the buffer.
  enum class Push { kInRegion, kStaged, kStagedWithAnswer, kRead };

  // Takes the push out of the region: nullopt while another update holds
  // the staging (the gradient waits where it lies).
  std::optional<absl::Status> TakePush();
  // Whether the pull asks for the pushed variables in the push's order, as
  // float32, and no rows, and every gradient names its shape: the new
  // values written as the push is staged are then the whole answer.
  bool AnswerIsThePush() const;

  std::shared_ptr<const OpenedRegion> region_;
  Push push_ = Push::kInRegion;
  std::unique_ptr<StreamedUpdate> update_;
  bool finite_ = false;  // of a push read whole: every value read is finite
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_SHM_PATH_H_
