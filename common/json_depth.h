// How deep a JSON text nests, found before it is parsed: protobuf's JSON
// parser gives up on deep nesting without saying so clearly (a config of
// 100 000 nested arrays was reported as having an empty cluster.ps), so the
// callers bound it first and say where.
#ifndef PST_COMMON_JSON_DEPTH_H_
#define PST_COMMON_JSON_DEPTH_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace pst {

// The 1-based line on which `json` first opens more than `max_depth`
// objects and arrays at once (strings, escapes included, are skipped);
// nullopt if it never does.
std::optional<int> LineNestingBeyond(absl::string_view json, int max_depth);

}  // namespace pst

#endif  // PST_COMMON_JSON_DEPTH_H_
