// The device a worker computes on, as written in --device and
// training.device:
//   "auto" or ""  a GPU when one is visible (the worker of rank r takes
//                 gpu:(r % visible GPUs), so workers spread over them),
//                 else the CPU
//   "cpu"         the CPU kernels (OpenBLAS)
//   "gpu:N"       CUDA device N (as numbered under CUDA_VISIBLE_DEVICES)
// Parsing only; kernels/device.h turns a spec into a backend.
#ifndef PST_KERNELS_DEVICE_SPEC_H_
#define PST_KERNELS_DEVICE_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

struct DeviceSpec {
  enum class Kind { kAuto, kCpu, kGpu };
  Kind kind = Kind::kAuto;
  int gpu = 0;  // for kGpu

  std::string ToString() const;  // "auto", "cpu", "gpu:N"
};

// InvalidArgument naming the string and the accepted forms.
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// The devices of a worker's towers, as written in --devices and
// training.devices: comma-separated items, each
//   "cpu"      one CPU tower
//   "cpu:N"    N CPU towers, each on its own thread
//   "gpu:N"    one tower on CUDA device N
//   "gpu:all"  one tower on every visible GPU (alone in the list)
// An empty list means one tower on training.device.
struct DeviceList {
  std::vector<DeviceSpec> towers;  // in tower order; empty when every_gpu
  bool every_gpu = false;

  std::string ToString() const;  // "cpu:2", "gpu:0,gpu:1", "gpu:all"
};

// InvalidArgument naming the item and the accepted forms; a list of more
// than kMaxTowers towers, or gpu:all beside other items, is refused too.
absl::StatusOr<DeviceList> ParseDeviceList(absl::string_view text);
inline constexpr int kMaxTowers = 64;

// The device the worker of rank `rank` uses where the CUDA runtime sees
// `visible_gpus` GPUs: kAuto becomes gpu:(rank % visible_gpus), or cpu when
// there is none; cpu and gpu:N are returned as they are.
DeviceSpec ResolveDevice(const DeviceSpec& spec, int rank, int visible_gpus);

}  // namespace pst

#endif  // PST_KERNELS_DEVICE_SPEC_H_
