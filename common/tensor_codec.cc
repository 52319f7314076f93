#include "common/tensor_codec.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; this host is not little-endian");

namespace pst {
namespace {

DType Normalized(DType dtype) { return dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype; }

// The converter is a template argument, not a function pointer, so that it
// is inlined and the loop vectorizes: these loops run over every parameter
// and gradient of a 16-bit wire.
template <uint16_t (*convert)(float)>
void Encode16(std::span<const float> values, char* dst) {
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = convert(values[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

template <float (*convert)(uint16_t)>
void Decode16(absl::string_view data, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * i, 2);
    out[i] = convert(bits);
  }
}

}  // namespace

uint16_t FloatToBfloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float Bfloat16ToFloat(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (magnitude >= 0x38800000u) {                       // normal half
    uint32_t m = magnitude - 0x38000000u;               // rebias exponent 127 -> 15
    m += 0xfffu + ((m >> 13) & 1u);                     // round to nearest even
    return sign | static_cast<uint16_t>(m >> 13);
  }
  if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: shift the implicit-one mantissa into place, rounding to even.
  const int exponent = static_cast<int>(magnitude >> 23);
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const int shift = 126 - exponent;  // 14..24
  const uint32_t half_ulp = 1u << (shift - 1);
  uint32_t result = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  if (rest > half_ulp || (rest == half_ulp && (result & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = uint32_t{half & 0x8000u} << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Subnormal (or zero): mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
  return sign ? -magnitude : magnitude;
}

int64_t NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    // Shapes come off the wire: a negative dimension or a product past
    // int64 is no tensor at all, and must not be undefined behaviour.
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

DType WireDType(WireDtype configured) {
  switch (configured) {
    case FP16: return FLOAT16;
    case BF16: return BFLOAT16;
    default: return FLOAT32;
  }
}

int DTypeBytes(DType dtype) {
  switch (Normalized(dtype)) {
    case FLOAT32: return 4;
    case FLOAT16:
    case BFLOAT16: return 2;
    default: return 0;
  }
}

void EncodeValuesTo(std::span<const float> values, DType dtype, char* out) {
  if (values.empty()) return;  // and an empty vector's data() may be null
  switch (Normalized(dtype)) {
    case FLOAT16: Encode16<FloatToHalf>(values, out); break;
    case BFLOAT16: Encode16<FloatToBfloat16>(values, out); break;
    default: std::memcpy(out, values.data(), values.size_bytes()); break;
  }
}

void EncodeValues(std::span<const float> values, DType dtype, std::string* out) {
  if (DTypeBytes(dtype) == sizeof(float)) {  // one copy, without zero-filling `out` first
    out->assign(reinterpret_cast<const char*>(values.data()), values.size_bytes());
    return;
  }
  out->resize(values.size() * DTypeBytes(dtype));
  EncodeValuesTo(values, dtype, out->data());
}

void DecodeValues(absl::string_view data, DType dtype, std::span<float> out) {
  if (out.empty()) return;
  switch (Normalized(dtype)) {
    case FLOAT16: Decode16<HalfToFloat>(data, out); break;
    case BFLOAT16: Decode16<Bfloat16ToFloat>(data, out); break;
    default: std::memcpy(out.data(), data.data(), out.size_bytes()); break;
  }
}

bool EncodedFinite(absl::string_view data, DType dtype) {
  // Integer-only and branch-free: the loops vectorize.
  if (DTypeBytes(dtype) == 4) {
    uint32_t non_finite = 0;
    for (size_t i = 0; i + 4 <= data.size(); i += 4) {
      uint32_t bits;
      std::memcpy(&bits, data.data() + i, 4);
      non_finite |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    return non_finite == 0;
  }
  const uint16_t exponent = Normalized(dtype) == FLOAT16 ? 0x7c00 : 0x7f80;
  uint16_t non_finite = 0;
  for (size_t i = 0; i + 2 <= data.size(); i += 2) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + i, 2);
    non_finite |= (bits & exponent) == exponent;
  }
  return non_finite == 0;
}

absl::Status CheckGradientFinite(absl::string_view data, DType dtype, int64_t first_element,
                                 absl::string_view name) {
  if (EncodedFinite(data, dtype)) return absl::OkStatus();
  const int element_bytes = DTypeBytes(dtype);
  for (size_t i = 0; i + element_bytes <= data.size(); i += element_bytes) {
    float value = 0;
    DecodeValues(data.substr(i, element_bytes), dtype, {&value, 1});
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient for \"", name, "\" has a non-finite value (", value, ") at element ",
          first_element + static_cast<int64_t>(i / element_bytes), "; nothing was applied"));
    }
  }
  return absl::OkStatus();
}

void EncodeTensor(absl::string_view name, std::span<const int64_t> shape,
                  std::span<const float> values, Tensor* tensor, DType dtype) {
  tensor->set_name(std::string(name));
  tensor->mutable_shape()->Assign(shape.begin(), shape.end());
  tensor->set_dtype(Normalized(dtype));
  EncodeValues(values, dtype, tensor->mutable_data());
}

absl::Status CheckTensorPayload(const Tensor& tensor, int64_t expected_elements) {
  const int element_bytes = DTypeBytes(tensor.dtype());
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name(), "\" has unknown dtype ",
                     static_cast<int>(tensor.dtype()), "; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  int64_t expected_bytes = 0;
  if (expected_elements < 0 ||
      __builtin_mul_overflow(expected_elements, int64_t{element_bytes}, &expected_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor.name(), "\" has a shape with a negative dimension or more elements "
        "than any tensor can hold"));
  }
  if (static_cast<int64_t>(tensor.data().size()) != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name(), "\" carries ", tensor.data().size(),
                     " bytes but its variable needs ", expected_bytes, " (", expected_elements,
                     " ", DType_Name(Normalized(tensor.dtype())), " values)"));
  }
  return absl::OkStatus();
}

void DecodeTensor(const Tensor& tensor, std::span<float> out) {
  DecodeValues(tensor.data(), tensor.dtype(), out);
}

std::span<const float> TensorValues(const Tensor& tensor, std::vector<float>* scratch) {
  const std::string& data = tensor.data();
  if (Normalized(tensor.dtype()) == FLOAT32 &&
      reinterpret_cast<uintptr_t>(data.data()) % alignof(float) == 0) {
    return {reinterpret_cast<const float*>(data.data()), data.size() / sizeof(float)};
  }
  scratch->resize(data.size() / DTypeBytes(tensor.dtype()));
  DecodeTensor(tensor, *scratch);
  return *scratch;
}

}  // namespace pst
