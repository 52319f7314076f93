#include "ps_server/core/update_settings.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

absl::Status CheckRates(const google::protobuf::Map<std::string, float>& rates, const char* what) {
  for (const auto& [name, rate] : rates) {
    if (!std::isfinite(rate) || rate < 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the push's ", what, " for \"", name, "\" is ", rate, "; it must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Optimizer::Step UpdateSettings::StepOf(const Optimizer& optimizer, const std::string& name,
                                       int64_t t) const {
  Optimizer::Step step;
  step.t = t;
  step.lr_scale = lr_scale * optimizer.DecayFactor(t);
  if (rates != nullptr) {
    if (auto it = rates->learning_rates().find(name); it != rates->learning_rates().end()) {
      step.learning_rate = it->second;
    }
    if (auto it = rates->weight_decays().find(name); it != rates->weight_decays().end()) {
      step.weight_decay = it->second;
    }
  }
  return step;
}

void CopyRates(const PushRequest& from, PushRequest* to) {
  if (from.has_rates()) {
    *to->mutable_rates() = from.rates();
  } else {
    to->clear_rates();
  }
}

absl::Status CheckUpdateRates(const UpdateRates& rates) {
  if (absl::Status s = CheckRates(rates.learning_rates(), "learning rate"); !s.ok()) return s;
  if (absl::Status s = CheckRates(rates.weight_decays(), "weight decay"); !s.ok()) return s;
  if (rates.has_clip_norm() && (!std::isfinite(rates.clip_norm()) || rates.clip_norm() < 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the push's clip_norm is ", rates.clip_norm(), "; it must be finite and >= 0 (0: off)"));
  }
  return absl::OkStatus();
}

float ClipNorm(const UpdateRates* rates, float configured) {
  return rates != nullptr && rates->has_clip_norm() ? rates->clip_norm() : configured;
}

float ClipFactor(double squared_norm, float clip_norm) {
  if (clip_norm <= 0.0f) return 1.0f;
  const double factor = clip_norm / (std::sqrt(squared_norm) + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

}  // namespace pst
