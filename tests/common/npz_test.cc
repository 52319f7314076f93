#include "common/npz.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(NpyFileTest, HeaderIsNumpysVersionOnePaddedTo64Bytes) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const struct {
    std::vector<int64_t> shape;
    std::string shape_text;
  } cases[] = {{{2, 3}, "'shape': (2, 3), "}, {{6}, "'shape': (6,), "}, {{1, 6, 1}, "(1, 6, 1)"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.shape_text);
    const std::string file = NpyFile(Float32Array("x", c.shape, values));
    ASSERT_THAT(file, StartsWith(std::string("\x93NUMPY\x01\x00", 8)));
    const size_t header = static_cast<unsigned char>(file[8]) | (static_cast<unsigned char>(file[9]) << 8);
    EXPECT_EQ((10 + header) % 64, 0u);
    EXPECT_EQ(file[10 + header - 1], '\n');
    EXPECT_THAT(file.substr(10, header), HasSubstr("'descr': '<f4', 'fortran_order': False"));
    EXPECT_THAT(file.substr(10, header), HasSubstr(c.shape_text));
    EXPECT_EQ(file.size(), 10 + header + values.size() * sizeof(float));
  }
  const std::vector<int64_t> ids = {7, 1};
  EXPECT_THAT(NpyFile(Int64Array("ids", {2}, ids)), HasSubstr("'descr': '<i8'"));
}

TEST(WriteNpzTest, RefusesArraysThatDoNotMatchTheirShapeOrShareAName) {
  const std::string path = absl::StrCat(ScratchDir(), "/refused.npz");
  const std::vector<float> three = {1, 2, 3};
  EXPECT_EQ(WriteNpz(path, {Float32Array("a", {2, 2}, three)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteNpz(path, {Float32Array("a", {3}, three), Float32Array("a", {3}, three)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(WriteNpz("/nonexistent-dir/x.npz", {}).code(), absl::StatusCode::kUnavailable);
}

// numpy reads what WriteNpz writes.
TEST(WriteNpzTest, NumpyLoadsTheArrays) {
  // The suite's packages include python3-numpy: its absence is a broken setup, not a skip.
  ASSERT_EQ(RunCommand("/usr/bin/python3 -c 'import numpy'", 60).exit_code, 0)
      << "no numpy for /usr/bin/python3; scripts/install_deps.sh installs python3-numpy";
  const std::string path = absl::StrCat(ScratchDir(), "/model.npz");
  const std::vector<float> kernel = {1.5f, -2, 3, 4, 5, 6};
  const std::vector<int64_t> ids = {-1, 5, int64_t{1} << 40};
  ASSERT_TRUE(WriteNpz(path, {Float32Array("dense_0/kernel", {2, 3}, kernel),
                              Int64Array("emb.ids", {3}, ids), Float32Array("empty", {0, 4}, {})})
                  .ok());
  const CommandResult r = RunCommand(
      absl::StrCat("/usr/bin/python3 -c \"import numpy as np; z = np.load('", path,
                   "'); print(sorted(z.files), z['dense_0/kernel'].tolist(), z['emb.ids'].tolist(), "
                   "z['emb.ids'].dtype, z['empty'].shape)\""),
      60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "['dense_0/kernel', 'emb.ids', 'empty'] [[1.5, -2.0, 3.0], [4.0, 5.0, 6.0]] "
            "[-1, 5, 1099511627776] int64 (0, 4)\n");
}

}  // namespace PST_FILE_ID
}  // namespace pst
