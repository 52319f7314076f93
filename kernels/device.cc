#include "kernels/device.h"

namespace pst {

absl::StatusOr<std::unique_ptr<Kernels>> MakeKernelsFor(const DeviceSpec& spec) {
  switch (spec.kind) {
    case DeviceSpec::Kind::kCpu:
      return MakeCpuKernels();
    case DeviceSpec::Kind::kGpu:
      return MakeCudaKernels(spec.gpu);
    case DeviceSpec::Kind::kAuto:
      break;
  }
  if (VisibleGpuCount() > 0) return MakeCudaKernels(0);
  return MakeCpuKernels();
}

}  // namespace pst
