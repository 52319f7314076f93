// Checks of a click-through-rate job's config (training.model.ctr with
// training.dataset.ctr), apart from the rest of the config's checks.
#ifndef PST_COMMON_CTR_CONFIG_H_
#define PST_COMMON_CTR_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "config.pb.h"

namespace pst {

// The categorical fields and dense features each example of `data` has.
struct CtrShape {
  int fields = 0;
  int dense = 0;
};
CtrShape CtrShapeOf(const CtrDataConfig& data);

// InvalidArgument naming the field: a ctr model without ctr data (or ctr
// data without it), a table it names missing from training.model.
// embeddings, a wide table of dim other than 1, a hidden width below 1, no
// data file named, a generator for libsvm files or with bad options.
absl::Status ValidateCtrJob(const TrainingConfig& training);

// The dense parameters of the CTR model's MLP (the tables' rows are not
// counted: they live on the PS and grow with the ids trained).
int64_t CtrDenseParameterCount(const TrainingConfig& training);

}  // namespace pst

#endif  // PST_COMMON_CTR_CONFIG_H_
