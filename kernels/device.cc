#include "kernels/device.h"

namespace pst {

absl::StatusOr<std::unique_ptr<Kernels>> MakeKernelsFor(const DeviceSpec& spec, int rank) {
  const DeviceSpec device =
      spec.kind == DeviceSpec::Kind::kAuto ? ResolveDevice(spec, rank, VisibleGpuCount()) : spec;
  if (device.kind == DeviceSpec::Kind::kGpu) return MakeCudaKernels(device.gpu);
  return MakeCpuKernels();
}

}  // namespace pst
