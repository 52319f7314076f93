// Turning a DeviceSpec into a compute backend, and GPU discovery.
//
// The same functions exist in every build: without the CUDA kernels compiled
// in, VisibleGpuCount() is 0 and MakeCudaKernels() returns
// FailedPrecondition saying so, so callers need no #ifdefs.
//
// Several workers may use the same GPU; each backend has its own CUDA stream
// and cuBLAS handle.
#ifndef PST_KERNELS_DEVICE_H_
#define PST_KERNELS_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device_spec.h"
#include "kernels/kernels.h"

namespace pst {

// Whether this binary was built with the CUDA kernels.
bool CudaCompiledIn();

// GPUs the CUDA runtime can use here; 0 without CUDA support, without a
// driver, or on any CUDA error.
int VisibleGpuCount();

// Why VisibleGpuCount() is 0 ("" when it is not): the build has no CUDA, or
// the CUDA runtime's error (no driver, a driver too old for this runtime).
std::string NoGpuReason();

// The cuBLAS + CUDA backend on `device`. InvalidArgument for a device that
// is not visible, FailedPrecondition in a build without CUDA, the CUDA or
// cuBLAS error (call named) if the device cannot be set up.
absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(int device);

// The backend for `spec` and the worker of rank `rank`: kAuto resolves as
// ResolveDevice(spec, rank, VisibleGpuCount()) does.
absl::StatusOr<std::unique_ptr<Kernels>> MakeKernelsFor(const DeviceSpec& spec, int rank);

}  // namespace pst

#endif  // PST_KERNELS_DEVICE_H_
