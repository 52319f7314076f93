#include "placement/variable_spec.h"

namespace pst {

int64_t VariableSpec::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace pst
