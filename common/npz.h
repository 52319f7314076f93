// A model as named arrays, written as numpy's .npz: a zip archive of one
// .npy file per array (numpy's format version 1.0, little-endian, C
// order), stored uncompressed, so `numpy.load(path)` reads it without
// pstrain. What `psctl export` and the worker's --export_model write.
#ifndef PST_COMMON_NPZ_H_
#define PST_COMMON_NPZ_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pst {

// One array: its name (the key numpy.load gives it; may hold '/', as
// "dense_0/kernel"), its element type, its shape (empty for a scalar) and
// its elements' bytes, little-endian, in C order.
struct NpzArray {
  enum class DType { kFloat32, kInt64 };
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;
};

NpzArray Float32Array(std::string name, std::vector<int64_t> shape, std::span<const float> values);
NpzArray Int64Array(std::string name, std::vector<int64_t> shape, std::span<const int64_t> values);

// The .npy file of `array`: the magic, the header dict padded so that the
// data starts at a multiple of 64 bytes, then the data.
std::string NpyFile(const NpzArray& array);

// Writes `arrays` to `path` as an .npz, through a temporary file renamed
// into place. InvalidArgument when two arrays share a name, an array's
// data does not match its shape, or a member or the archive would pass
// 4 GiB (the zip format without its ZIP64 extension); Unavailable when the
// file cannot be written.
absl::Status WriteNpz(const std::string& path, const std::vector<NpzArray>& arrays);

}  // namespace pst

#endif  // PST_COMMON_NPZ_H_
