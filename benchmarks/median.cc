#include "benchmarks/median.h"

#include <algorithm>

namespace pst {

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

}  // namespace pst
