// A model variable as the parameter servers see it: a name and a shape.
// The model declares its variables this way, and placement cuts and spreads
// them over the PS shards (placement/placement.h).
#ifndef PST_PLACEMENT_VARIABLE_SPEC_H_
#define PST_PLACEMENT_VARIABLE_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pst {

struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Elements: the product of the shape (1 for a scalar).
  int64_t size() const;
};

}  // namespace pst

#endif  // PST_PLACEMENT_VARIABLE_SPEC_H_
