#include "data/ctr_formats.h"

#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pst {
namespace {

// The text of a field for a message, cut short.
std::string Quoted(absl::string_view text) {
  constexpr size_t kShown = 24;
  return absl::StrCat("\"", text.substr(0, kShown), text.size() > kShown ? "...\"" : "\"");
}

template <typename T>
bool ParseWhole(absl::string_view text, T* out, int base = 10) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>) {
    r = std::from_chars(text.data(), end, *out);
  } else {
    r = std::from_chars(text.data(), end, *out, base);
  }
  return r.ec == std::errc() && r.ptr == end;
}

// log1p of the magnitudes most integer columns hold, each exactly as
// LogScaled computes it: a table lookup instead of a log1p call per value.
constexpr uint64_t kTabledMagnitudes = 1024;
const std::array<float, kTabledMagnitudes>& SmallMagnitudeLogs() {
  static const std::array<float, kTabledMagnitudes> logs = [] {
    std::array<float, kTabledMagnitudes> out;
    for (uint64_t m = 0; m < kTabledMagnitudes; ++m) {
      out[m] = static_cast<float>(std::log1p(static_cast<double>(m)));
    }
    return out;
  }();
  return logs;
}

// sign(x) log(1 + |x|), rounded once from double to float.
float LogScaled(int64_t x) {
  const uint64_t magnitude = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  if (magnitude < kTabledMagnitudes) {
    const float tabled = SmallMagnitudeLogs()[magnitude];
    return x < 0 ? -tabled : tabled;
  }
  const double logged = std::log1p(std::abs(static_cast<double>(x)));
  return static_cast<float>(x < 0 ? -logged : logged);
}

// Each byte's value as a hexadecimal digit (either case), or 0xFF.
constexpr std::array<uint8_t, 256> kHexDigits = [] {
  std::array<uint8_t, 256> digits{};
  for (int c = 0; c < 256; ++c) {
    digits[c] = c >= '0' && c <= '9'   ? static_cast<uint8_t>(c - '0')
                : c >= 'a' && c <= 'f' ? static_cast<uint8_t>(c - 'a' + 10)
                : c >= 'A' && c <= 'F' ? static_cast<uint8_t>(c - 'A' + 10)
                                       : 0xFF;
  }
  return digits;
}();

// Eight hexadecimal digits (either case), the width of Criteo's hashes,
// as one 64-bit word: every byte checked and turned into its digit's
// value at once, then the eight values packed into one number.
bool ParseEightHexDigits(const char* text, uint64_t* out) {
  constexpr uint64_t kEach = 0x0101010101010101ULL;
  constexpr uint64_t kHighBits = 0x8080808080808080ULL;
  uint64_t bytes;
  std::memcpy(&bytes, text, sizeof(bytes));
  if constexpr (std::endian::native == std::endian::big) bytes = __builtin_bswap64(bytes);
  // The first digit is the lowest byte.
  if (bytes & kHighBits) return false;
  // Below 0x80, adding c to a byte sets its high bit exactly when the byte
  // is at least 0x80 - c, and never carries into the next byte.
  const uint64_t digit = (bytes + kEach * (0x80 - '0')) & ~(bytes + kEach * (0x80 - '9' - 1));
  const uint64_t lower = bytes | kEach * 0x20;
  const uint64_t letter = (lower + kEach * (0x80 - 'a')) & ~(lower + kEach * (0x80 - 'f' - 1));
  if (((digit | letter) & kHighBits) != kHighBits) return false;
  // '0'-'9' end in 0-9, 'a'-'f' and 'A'-'F' in 1-6, which 9 makes 10-15.
  uint64_t v = (bytes & kEach * 0x0F) + ((letter & kHighBits) >> 7) * 9;
  v = ((v & 0x000F000F000F000FULL) << 4) | ((v >> 8) & 0x000F000F000F000FULL);
  v = ((v & 0x000000FF000000FFULL) << 8) | ((v >> 16) & 0x000000FF000000FFULL);
  *out = ((v & 0xFFFF) << 16) | (v >> 32);
  return true;
}

// A hash of 1 to 16 hexadecimal digits, what std::from_chars(..., 16)
// takes whole; one table lookup a digit, where from_chars's generic loop
// costs several times as much (the CTR worker parses 26 hashes a line),
// and eight digits at once.
bool ParseHash(absl::string_view text, uint64_t* out) {
  if (text.size() == 8) return ParseEightHexDigits(text.data(), out);
  if (text.empty() || text.size() > 16) return false;
  uint64_t value = 0;
  uint8_t seen = 0;
  for (const char c : text) {
    const uint8_t digit = kHexDigits[static_cast<unsigned char>(c)];
    seen |= digit;
    value = value << 4 | (digit & 0x0F);
  }
  if (seen & 0xF0) return false;
  *out = value;
  return true;
}

// Cuts `line` at its tabs into columns[0, max_columns) and returns how
// many columns it has (the ones past max_columns counted, not kept). The
// tabs are found 16 bytes at a time, where a byte loop (or a search call
// per column: they are a few bytes long) costs several times as much.
int SplitAtTabs(absl::string_view line, absl::string_view* columns, int max_columns) {
  const char* const bytes = line.data();
  const size_t size = line.size();
  int count = 0;
  size_t start = 0;
  auto cut_at = [&](size_t tab) {
    if (count < max_columns) columns[count] = line.substr(start, tab - start);
    ++count;
    start = tab + 1;
  };
  size_t at = 0;
#if defined(__SSE2__)
  const __m128i tabs = _mm_set1_epi8('\t');
  for (; at + 16 <= size; at += 16) {
    const __m128i chunk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + at));
    for (auto found = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(chunk, tabs)));
         found != 0; found &= found - 1) {
      cut_at(at + static_cast<size_t>(std::countr_zero(found)));
    }
  }
#endif
  for (; at < size; ++at) {
    if (bytes[at] == '\t') cut_at(at);
  }
  cut_at(size);
  return count;
}

absl::Status ParseLabel(absl::string_view text, float* label) {
  if (text == "0") {
    *label = 0.0f;
  } else if (text == "1") {
    *label = 1.0f;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("label ", Quoted(text), " is not 0 or 1"));
  }
  return absl::OkStatus();
}

}  // namespace

CtrBatch EmptyBatchFor(CtrFormat format) {
  return format == CtrFormat::kCriteo ? CtrBatch(kCriteoCategoricals, kCriteoIntegers)
                                      : CtrBatch(1, 0);
}

absl::Status ParseCriteoLine(absl::string_view line, CtrBatch* batch) {
  constexpr int kColumns = 1 + kCriteoIntegers + kCriteoCategoricals;
  absl::string_view columns[kColumns];
  const int count = SplitAtTabs(line, columns, kColumns);
  if (count != kColumns) {
    return absl::InvalidArgumentError(
        absl::StrCat(count, " tab-separated columns, expected ", kColumns,
                     " (label, 13 integers, 26 categorical hashes)"));
  }
  float label = 0.0f;
  if (absl::Status s = ParseLabel(columns[0], &label); !s.ok()) return s;
  float dense[kCriteoIntegers];
  for (int i = 0; i < kCriteoIntegers; ++i) {
    const absl::string_view text = columns[1 + i];
    int64_t x = 0;
    if (!text.empty() && !ParseWhole(text, &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("integer column ", i + 1, " holds ", Quoted(text)));
    }
    dense[i] = LogScaled(x);
  }
  uint64_t hashes[kCriteoCategoricals];
  for (int f = 0; f < kCriteoCategoricals; ++f) {
    const absl::string_view text = columns[1 + kCriteoIntegers + f];
    if (!text.empty() && !ParseHash(text, &hashes[f])) {
      return absl::InvalidArgumentError(
          absl::StrCat("categorical column ", f + 1, " holds ", Quoted(text),
                       ", not a hexadecimal hash of up to 16 digits"));
    }
  }
  batch->labels.push_back(label);
  batch->dense.insert(batch->dense.end(), dense, dense + kCriteoIntegers);
  for (int f = 0; f < kCriteoCategoricals; ++f) {
    if (!columns[1 + kCriteoIntegers + f].empty()) {
      batch->ids.push_back(CategoricalId(f, hashes[f]));
      batch->values.push_back(1.0f);
    }
    batch->offsets.push_back(static_cast<int32_t>(batch->ids.size()));
  }
  return absl::OkStatus();
}

absl::Status ParseLibsvmLine(absl::string_view line, CtrBatch* batch) {
  if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
    line = line.substr(0, hash);
  }
  const int examples = batch->size();
  auto tokens = [&line](size_t* start) -> absl::string_view {
    const size_t begin = line.find_first_not_of(" \t", *start);
    if (begin == absl::string_view::npos) return {};
    const size_t end = std::min(line.find_first_of(" \t", begin), line.size());
    *start = end;
    return line.substr(begin, end - begin);
  };
  size_t at = 0;
  const absl::string_view label_text = tokens(&at);
  double label = 0.0;
  if (label_text.empty()) return absl::InvalidArgumentError("an empty line, with no label");
  // from_chars takes no '+', which svmlight's "+1" labels carry.
  const absl::string_view unsigned_label =
      absl::StartsWith(label_text, "+") ? label_text.substr(1) : label_text;
  if (!ParseWhole(unsigned_label, &label) || !std::isfinite(label)) {
    return absl::InvalidArgumentError(absl::StrCat("label ", Quoted(label_text), " is not a number"));
  }
  for (absl::string_view pair = tokens(&at); !pair.empty(); pair = tokens(&at)) {
    const size_t colon = pair.find(':');
    uint64_t id = 0;
    float value = 0.0f;
    if (colon == absl::string_view::npos || !ParseWhole(pair.substr(0, colon), &id) ||
        !ParseWhole(pair.substr(colon + 1), &value) || !std::isfinite(value)) {
      if (absl::StartsWith(pair, "qid:")) continue;  // svmlight's query id: not a feature
      batch->Truncate(examples);
      return absl::InvalidArgumentError(
          absl::StrCat("feature ", Quoted(pair), " is not index:value"));
    }
    batch->ids.push_back(id);
    batch->values.push_back(value);
  }
  batch->labels.push_back(label > 0.0 ? 1.0f : 0.0f);
  batch->offsets.push_back(static_cast<int32_t>(batch->ids.size()));
  return absl::OkStatus();
}

}  // namespace pst
