#include "common/embedding_config.h"

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/optimizer_config.h"

namespace pst {
namespace {

absl::Status Invalid(const EmbeddingTableConfig& spec, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("embedding table \"", spec.name(), "\": ", problem));
}

absl::Status CheckStorage(const EmbeddingTableConfig& spec) {
  const TableStorage& storage = spec.storage();
  if (storage.memory_bytes() < 0) {
    return Invalid(spec, absl::StrCat("storage.memory_bytes must be >= 0 (0 = no budget), got ",
                                      storage.memory_bytes()));
  }
  if (storage.ttl_steps() < 0) {
    return Invalid(spec, absl::StrCat("storage.ttl_steps must be >= 0 (0 = rows never expire), "
                                      "got ", storage.ttl_steps()));
  }
  if (!TableStorage::HotSet_IsValid(storage.hot_set())) {
    return Invalid(spec, absl::StrCat("storage.hot_set ", static_cast<int>(storage.hot_set()),
                                      " is not LEAST_RECENTLY_USED or LEAST_FREQUENTLY_USED"));
  }
  if (storage.disk().empty()) return absl::OkStatus();
  if (spec.when_full() == EmbeddingTableConfig::REFUSE_NEW_ROWS) {
    return Invalid(spec, "when_full: REFUSE_NEW_ROWS contradicts storage.disk, whose tier takes "
                         "every row past the limit; drop one of them");
  }
  // The tier's directory is <disk>/<table>-shard<i>.
  if (spec.name().find('/') != std::string::npos || spec.name() == "." || spec.name() == "..") {
    return Invalid(spec, "with storage.disk the table's name names a directory; use a name "
                         "without '/'");
  }
  return absl::OkStatus();
}

absl::Status CheckParts(const EmbeddingTableConfig& spec) {
  if (spec.parts().empty()) return absl::OkStatus();
  int64_t columns = 0;
  std::set<std::string, std::less<>> names;
  for (const EmbeddingTablePart& part : spec.parts()) {
    if (part.name().empty() || part.dim() < 1 ||
        !(std::isfinite(part.init_scale()) && part.init_scale() >= 0)) {
      return Invalid(spec, absl::StrCat("part \"", part.name(),
                                        "\" needs a name, a dim >= 1 and a "
                                        "finite init_scale >= 0; got dim ",
                                        part.dim(), ", init_scale ", part.init_scale()));
    }
    if (!names.insert(part.name()).second) {
      return Invalid(spec, absl::StrCat("part \"", part.name(), "\" is named twice"));
    }
    columns += part.dim();
  }
  if (columns != spec.dim()) {
    return Invalid(
        spec, absl::StrCat("its parts' dims add up to ", columns, ", not its dim ", spec.dim()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EmbeddingTableConfig> ResolveEmbeddingTable(const EmbeddingTableConfig& spec,
                                                           const OptimizerConfig& job_optimizer) {
  if (spec.name().empty()) return absl::InvalidArgumentError("an embedding table has no name");
  if (spec.dim() < 1 || spec.dim() > kMaxEmbeddingDim) {
    return Invalid(spec,
                   absl::StrCat("dim must be in [1, ", kMaxEmbeddingDim, "], got ", spec.dim()));
  }
  if (spec.max_rows_per_shard() < 0 || spec.max_rows_per_shard() > kMaxRowsPerShard) {
    return Invalid(spec, absl::StrCat("max_rows_per_shard must be in [0, ", kMaxRowsPerShard,
                                      "] (0 = ", kDefaultMaxRowsPerShard, "), got ",
                                      spec.max_rows_per_shard()));
  }
  if (!EmbeddingTableConfig::WhenFull_IsValid(spec.when_full())) {
    return Invalid(spec, absl::StrCat("when_full ", static_cast<int>(spec.when_full()),
                                      " is not EVICT_LEAST_RECENTLY_USED or REFUSE_NEW_ROWS"));
  }
  if (spec.has_init_scale() && !(std::isfinite(spec.init_scale()) && spec.init_scale() >= 0)) {
    return Invalid(spec,
                   absl::StrCat("init_scale must be finite and >= 0, got ", spec.init_scale()));
  }
  if (absl::Status s = CheckStorage(spec); !s.ok()) return s;
  if (absl::Status s = CheckParts(spec); !s.ok()) return s;
  EmbeddingTableConfig resolved = spec;
  if (!resolved.has_optimizer()) *resolved.mutable_optimizer() = job_optimizer;
  if (absl::StatusOr<OptimizerSettings> optimizer = ResolveOptimizerConfig(resolved.optimizer());
      !optimizer.ok()) {
    return Invalid(spec, optimizer.status().message());
  }
  if (resolved.max_rows_per_shard() == 0) resolved.set_max_rows_per_shard(kDefaultMaxRowsPerShard);
  if (resolved.when_full() == EmbeddingTableConfig::WHEN_FULL_UNSPECIFIED) {
    resolved.set_when_full(EmbeddingTableConfig::EVICT_LEAST_RECENTLY_USED);
  }
  if (!resolved.has_init_scale()) {
    // FTRL's weights follow from its state (0 before any gradient), so its
    // rows start at 0; other rules start from a spread that keeps a sum of
    // dim products of order 1.
    resolved.set_init_scale(resolved.optimizer().has_ftrl()
                                ? 0.0f
                                : 1.0f / std::sqrt(static_cast<float>(resolved.dim())));
  }
  return resolved;
}

absl::StatusOr<std::vector<EmbeddingTableConfig>> ResolveEmbeddingTables(
    const google::protobuf::RepeatedPtrField<EmbeddingTableConfig>& specs,
    const OptimizerConfig& job_optimizer) {
  std::vector<EmbeddingTableConfig> resolved;
  std::set<std::string, std::less<>> names;
  for (const EmbeddingTableConfig& spec : specs) {
    absl::StatusOr<EmbeddingTableConfig> table = ResolveEmbeddingTable(spec, job_optimizer);
    if (!table.ok()) return table.status();
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding table \"", spec.name(), "\" is declared twice"));
    }
    resolved.push_back(*std::move(table));
  }
  return resolved;
}

}  // namespace pst
