// Tensor payloads on the wire: raw little-endian float32 bytes in a
// pst::Tensor. The hosts we target are little-endian, so encoding is a memcpy;
// a big-endian host refuses to build rather than send wrong bytes.
#ifndef PST_COMMON_TENSOR_CODEC_H_
#define PST_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <span>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "ps.pb.h"

namespace pst {

int64_t NumElements(std::span<const int64_t> shape);

// Fills `tensor` with name, shape and the float32 bytes of `values`.
void EncodeTensor(absl::string_view name, std::span<const int64_t> shape,
                  std::span<const float> values, Tensor* tensor);

// Checks that `tensor` holds float32 data of exactly `expected_elements`
// elements; InvalidArgument naming the tensor otherwise.
absl::Status CheckTensorPayload(const Tensor& tensor, int64_t expected_elements);

// Copies the payload into `out` (which must have the payload's element count;
// call CheckTensorPayload first).
void DecodeTensor(const Tensor& tensor, std::span<float> out);

// A read-only float view of the payload without copying, when the payload
// is suitably aligned; otherwise copies into `scratch` and views that.
std::span<const float> TensorValues(const Tensor& tensor, std::vector<float>* scratch);

}  // namespace pst

#endif  // PST_COMMON_TENSOR_CODEC_H_
