#include "ps_server/service/exchange_path.h"

namespace pst {

DType AnswerDType(const PullRequest& pull) {
  return pull.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : pull.dtype();
}

absl::Status ExchangePath::Refuse(absl::Status status) const {
  context_.shard->CountRejectedPush();
  return status;
}

}  // namespace pst
