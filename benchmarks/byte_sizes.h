// Model sizes as the benchmarks' --sizes flags spell them ("4KiB", "64MiB").
#ifndef PST_BENCHMARKS_BYTE_SIZES_H_
#define PST_BENCHMARKS_BYTE_SIZES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

// A positive number of bytes with a unit: B, KiB, MiB or GiB. The error
// names the text as --sizes did.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// A comma-separated list of them, in order.
absl::StatusOr<std::vector<int64_t>> ParseByteSizes(absl::string_view list);

// The shortest exact spelling: "64MiB", "4KiB", "100B".
std::string ByteSizeName(int64_t bytes);

}  // namespace pst

#endif  // PST_BENCHMARKS_BYTE_SIZES_H_
