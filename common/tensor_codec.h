// Tensor payloads on the wire: raw little-endian bytes in a pst::Tensor, as
// float32 or, to halve the bytes, float16 or bfloat16. The hosts we target
// are little-endian, so float32 encoding is a memcpy; a big-endian host
// refuses to build rather than send wrong bytes.
#ifndef PST_COMMON_TENSOR_CODEC_H_
#define PST_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ps.pb.h"

namespace pst {

// The product of the dimensions; -1 for a negative dimension or a product
// that does not fit in int64.
int64_t NumElements(std::span<const int64_t> shape);

// The wire type a config's training.wire_dtype names.
DType WireDType(WireDtype configured);

// Bytes per element of a wire type; 0 for a type this build does not know.
int DTypeBytes(DType dtype);

// `values` encoded as `dtype`, replacing `out`'s contents (its capacity is
// reused).
void EncodeValues(std::span<const float> values, DType dtype, std::string* out);

// `values` encoded as `dtype` into `out`, which has room for
// values.size() * DTypeBytes(dtype) bytes.
void EncodeValuesTo(std::span<const float> values, DType dtype, char* out);
// Decodes `data`, which holds out.size() elements of `dtype`, into `out`.
void DecodeValues(absl::string_view data, DType dtype, std::span<float> out);

// Whether every value of `data` (elements of `dtype`) is finite, read from
// the encoded bits: a value is Inf or NaN exactly when its exponent bits
// are all ones, so a 16-bit payload is not decoded just to be checked.
bool EncodedFinite(absl::string_view data, DType dtype);
// OK if every value of `data` (elements of `dtype`) is finite; else
// InvalidArgument naming gradient `name` and the first value that is not,
// counting elements from `first_element`. As fast as EncodedFinite where
// every value is finite: the message is built only for a refusal.
absl::Status CheckGradientFinite(absl::string_view data, DType dtype, int64_t first_element,
                                 absl::string_view name);
// Fills `tensor` with name, shape and `values` encoded as `dtype`.
void EncodeTensor(absl::string_view name, std::span<const int64_t> shape,
                  std::span<const float> values, Tensor* tensor, DType dtype = FLOAT32);

// Checks that `tensor` holds a known dtype and exactly `expected_elements`
// elements; InvalidArgument naming the tensor otherwise.
absl::Status CheckTensorPayload(const Tensor& tensor, int64_t expected_elements);

// Decodes the payload into `out`, which must have the payload's element
// count (call CheckTensorPayload first).
void DecodeTensor(const Tensor& tensor, std::span<float> out);

// The payload as floats: a view of the bytes when they are aligned float32,
// otherwise decoded into `scratch`. Call CheckTensorPayload first.
std::span<const float> TensorValues(const Tensor& tensor, std::vector<float>* scratch);

// Scalar conversions, exposed for tests.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
uint16_t FloatToBfloat16(float value);
float Bfloat16ToFloat(uint16_t bits);

}  // namespace pst

#endif  // PST_COMMON_TENSOR_CODEC_H_
