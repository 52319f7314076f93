// The optimizer rates a worker's pushes carry (UpdateRates in ps.proto),
// split by shard: each shard is sent the names it holds.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "worker/client/shard_channel.h"

namespace pst {

absl::Status ShardChannel::SetUpdateRates(const std::optional<UpdateRates>& rates) {
  std::vector<std::optional<UpdateRates>> per_shard(shards_.size());
  if (rates.has_value()) {
    absl::flat_hash_set<std::string> known;
    known.insert(variable_names_.begin(), variable_names_.end());
    for (const EmbeddingTableConfig& table : tables_) known.insert(table.name());
    for (const auto* rate_map : {&rates->learning_rates(), &rates->weight_decays()}) {
      for (const auto& [name, rate] : *rate_map) {
        if (!known.contains(name)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "an optimizer rate names \"", name, "\", which is no variable or table of the model"));
        }
      }
    }
    for (size_t s = 0; s < shards_.size(); ++s) {
      UpdateRates& shard = per_shard[s].emplace();
      if (rates->has_clip_norm()) shard.set_clip_norm(rates->clip_norm());
      const auto copy = [&](const std::string& from, const std::string& to) {
        if (auto it = rates->learning_rates().find(from); it != rates->learning_rates().end()) {
          (*shard.mutable_learning_rates())[to] = it->second;
        }
        if (auto it = rates->weight_decays().find(from); it != rates->weight_decays().end()) {
          (*shard.mutable_weight_decays())[to] = it->second;
        }
      };
      for (size_t i : shards_[s].slices) copy(variable_names_[slices_[i].variable], slices_[i].name);
      for (const EmbeddingTableConfig& table : tables_) copy(table.name(), table.name());
    }
  }
  for (size_t s = 0; s < shards_.size(); ++s) shards_[s].rates = std::move(per_shard[s]);
  return absl::OkStatus();
}

}  // namespace pst
