#include "common/json_depth.h"

namespace pst {

std::optional<int> LineNestingBeyond(absl::string_view json, int max_depth) {
  int depth = 0;
  int line = 1;
  bool in_string = false;
  bool escaped = false;
  for (char c : json) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return line;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace pst
