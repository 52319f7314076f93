// Device discovery in a build without the CUDA kernels (PS_WITH_CUDA=OFF or
// no nvcc): there is no GPU to use, and asking for one says why.
#include "absl/strings/str_cat.h"
#include "kernels/device.h"

namespace pst {

bool CudaCompiledIn() { return false; }

int VisibleGpuCount() { return 0; }

std::string NoGpuReason() { return "this build has no CUDA support"; }

absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(int device) {
  return absl::FailedPreconditionError(absl::StrCat(
      "gpu:", device, " requested but ", NoGpuReason(), "; rebuild with nvcc installed "
      "(PS_WITH_CUDA=AUTO or ON)"));
}

}  // namespace pst
