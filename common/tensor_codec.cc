#include "common/tensor_codec.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian float32; this host is not little-endian");

namespace pst {

int64_t NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void EncodeTensor(absl::string_view name, std::span<const int64_t> shape,
                  std::span<const float> values, Tensor* tensor) {
  tensor->set_name(std::string(name));
  tensor->mutable_shape()->Assign(shape.begin(), shape.end());
  tensor->set_dtype(FLOAT32);
  tensor->set_data(reinterpret_cast<const char*>(values.data()), values.size_bytes());
}

absl::Status CheckTensorPayload(const Tensor& tensor, int64_t expected_elements) {
  if (tensor.dtype() != FLOAT32 && tensor.dtype() != DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name(), "\" has dtype ", DType_Name(tensor.dtype()),
                     "; only FLOAT32 is accepted"));
  }
  int64_t expected_bytes = expected_elements * static_cast<int64_t>(sizeof(float));
  if (static_cast<int64_t>(tensor.data().size()) != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name(), "\" carries ", tensor.data().size(),
                     " bytes but its variable needs ", expected_bytes, " (", expected_elements,
                     " float32 values)"));
  }
  return absl::OkStatus();
}

void DecodeTensor(const Tensor& tensor, std::span<float> out) {
  std::memcpy(out.data(), tensor.data().data(), out.size_bytes());
}

std::span<const float> TensorValues(const Tensor& tensor, std::vector<float>* scratch) {
  const std::string& data = tensor.data();
  size_t count = data.size() / sizeof(float);
  if (reinterpret_cast<uintptr_t>(data.data()) % alignof(float) == 0) {
    return {reinterpret_cast<const float*>(data.data()), count};
  }
  scratch->resize(count);
  std::memcpy(scratch->data(), data.data(), count * sizeof(float));
  return *scratch;
}

}  // namespace pst
