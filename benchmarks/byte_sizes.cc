#include "benchmarks/byte_sizes.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pst {

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  struct Unit {
    const char* suffix;
    int64_t factor;
  };
  for (Unit unit : {Unit{"GiB", 1LL << 30}, Unit{"MiB", 1 << 20}, Unit{"KiB", 1 << 10}, Unit{"B", 1}}) {
    if (absl::EndsWith(text, unit.suffix)) {
      int64_t number = 0;
      if (absl::SimpleAtoi(text.substr(0, text.size() - strlen(unit.suffix)), &number) && number > 0) {
        return number * unit.factor;
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--sizes: cannot read \"", text, "\" (e.g. 4KiB, 64MiB)"));
}

absl::StatusOr<std::vector<int64_t>> ParseByteSizes(absl::string_view list) {
  std::vector<int64_t> sizes;
  for (absl::string_view text : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    absl::StatusOr<int64_t> size = ParseByteSize(text);
    if (!size.ok()) return size.status();
    sizes.push_back(*size);
  }
  return sizes;
}

std::string ByteSizeName(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, "MiB");
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, "KiB");
  return absl::StrCat(bytes, "B");
}

}  // namespace pst
