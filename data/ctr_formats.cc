#include "data/ctr_formats.h"

#include <charconv>
#include <cmath>

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

float LogScaled(int64_t x) {
  const double magnitude = std::log1p(std::abs(static_cast<double>(x)));
  return static_cast<float>(x < 0 ? -magnitude : magnitude);
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
  int count = 0;
  for (size_t start = 0;; ++count) {
    const size_t tab = line.find('\t', start);
    if (count < kColumns) columns[count] = line.substr(start, tab - start);
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  ++count;
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
    if (!text.empty() && (text.size() > 16 || !ParseWhole(text, &hashes[f], 16))) {
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
