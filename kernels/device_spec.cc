#include "kernels/device_spec.h"

#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pst {

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kGpu:
      return absl::StrCat("gpu:", gpu);
    case Kind::kAuto:
      break;
  }
  return "auto";
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  if (text.empty() || text == "auto") return spec;
  if (text == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  absl::string_view index = text;
  if (absl::ConsumePrefix(&index, "gpu:") && !index.empty() &&
      index.find_first_not_of("0123456789") == absl::string_view::npos &&
      absl::SimpleAtoi(index, &spec.gpu)) {
    spec.kind = DeviceSpec::Kind::kGpu;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", text, "\" is not one of auto, cpu or gpu:N (N = 0, 1, ...)"));
}

DeviceSpec ResolveDevice(const DeviceSpec& spec, int rank, int visible_gpus) {
  if (spec.kind != DeviceSpec::Kind::kAuto) return spec;
  DeviceSpec resolved;
  if (visible_gpus <= 0) {
    resolved.kind = DeviceSpec::Kind::kCpu;
    return resolved;
  }
  resolved.kind = DeviceSpec::Kind::kGpu;
  resolved.gpu = (rank > 0 ? rank : 0) % visible_gpus;
  return resolved;
}

}  // namespace pst
