// What the binding's translation units share (python/module.cc,
// python/bind_rows.cc): an absl::Status on its way to Python, which
// module.cc's translator raises as the pstrain.Error of its code, and the
// buffers of Python arrays as spans, read and written where they lie.
#ifndef PST_PYTHON_BINDING_H_
#define PST_PYTHON_BINDING_H_

#include <pybind11/pybind11.h>

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pst {

// A failed call on its way to Python: raised as the pstrain.Error of its code.
struct StatusError {
  absl::Status status;
};

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

// The buffer of `array` as a span of `Element` (float or uint64_t, const
// to read), which must be C-contiguous; `elements`, if not negative, is
// the size it must have. TypeError or ValueError naming `what`. The view
// stays open while `held` lives, which must end with the GIL held.
template <typename Element>
std::span<Element> BufferSpan(pybind11::handle array, const std::string& what,
                              pybind11::ssize_t elements, std::vector<pybind11::buffer_info>* held) {
  namespace py = pybind11;
  using Plain = std::remove_const_t<Element>;
  py::buffer buffer = py::reinterpret_borrow<py::buffer>(array);
  py::buffer_info info = buffer.request(!std::is_const_v<Element>);
  const bool is_float = std::is_same_v<Plain, float>;
  // NumPy names 64-bit integers 'l', 'q', 'L' or 'Q'; the bits are taken as they are.
  const bool matches = is_float ? info.format == py::format_descriptor<float>::format()
                                : (info.format == "l" || info.format == "q" ||
                                   info.format == "L" || info.format == "Q");
  if (!matches || info.itemsize != static_cast<py::ssize_t>(sizeof(Plain))) {
    throw py::type_error(absl::StrCat(what, ": ", is_float ? "float32" : "64-bit integers",
                                      " needed, got format '", info.format, "'"));
  }
  py::ssize_t expected_stride = info.itemsize;
  for (py::ssize_t d = info.ndim; d-- > 0;) {
    if (info.shape[d] > 1 && info.strides[d] != expected_stride) {
      throw py::type_error(absl::StrCat(what, ": not C-contiguous; pass a contiguous array"));
    }
    expected_stride *= info.shape[d];
  }
  if (elements >= 0 && info.size != elements) {
    throw py::value_error(
        absl::StrCat(what, ": ", info.size, " elements, but ", elements, " are needed"));
  }
  std::span<Element> span(static_cast<Element*>(info.ptr), static_cast<size_t>(info.size));
  held->push_back(std::move(info));
  return span;
}

// Binds the session's embedding-table calls (python/bind_rows.cc) to the
// module's Session class.
void BindRows(pybind11::module_& module);

}  // namespace pst

#endif  // PST_PYTHON_BINDING_H_
