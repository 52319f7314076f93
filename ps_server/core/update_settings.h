// What one update applies besides its gradient: the consistency policy's
// learning-rate scale, the rates a worker's optimizer sent with its push
// (UpdateRates in ps.proto: a torch optimizer's param groups and their
// scheduler's current rates) and the gradient clipping, resolved per
// variable or table by name.
#ifndef PST_PS_SERVER_CORE_UPDATE_SETTINGS_H_
#define PST_PS_SERVER_CORE_UPDATE_SETTINGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ps.pb.h"
#include "ps_server/optimizers/optimizer.h"

namespace pst {

struct UpdateSettings {
  UpdateSettings() = default;
  UpdateSettings(float lr_scale, const UpdateRates* rates) : lr_scale(lr_scale), rates(rates) {}

  float lr_scale = 1.0f;
  // The push's rates (in SYNC, the rates of the step's lowest-ranked
  // push); null: the config's. Must outlive the staging.
  const UpdateRates* rates = nullptr;
  // What every gradient value is multiplied by (the clipping's factor).
  float gradient_scale = 1.0f;

  // The optimizer step of the variable or table `name`, at its update `t`,
  // with `optimizer`'s configured decay.
  Optimizer::Step StepOf(const Optimizer& optimizer, const std::string& name, int64_t t) const;
};

// Gives `to` the rates of `from` (none if it has none): a push rebuilt
// from its header, in a buffer reused from push to push.
void CopyRates(const PushRequest& from, PushRequest* to);

// InvalidArgument unless every rate is finite and >= 0.
absl::Status CheckUpdateRates(const UpdateRates& rates);

// The clipping's bound for an update with `rates` under a config bound of
// `configured`: the push's when it names one; 0 means no clipping.
float ClipNorm(const UpdateRates* rates, float configured);

// torch.nn.utils.clip_grad_norm_'s factor for a gradient whose squared
// 2-norm is `squared_norm`: min(1, clip_norm / (norm + 1e-6)); 1 when
// clip_norm is 0.
float ClipFactor(double squared_norm, float clip_norm);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_UPDATE_SETTINGS_H_
