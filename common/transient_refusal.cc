#include "common/transient_refusal.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"

namespace pst {
namespace {

constexpr TransientRefusal kClasses[] = {
    TransientRefusal::kOverloaded, TransientRefusal::kRegionLost, TransientRefusal::kRestarting,
    TransientRefusal::kNotPrimary};

}  // namespace

absl::string_view TransientRefusalName(TransientRefusal why) {
  switch (why) {
    case TransientRefusal::kOverloaded:
      return "overloaded";
    case TransientRefusal::kRegionLost:
      return "region lost";
    case TransientRefusal::kRestarting:
      return "restarting";
    case TransientRefusal::kNotPrimary:
      return "not primary";
  }
  return "restarting";
}

absl::Status MarkTransient(absl::Status status, TransientRefusal why) {
  if (status.ok()) return status;
  status.SetPayload(kTransientRefusalPayload, absl::Cord(TransientRefusalName(why)));
  return status;
}

std::optional<TransientRefusal> MarkedTransient(const absl::Status& status) {
  const auto mark = status.GetPayload(kTransientRefusalPayload);
  if (!mark.has_value()) return std::nullopt;
  for (TransientRefusal why : kClasses) {
    if (*mark == TransientRefusalName(why)) return why;
  }
  // A class this build does not know (a newer shard): still a refusal for
  // now, waited out as a shard that is away.
  return TransientRefusal::kRestarting;
}

absl::Status Reworded(const absl::Status& status, absl::string_view message) {
  absl::Status reworded(status.code(), message);
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& value) {
    reworded.SetPayload(type_url, value);
  });
  return reworded;
}

}  // namespace pst
