#include "data/auc.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace pst {

double Auc(std::span<const float> scores, std::span<const float> labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0.0;
  double positives = 0.0;
  for (size_t i = 0; i < order.size();) {
    size_t tie_end = i;
    while (tie_end < order.size() && scores[order[tie_end]] == scores[order[i]]) ++tie_end;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(tie_end)) / 2.0;
    for (size_t k = i; k < tie_end; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_rank_sum += mean_rank;
        positives += 1.0;
      }
    }
    i = tie_end;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0.0 || negatives == 0.0) return 0.5;
  return (positive_rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives);
}

double LogLoss(std::span<const float> probabilities, std::span<const float> labels) {
  if (probabilities.empty()) return 0.0;
  double sum = 0.0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probabilities[i]), 1e-7, 1.0 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(probabilities.size());
}

}  // namespace pst
