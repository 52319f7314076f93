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

#include "absl/strings/ascii.h"
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

// Eight digits, Criteo's width, are read a word at a time: every byte
// value in every place of one gives what from_chars gives.
TEST(CriteoLineTest, EightDigitHashesWithAnyByteAnywhereAreWhatFromCharsReads) {
  const std::string valid = "9219761e";
  for (size_t place = 0; place < valid.size(); ++place) {
    for (int byte = 0; byte < 256; ++byte) {
      if (byte == '\t') continue;  // another column, not a hash
      std::string text = valid;
      text[place] = static_cast<char>(byte);
      SCOPED_TRACE(absl::StrCat("byte ", byte, " at ", place));
      uint64_t expected = 0;
      const auto [end, error] =
          std::from_chars(text.data(), text.data() + text.size(), expected, 16);
      const bool readable = error == std::errc() && end == text.data() + text.size();
      CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
      const absl::Status parsed = ParseCriteoLine(Line("1", text), &batch);
      ASSERT_EQ(parsed.ok(), readable) << parsed;
      if (readable) {
        ASSERT_EQ(batch.ids[0], CategoricalId(0, expected));
      }
    }
  }
}

// Tabs are found 16 bytes at a time: columns of every width put them at
// every place of a 16-byte piece, and lines of every length end inside one.
TEST(CriteoLineTest, ColumnsOfEveryWidthAreCutAtTheirTabs) {
  for (int shift = 0; shift < 17; ++shift) {
    std::vector<std::string> columns = {"0"};
    std::vector<int64_t> integers;
    for (int i = 0; i < kCriteoIntegers; ++i) {
      integers.push_back((i + shift) % 5 == 0 ? 0 : int64_t{1} << ((3 * i + shift) % 40));
      columns.push_back((i + shift) % 5 == 0 ? "" : absl::StrCat(integers.back()));
    }
    std::vector<uint64_t> hashes;
    for (int f = 0; f < kCriteoCategoricals; ++f) {
      const int width = (f + shift) % 17;  // 0: an empty column
      const uint64_t hash = width == 0 ? 0 : 0x123456789abcdef0ULL >> (4 * (16 - width));
      if (width > 0) hashes.push_back(CategoricalId(f, hash));
      // `width` digits, the first a 1; every other column in capitals.
      const std::string digits = absl::StrCat(absl::Hex(hash));
      columns.push_back(width == 0 ? "" : f % 2 == 0 ? digits : absl::AsciiStrToUpper(digits));
    }
    const std::string line = absl::StrJoin(columns, "\t");
    SCOPED_TRACE(line);
    CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
    ASSERT_TRUE(ParseCriteoLine(line, &batch).ok());
    EXPECT_EQ(batch.ids, hashes);
    ASSERT_EQ(batch.dense.size(), static_cast<size_t>(kCriteoIntegers));
    for (int i = 0; i < kCriteoIntegers; ++i) {
      EXPECT_EQ(batch.dense[i], static_cast<float>(std::log1p(static_cast<double>(integers[i]))))
          << "integer column " << i + 1;
    }
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
