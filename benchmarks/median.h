// The median the benchmarks' rows report over their rounds.
#ifndef PST_BENCHMARKS_MEDIAN_H_
#define PST_BENCHMARKS_MEDIAN_H_

#include <vector>

namespace pst {

// The middle value of `values` (the upper one of the two middles for an
// even count, so that it is always a value that was measured); `values`
// must not be empty.
double Median(std::vector<double> values);

}  // namespace pst

#endif  // PST_BENCHMARKS_MEDIAN_H_
