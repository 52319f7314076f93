// The Criteo line parser's fields against their definitions: hashes as
// std::from_chars reads them whole in base 16, integers as
// sign(x) log(1 + |x|) rounded once from double, and the column count.
#include "data/ctr_formats.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// A line of label 1, integer columns all `integer`, hash columns all `hash`.
std::string Line(const std::string& integer, const std::string& hash) {
  std::vector<std::string> columns = {"1"};
  columns.insert(columns.end(), kCriteoIntegers, integer);
  columns.insert(columns.end(), kCriteoCategoricals, hash);
  return absl::StrJoin(columns, "\t");
}

TEST(CriteoLineTest, HashesAreWhatFromCharsReadsWholeInBaseSixteen) {
  const std::vector<std::string> texts = {
      "0", "f", "F", "DeadBeef", "9219761e", "0000000000000001", "ffffffffffffffff",
      "FFFFFFFFFFFFFFFF", "fffffffffffffffff", "0x1", "g", "1g", " 1", "1 ", "-1", "+1", "ä"};
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    uint64_t expected = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), expected, 16);
    const bool valid = text.size() <= 16 && error == std::errc() && end == text.data() + text.size();
    CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
    const absl::Status parsed = ParseCriteoLine(Line("1", text), &batch);
    EXPECT_EQ(parsed.ok(), valid) << parsed;
    if (!valid) {
      EXPECT_THAT(std::string(parsed.message()), HasSubstr("not a hexadecimal hash"));
      EXPECT_EQ(batch.size(), 0);
      continue;
    }
    ASSERT_EQ(batch.ids.size(), static_cast<size_t>(kCriteoCategoricals));
    for (int f = 0; f < kCriteoCategoricals; ++f) EXPECT_EQ(batch.ids[f], CategoricalId(f, expected));
  }
}

TEST(CriteoLineTest, IntegersBecomeTheirSignedLogRoundedOnceFromDouble) {
  const std::vector<int64_t> values = {0,     1,     -1,    2,    1022,  1023, 1024, -1023,
                                       -1024, 65535, 12345, -7,   1 << 30,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
  for (const int64_t x : values) {
    SCOPED_TRACE(x);
    const double magnitude = std::log1p(std::abs(static_cast<double>(x)));
    const float expected = static_cast<float>(x < 0 ? -magnitude : magnitude);
    CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
    ASSERT_TRUE(ParseCriteoLine(Line(absl::StrCat(x), "a"), &batch).ok());
    ASSERT_EQ(batch.dense.size(), static_cast<size_t>(kCriteoIntegers));
    for (const float d : batch.dense) EXPECT_EQ(d, expected);
  }
}

TEST(CriteoLineTest, MissingColumnsAreEmptyAndAWrongColumnCountIsNamed) {
  CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
  ASSERT_TRUE(ParseCriteoLine(Line("", ""), &batch).ok());
  EXPECT_EQ(batch.size(), 1);
  EXPECT_TRUE(batch.ids.empty());
  for (const float d : batch.dense) EXPECT_EQ(d, 0.0f);
  for (const std::string& line : {Line("1", "a") + "\tb", Line("1", "a").substr(2), std::string()}) {
    const absl::Status parsed = ParseCriteoLine(line, &batch);
    EXPECT_THAT(std::string(parsed.message()), HasSubstr("tab-separated columns, expected 40"));
  }
  EXPECT_EQ(batch.size(), 1);
}

}  // namespace PST_FILE_ID
}  // namespace pst
