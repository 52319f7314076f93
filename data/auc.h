// Quality measures of a click model's predictions.
#ifndef PST_DATA_AUC_H_
#define PST_DATA_AUC_H_

#include <span>

namespace pst {

// Area under the ROC curve of `scores` against 0/1 `labels` (the
// Mann-Whitney statistic; tied scores count half). 0.5 when the labels are
// all equal.
double Auc(std::span<const float> scores, std::span<const float> labels);

// Mean log-loss of click probabilities `probabilities` (clamped into
// [1e-7, 1 - 1e-7]) against 0/1 `labels`.
double LogLoss(std::span<const float> probabilities, std::span<const float> labels);

}  // namespace pst

#endif  // PST_DATA_AUC_H_
