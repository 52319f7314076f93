// LineNestingBeyond: where a JSON text first nests too deep, strings aside.
#include "common/json_depth.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(JsonDepthTest, FindsTheLineWhereNestingFirstPassesTheBound) {
  struct Case {
    std::string json;
    int max_depth;
    std::optional<int> line;
  };
  const Case cases[] = {
      {R"({"a": [1, {"b": 2}]})", 3, std::nullopt},
      {R"({"a": [1, {"b": 2}]})", 2, 1},
      {"{\n\"a\": [\n[\n1]]}", 2, 3},
      {R"({"a": "[[[[{{{{", "b": "\"[[["})", 1, std::nullopt},  // brackets in strings
      {std::string(100000, '['), 32, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json.substr(0, 40));
    EXPECT_EQ(LineNestingBeyond(c.json, c.max_depth), c.line);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
