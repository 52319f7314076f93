#include "common/ctr_config.h"

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/embedding_config.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace pst {
namespace {

constexpr int kCriteoFields = 26;
constexpr int kCriteoDense = 13;

const EmbeddingTableConfig* FindTable(const TrainingConfig& training, const std::string& name) {
  for (const EmbeddingTableConfig& table : training.model().embeddings()) {
    if (table.name() == name) return &table;
  }
  return nullptr;
}

absl::Status ValidateGenerator(const CtrDataConfig& data) {
  const CtrGeneratorConfig& g = data.generate();
  if (data.format() != CRITEO) {
    return InvalidConfigField("training.dataset.ctr.generate",
                              "writes Criteo files; set format: CRITEO");
  }
  if (g.train_examples() < 0 || g.test_examples() < 0) {
    return InvalidConfigField("training.dataset.ctr.generate",
                              "example counts must not be negative");
  }
  if (g.distinct_size() != 0 && g.distinct_size() != 1 && g.distinct_size() != kCriteoFields) {
    return InvalidConfigField(
        "training.dataset.ctr.generate.distinct",
        absl::StrCat("names ", g.distinct_size(), " fields; give 1 count or ", kCriteoFields));
  }
  for (int64_t n : g.distinct()) {
    if (n < 1)
      return InvalidConfigField("training.dataset.ctr.generate.distinct", "must be at least 1");
  }
  if (g.zipf_exponent() < 0 || g.signal_ranks() < 0 || g.weight_scale() < 0) {
    return InvalidConfigField("training.dataset.ctr.generate",
                              "zipf_exponent, signal_ranks and weight_scale must not be negative");
  }
  return absl::OkStatus();
}

// Whether the shards may keep `deep` and `wide` (resolved) as one table:
// all but their names, dims, initial scales and RAM budgets alike, and
// either both budgeted or neither.
bool MayJoin(const EmbeddingTableConfig& deep, const EmbeddingTableConfig& wide) {
  if (!deep.parts().empty() || !wide.parts().empty() ||
      (deep.storage().memory_bytes() > 0) != (wide.storage().memory_bytes() > 0)) {
    return false;
  }
  EmbeddingTableConfig a = deep;
  EmbeddingTableConfig b = wide;
  for (EmbeddingTableConfig* spec : {&a, &b}) {
    spec->clear_name();
    spec->clear_dim();
    spec->clear_init_scale();
    spec->mutable_storage()->clear_memory_bytes();
  }
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace

CtrShape CtrShapeOf(const CtrDataConfig& data) {
  return data.format() == LIBSVM ? CtrShape{1, 0} : CtrShape{kCriteoFields, kCriteoDense};
}

absl::Status ValidateCtrJob(const TrainingConfig& training) {
  const bool model = training.model().has_ctr();
  const bool data = training.dataset().has_ctr();
  if (model != data) {
    return model ? InvalidConfigField("training.dataset", "must be ctr { ... } for a ctr model")
                 : InvalidConfigField("training.model", "must be ctr { ... } for ctr data");
  }
  const CtrModelConfig& ctr = training.model().ctr();
  const EmbeddingTableConfig* table = FindTable(training, ctr.table());
  if (table == nullptr) {
    return InvalidConfigField("training.model.ctr.table",
                              absl::StrCat("names \"", ctr.table(),
                                           "\", which training.model.embeddings "
                                           "does not declare"));
  }
  if (!ctr.wide_table().empty()) {
    const EmbeddingTableConfig* wide = FindTable(training, ctr.wide_table());
    if (wide == nullptr || wide->dim() != 1 || ctr.wide_table() == ctr.table()) {
      return InvalidConfigField(
          "training.model.ctr.wide_table",
          absl::StrCat("must name a table of dim 1 in training.model.embeddings, other "
                       "than table; \"",
                       ctr.wide_table(), "\" is not one"));
    }
  }
  for (int i = 0; i < ctr.hidden_size(); ++i) {
    if (ctr.hidden(i) < 1) {
      return InvalidConfigField(absl::StrCat("training.model.ctr.hidden[", i, "]"),
                                "must be at least 1");
    }
  }
  if (!Activation_IsValid(ctr.activation()) || !Pooling_IsValid(ctr.pooling()) ||
      !CtrFileFormat_IsValid(training.dataset().ctr().format())) {
    return InvalidConfigField("training.model.ctr",
                              "has an activation, pooling or format out of range");
  }
  const CtrDataConfig& files = training.dataset().ctr();
  if (files.train_file().empty() || files.test_file().empty()) {
    return InvalidConfigField("training.dataset.ctr", "must name train_file and test_file");
  }
  if (files.has_generate()) return ValidateGenerator(files);
  return absl::OkStatus();
}

absl::StatusOr<CtrTables> CtrShardTables(const TrainingConfig& training) {
  const CtrModelConfig& ctr = training.model().ctr();
  CtrTables out;
  PST_ASSIGN_OR_RETURN(out.tables,
                       ResolveEmbeddingTables(training.model().embeddings(), training.optimizer()));
  out.deep = ctr.table();
  out.wide = ctr.wide_table();
  if (out.wide.empty()) return out;
  const std::string joint_name = absl::StrCat(out.deep, "+", out.wide);
  EmbeddingTableConfig* deep = nullptr;
  const EmbeddingTableConfig* wide = nullptr;
  for (EmbeddingTableConfig& table : out.tables) {
    if (table.name() == out.deep) deep = &table;
    if (table.name() == out.wide) wide = &table;
    if (table.name() == joint_name) return out;
  }
  if (deep == nullptr || wide == nullptr || !MayJoin(*deep, *wide)) return out;
  EmbeddingTableConfig joint = *deep;
  joint.set_name(joint_name);
  joint.set_dim(deep->dim() + wide->dim());
  // Both budgets for the one table: the same RAM, which holds more rows
  // together (a record's count, recency, id and index entry are one).
  if (deep->storage().memory_bytes() > 0) {
    joint.mutable_storage()->set_memory_bytes(deep->storage().memory_bytes() +
                                              wide->storage().memory_bytes());
  }
  const EmbeddingTableConfig& deep_spec = *deep;
  for (const EmbeddingTableConfig* table : {&deep_spec, wide}) {
    EmbeddingTablePart* part = joint.add_parts();
    part->set_name(table->name());
    part->set_dim(table->dim());
    part->set_init_scale(table->init_scale());
  }
  *deep = std::move(joint);
  std::erase_if(out.tables,
                [&](const EmbeddingTableConfig& table) { return table.name() == out.wide; });
  out.deep = joint_name;
  out.wide.clear();
  out.joint = true;
  return out;
}

int64_t CtrDenseParameterCount(const TrainingConfig& training) {
  const CtrModelConfig& ctr = training.model().ctr();
  const CtrShape shape = CtrShapeOf(training.dataset().ctr());
  int64_t dim = 0;
  if (const EmbeddingTableConfig* table = FindTable(training, ctr.table())) dim = table->dim();
  double in = static_cast<double>(shape.fields) * static_cast<double>(dim) + shape.dense;
  double parameters = 0;
  for (int width : ctr.hidden()) {
    parameters += in * width + width;
    in = width;
  }
  parameters += in + 1;
  return parameters >= 9e18 ? INT64_MAX : static_cast<int64_t>(parameters);
}

}  // namespace pst
