#include "kernels/device_spec.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pst {

namespace {

bool ParseCount(absl::string_view text, int* count) {
  return !text.empty() && text.find_first_not_of("0123456789") == absl::string_view::npos &&
         absl::SimpleAtoi(text, count);
}

}  // namespace

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kGpu:
      return absl::StrCat("gpu:", gpu);
    case Kind::kAuto:
      break;
  }
  return "auto";
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  if (text.empty() || text == "auto") return spec;
  if (text == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  absl::string_view index = text;
  if (absl::ConsumePrefix(&index, "gpu:") && ParseCount(index, &spec.gpu)) {
    spec.kind = DeviceSpec::Kind::kGpu;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", text, "\" is not one of auto, cpu or gpu:N (N = 0, 1, ...)"));
}

std::string DeviceList::ToString() const {
  if (every_gpu) return "gpu:all";
  const bool all_cpu = !towers.empty() && std::all_of(towers.begin(), towers.end(), [](const DeviceSpec& d) {
    return d.kind == DeviceSpec::Kind::kCpu;
  });
  if (all_cpu) return towers.size() == 1 ? "cpu" : absl::StrCat("cpu:", towers.size());
  return absl::StrJoin(towers, ",", [](std::string* out, const DeviceSpec& d) {
    out->append(d.ToString());
  });
}

absl::StatusOr<DeviceList> ParseDeviceList(absl::string_view text) {
  DeviceList list;
  if (text.empty()) return list;
  auto invalid = [text](absl::string_view item, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices \"", text, "\": \"", item, "\" ", why,
        "; write a comma-separated list of cpu, cpu:N, gpu:N, or gpu:all alone"));
  };
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    absl::string_view rest = item;
    int count = 0;
    if (item == "gpu:all") {
      list.every_gpu = true;
    } else if (item == "cpu") {
      list.towers.push_back({DeviceSpec::Kind::kCpu, 0});
    } else if (absl::ConsumePrefix(&rest, "cpu:")) {
      if (!ParseCount(rest, &count) || count < 1 || count > kMaxTowers) {
        return invalid(item, absl::StrCat("needs a tower count from 1 to ", kMaxTowers));
      }
      list.towers.insert(list.towers.end(), count, {DeviceSpec::Kind::kCpu, 0});
    } else if (absl::ConsumePrefix(&rest, "gpu:")) {
      if (!ParseCount(rest, &count)) return invalid(item, "needs a device number");
      list.towers.push_back({DeviceSpec::Kind::kGpu, count});
    } else {
      return invalid(item, "is not a device");
    }
    if (list.towers.size() > static_cast<size_t>(kMaxTowers)) {
      return invalid(item, absl::StrCat("makes more than ", kMaxTowers, " towers"));
    }
  }
  if (list.every_gpu && !list.towers.empty()) {
    return invalid("gpu:all", "cannot be combined with other devices");
  }
  return list;
}

DeviceSpec ResolveDevice(const DeviceSpec& spec, int rank, int visible_gpus) {
  if (spec.kind != DeviceSpec::Kind::kAuto) return spec;
  DeviceSpec resolved;
  if (visible_gpus <= 0) {
    resolved.kind = DeviceSpec::Kind::kCpu;
    return resolved;
  }
  resolved.kind = DeviceSpec::Kind::kGpu;
  resolved.gpu = (rank > 0 ? rank : 0) % visible_gpus;
  return resolved;
}

}  // namespace pst
