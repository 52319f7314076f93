#include "worker/client/row_split.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "placement/row_placement.h"

namespace pst {
namespace {

// A table's name aside, what one table's rows add to a message: tags,
// lengths and the dtype.
constexpr int64_t kTableFraming = 40;

absl::Status Invalid(const EmbeddingTableConfig& table, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("embedding table \"", table.name(), "\": ", what));
}

// The id lists one Make has checked: a model whose tables share their
// ids (one list of a batch's ids for every table) passes the same list
// more than once, and it is checked, and spread over the shards, once.
class IdLists {
 public:
  // Whether `ids` is a list already checked (the same memory, the same
  // length); remembers it otherwise.
  bool Seen(std::span<const uint64_t> ids) {
    for (const std::span<const uint64_t>& checked : checked_) {
      if (checked.data() == ids.data() && checked.size() == ids.size()) return true;
    }
    checked_.push_back(ids);
    return false;
  }

 private:
  std::vector<std::span<const uint64_t>> checked_;
};

// Checks one table's ids and the length of its rows; `seen` is the tables
// already named in the same list.
absl::Status CheckRows(const std::vector<EmbeddingTableConfig>& tables, int table,
                       std::span<const uint64_t> ids, size_t floats, absl::string_view kind,
                       std::vector<bool>* seen, IdLists* checked,
                       absl::flat_hash_set<uint64_t>* unique) {
  if (table < 0 || static_cast<size_t>(table) >= tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rows name embedding table ", table, "; the model has ",
                                                   tables.size(), " tables"));
  }
  const EmbeddingTableConfig& config = tables[table];
  if ((*seen)[table]) return Invalid(config, absl::StrCat(kind, " twice in one exchange"));
  (*seen)[table] = true;
  if (ids.size() > UINT32_MAX) return Invalid(config, absl::StrCat("too many ids ", kind));
  const size_t dim = static_cast<size_t>(config.dim());
  if (floats != ids.size() * dim) {
    return Invalid(config, absl::StrCat(ids.size(), " ids ", kind, " with ", floats,
                                        " floats of rows; dim ", dim, " needs ", ids.size() * dim));
  }
  if (checked->Seen(ids)) return absl::OkStatus();
  unique->clear();
  unique->reserve(ids.size());
  for (uint64_t id : ids) {
    if (!unique->insert(id).second) {
      return Invalid(config, absl::StrCat("id ", id, " appears twice in the ids ", kind,
                                          "; name each id once (sum its gradients)"));
    }
  }
  return absl::OkStatus();
}

// Writes `id` as the wire's 8 bytes (little-endian, as the host: common/
// tensor_codec.h refuses to build elsewhere) at `out`; returns the next place.
char* PutId(uint64_t id, char* out) {
  std::memcpy(out, &id, sizeof(id));
  return out + sizeof(id);
}

}  // namespace

absl::StatusOr<RowSplit> RowSplit::Make(const std::vector<EmbeddingTableConfig>& tables,
                                        int num_shards, DType wire_dtype,
                                        std::span<const RowGradients> push,
                                        std::span<const RowValues> pull, bool push_every_table) {
  absl::flat_hash_set<uint64_t> unique;
  std::vector<bool> pushed(tables.size(), false), pulled(tables.size(), false);
  IdLists checked_lists;
  for (const RowGradients& rows : push) {
    if (absl::Status checked = CheckRows(tables, rows.table, rows.ids, rows.gradients.size(),
                                         "pushed", &pushed, &checked_lists, &unique);
        !checked.ok()) {
      return checked;
    }
  }
  for (const RowValues& rows : pull) {
    if (absl::Status checked = CheckRows(tables, rows.table, rows.ids, rows.values.size(),
                                         "pulled", &pulled, &checked_lists, &unique);
        !checked.ok()) {
      return checked;
    }
  }
  RowSplit split;
  split.tables_ = &tables;
  split.wire_dtype_ = wire_dtype;
  split.pull_ = pull;
  split.shards_.resize(num_shards);
  split.pushes_ = !push.empty() || (push_every_table && !tables.empty());
  const int element_bytes = DTypeBytes(wire_dtype);
  std::vector<int> shard_of;
  std::vector<size_t> counts(num_shards);
  std::span<const uint64_t> spread_ids;  // the list shard_of and counts are of
  auto spread = [&](std::span<const uint64_t> ids) {
    if (ids.data() == spread_ids.data() && ids.size() == spread_ids.size()) return;
    spread_ids = ids;
    shard_of.resize(ids.size());
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      shard_of[i] = ShardOfRow(ids[i], num_shards);
      ++counts[shard_of[i]];
    }
  };
  for (const RowGradients& rows : push) {
    const EmbeddingTableConfig& config = tables[rows.table];
    const size_t dim = static_cast<size_t>(config.dim());
    const size_t row_bytes = dim * element_bytes;
    spread(rows.ids);
    std::vector<char*> next_id(num_shards);
    std::vector<char*> next(num_shards);
    for (int s = 0; s < num_shards; ++s) {
      EmbeddingRows* out = split.shards_[s].push.Add();
      out->set_table(config.name());
      out->set_dtype(wire_dtype);
      out->mutable_ids()->resize(counts[s] * sizeof(uint64_t));
      out->mutable_data()->resize(counts[s] * row_bytes);
      next_id[s] = out->mutable_ids()->data();
      next[s] = out->mutable_data()->data();
    }
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      const int s = shard_of[i];
      next_id[s] = PutId(rows.ids[i], next_id[s]);
      EncodeValuesTo(rows.gradients.subspan(i * dim, dim), wire_dtype, next[s]);
      next[s] += row_bytes;
    }
    split.push_bytes_ += static_cast<int64_t>(rows.ids.size() * (sizeof(uint64_t) + row_bytes));
  }
  if (push_every_table) {
    for (size_t t = 0; t < tables.size(); ++t) {
      if (pushed[t]) continue;
      for (PerShard& shard : split.shards_) {
        EmbeddingRows* out = shard.push.Add();
        out->set_table(tables[t].name());
        out->set_dtype(wire_dtype);
      }
    }
  }
  if (!pull.empty()) {
    for (PerShard& shard : split.shards_) shard.pulls.resize(1);
  }
  for (size_t k = 0; k < pull.size(); ++k) {
    const RowValues& rows = pull[k];
    const EmbeddingTableConfig& config = tables[rows.table];
    spread(rows.ids);
    std::vector<char*> next_id(num_shards);
    std::vector<uint32_t*> next_position(num_shards);
    for (int s = 0; s < num_shards; ++s) {
      PullPart& part = split.shards_[s].pulls[0];
      EmbeddingRows* out = part.rows.Add();
      out->set_table(config.name());
      out->mutable_ids()->resize(counts[s] * sizeof(uint64_t));
      next_id[s] = out->mutable_ids()->data();
      part.pull_of.push_back(static_cast<int>(k));
      next_position[s] = part.positions.emplace_back(counts[s]).data();
    }
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      const int s = shard_of[i];
      next_id[s] = PutId(rows.ids[i], next_id[s]);
      *next_position[s]++ = static_cast<uint32_t>(i);
    }
    split.pull_bytes_ += static_cast<int64_t>(rows.ids.size() * config.dim() * element_bytes);
  }
  return split;
}

int64_t RowSplit::push_rows_bytes(int s) const {
  int64_t bytes = 0;
  for (const EmbeddingRows& rows : shards_[s].push) {
    bytes += static_cast<int64_t>(rows.ids().size() + rows.data().size() + rows.table().size()) +
             kTableFraming;
  }
  return bytes;
}

absl::Status RowSplit::PieceOutPull(int s, const PullBudget& first, const PullBudget& rest) {
  PerShard& shard = shards_[s];
  if (shard.pulls.size() != 1) return absl::OkStatus();
  const int element_bytes = DTypeBytes(wire_dtype_);
  auto row_bytes_of = [&](int k) {
    return int64_t{(*tables_)[pull_[shard.pulls[0].pull_of[k]].table].dim()} * element_bytes;
  };
  int64_t request_bytes = 0, reply_bytes = 0;
  for (int k = 0; k < shard.pulls[0].rows.size(); ++k) {
    const EmbeddingRows& rows = shard.pulls[0].rows.Get(k);
    const int64_t framing = static_cast<int64_t>(rows.table().size()) + kTableFraming;
    const int64_t count = static_cast<int64_t>(shard.pulls[0].positions[k].size());
    request_bytes += framing + count * static_cast<int64_t>(sizeof(uint64_t));
    reply_bytes += framing + count * row_bytes_of(k);
  }
  if (request_bytes <= first.request_bytes && reply_bytes <= first.reply_bytes) {
    return absl::OkStatus();
  }
  PullPart whole = std::move(shard.pulls[0]);
  shard.pulls.clear();
  PullPart* part = &shard.pulls.emplace_back();
  PullBudget left = first;
  for (int k = 0; k < whole.rows.size(); ++k) {
    const EmbeddingRows& rows = whole.rows.Get(k);
    const std::vector<uint32_t>& positions = whole.positions[k];
    const int64_t framing = static_cast<int64_t>(rows.table().size()) + kTableFraming;
    const int64_t row_bytes =
        int64_t{(*tables_)[pull_[whole.pull_of[k]].table].dim()} * element_bytes;
    size_t begin = 0;
    do {
      const int64_t room = std::min((left.request_bytes - framing) / int64_t{sizeof(uint64_t)},
                                    (left.reply_bytes - framing) / row_bytes);
      const size_t take = static_cast<size_t>(
          std::clamp<int64_t>(room, 0, static_cast<int64_t>(positions.size() - begin)));
      if (take == 0 && begin < positions.size()) {
        // Part 0 may have no room at all beside the exchange's push.
        if (part->rows.empty() && shard.pulls.size() > 1) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "one row of embedding table \"", rows.table(), "\" (", row_bytes,
              " bytes) is more than one call to the shard may carry (", rest.reply_bytes,
              " bytes of rows answered, ", rest.request_bytes,
              " bytes of ids asked); raise ps_server --max_reply_bytes and --max_message_bytes"));
        }
        part = &shard.pulls.emplace_back();
        left = rest;
        continue;
      }
      EmbeddingRows* out = part->rows.Add();
      out->set_table(rows.table());
      out->set_ids(rows.ids().substr(begin * sizeof(uint64_t), take * sizeof(uint64_t)));
      part->pull_of.push_back(whole.pull_of[k]);
      part->positions.emplace_back(positions.begin() + begin, positions.begin() + begin + take);
      left.request_bytes -= framing + static_cast<int64_t>(take * sizeof(uint64_t));
      left.reply_bytes -= framing + static_cast<int64_t>(take) * row_bytes;
      begin += take;
    } while (begin < positions.size());
  }
  return absl::OkStatus();
}

void RowSplit::MovePullRows(int shard, int part, PullRequest* request) {
  std::vector<PullPart>& pulls = shards_[shard].pulls;
  if (static_cast<size_t>(part) < pulls.size()) request->mutable_rows()->Swap(&pulls[part].rows);
}

int64_t RowSplit::pull_answer_bytes(int s, int part) const {
  const std::vector<PullPart>& pulls = shards_[s].pulls;
  if (static_cast<size_t>(part) >= pulls.size()) return 0;
  const PullPart& asked = pulls[part];
  int64_t bytes = 0;
  for (size_t k = 0; k < asked.pull_of.size(); ++k) {
    bytes += static_cast<int64_t>(asked.positions[k].size()) *
             (*tables_)[pull_[asked.pull_of[k]].table].dim() * DTypeBytes(wire_dtype_);
  }
  return bytes;
}

absl::Status RowSplit::TakeAnswer(int s, int part, const PullResponse& answer,
                                  std::optional<std::span<const char>> in_region) const {
  const PullPart& asked_part = shards_[s].pulls[part];
  if (answer.rows_size() != static_cast<int>(asked_part.pull_of.size())) {
    return absl::InternalError(absl::StrCat("answered ", answer.rows_size(),
                                            " tables' rows, expected ", asked_part.pull_of.size()));
  }
  const int element_bytes = DTypeBytes(wire_dtype_);
  size_t region_offset = 0;  // of table k's values in `in_region`
  for (int k = 0; k < answer.rows_size(); ++k) {
    const EmbeddingRows& rows = answer.rows(k);
    const RowValues& asked = pull_[asked_part.pull_of[k]];
    const EmbeddingTableConfig& config = (*tables_)[asked.table];
    const std::vector<uint32_t>& positions = asked_part.positions[k];
    const size_t dim = static_cast<size_t>(config.dim());
    const size_t row_bytes = dim * element_bytes;
    const DType dtype = rows.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : rows.dtype();
    const size_t expected = positions.size() * row_bytes;
    // Where the values lie: inline, or next in the region.
    absl::string_view values = rows.data();
    if (in_region.has_value()) {
      if (!rows.data().empty() || in_region->size() - region_offset < expected) {
        return absl::InternalError(absl::StrCat("answered rows of \"", rows.table(),
                                                "\" outside the shared region's room for them"));
      }
      values = absl::string_view(in_region->data() + region_offset, expected);
      region_offset += expected;
    }
    if (rows.table() != config.name() || dtype != wire_dtype_ || values.size() != expected) {
      return absl::InternalError(absl::StrCat(
          "answered rows of \"", rows.table(), "\" (", values.size(), " bytes of ",
          DType_Name(dtype), ") for the ", positions.size(), " rows of \"", config.name(),
          "\" asked (", expected, " bytes of ", DType_Name(wire_dtype_), ")"));
    }
    const char* data = values.data();
    for (size_t i = 0; i < positions.size(); ++i) {
      std::span<float> out = asked.values.subspan(positions[i] * dim, dim);
      if (element_bytes == sizeof(float)) {
        std::memcpy(out.data(), data + i * row_bytes, out.size_bytes());
      } else {
        DecodeValues(absl::string_view(data + i * row_bytes, row_bytes), wire_dtype_, out);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pst
