// EmbeddingTable's pulls: checking a pull, answering its rows (committed
// values, cold rows from the disk tier, initial values of rows never
// trained), and keeping the rows a pull found for its worker's next SYNC
// push (PulledRowsOfStep in embedding_table.cc reads them).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/core/embedding_init.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/embedding_table_internal.h"

namespace pst {

using embedding_internal::CheckIdBytes;
using embedding_internal::IdCount;
using embedding_internal::Invalid;

absl::Status EmbeddingTable::ReadRow(const Embedding& table, uint64_t id,
                                     std::span<float> out) const {
  const int64_t row = table.rows.Find(id);
  if (row >= 0) {
    ++table.lookups_in_memory;
    std::span<const float> values = table.rows.values(row);
    std::copy(values.begin(), values.end(), out.begin());
    return absl::OkStatus();
  }
  return ReadAbsentRow(table, id, out);
}

absl::Status EmbeddingTable::ReadAbsentRow(const Embedding& table, uint64_t id,
                                           std::span<float> out) const {
  if (table.tiered()) {
    PST_ASSIGN_OR_RETURN(bool cold, ReadCold(table, id, out));
    if (cold) return absl::OkStatus();
  }
  table.init.Row(id, out);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckPull(const PullRequest& pull) const {
  if (DTypeBytes(pull.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown wire dtype ", static_cast<int>(pull.dtype()), " in a pull"));
  }
  std::vector<bool> seen(tables_.size(), false);
  for (const EmbeddingRows& rows : pull.rows()) {
    const int t = Find(rows.table());
    if (t < 0) return Invalid(rows.table(), "no such table on this shard (pulled rows)");
    if (seen[t]) return Invalid(rows.table(), "rows pulled twice in one pull");
    seen[t] = true;
    PST_RETURN_IF_ERROR(CheckIdBytes(rows));
    for (int64_t i = 0; i < IdCount(rows.ids()); ++i) {
      PST_RETURN_IF_ERROR(CheckShard(*tables_[t], RowId(rows.ids(), i), "pulled"));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Lookup(absl::string_view table, std::span<const uint64_t> ids,
                                    std::span<float> out) const {
  const int t = Find(table);
  if (t < 0) return Invalid(table, "no such table on this shard (looked up)");
  const Embedding& e = *tables_[t];
  const size_t dim = e.dim();
  if (out.size() != ids.size() * dim) {
    return Invalid(
        table, absl::StrCat("a lookup of ", ids.size(), " rows of dim ", dim, " needs room for ",
                            ids.size() * dim, " values, not ", out.size()));
  }
  for (uint64_t id : ids) PST_RETURN_IF_ERROR(CheckShard(e, id, "looked-up"));
  for (size_t i = 0; i < ids.size(); ++i) {
    PST_RETURN_IF_ERROR(ReadRow(e, ids[i], out.subspan(i * dim, dim)));
  }
  return absl::OkStatus();
}

int64_t EmbeddingTable::AnswerBytes(const EmbeddingRows& rows, DType dtype) const {
  return IdCount(rows.ids()) * int64_t{dim(rows.table())} * DTypeBytes(dtype);
}

absl::Status EmbeddingTable::EncodeRows(const EmbeddingRows& rows, DType dtype, int worker,
                                        char* out) const {
  const int t = Find(rows.table());
  const Embedding& table = *tables_[t];
  const size_t dim = table.dim();
  const size_t row_bytes = dim * DTypeBytes(dtype);
  std::vector<float> initial(dim);
  // As in StageRows: the rows first, then their values, hinted ahead.
  constexpr int64_t kAhead = 8;
  const int64_t n = IdCount(rows.ids());
  // A tiered table or one with a TTL admits each update's rows first,
  // which moves rows: what its pull found is never current at the push.
  PulledRowsOf* pulled = nullptr;
  if (worker >= 0 && static_cast<size_t>(worker) < pulled_.size() && !table.tiered() &&
      table.ttl() == 0) {
    pulled = &pulled_[worker][t];
  }
  std::vector<int64_t> found_here;
  std::vector<int64_t>& found = pulled != nullptr ? pulled->rows : found_here;
  found.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) table.rows.PrefetchIndex(RowId(rows.ids(), i + kAhead));
    found[i] = table.rows.Find(RowId(rows.ids(), i));
  }
  if (pulled != nullptr) {
    pulled->layout = table.rows.layout();
    pulled->ids.resize(n);
    if (n > 0) std::memcpy(pulled->ids.data(), rows.ids().data(), n * sizeof(uint64_t));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && found[i + kAhead] >= 0) table.rows.PrefetchRow(found[i + kAhead]);
    const uint64_t id = RowId(rows.ids(), i);
    const int64_t row = found[i];
    std::span<const float> values = initial;
    if (row >= 0) {
      ++table.lookups_in_memory;
      values = table.rows.values(row);
    } else {
      PST_RETURN_IF_ERROR(ReadAbsentRow(table, id, initial));
    }
    EncodeValuesTo(values, dtype, out + i * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::AnswerPull(const PullRequest& pull, PullResponse* response) const {
  PST_RETURN_IF_ERROR(CheckPull(pull));
  for (const EmbeddingRows& rows : pull.rows()) {
    EmbeddingRows* out = response->add_rows();
    out->set_table(rows.table());
    out->set_dtype(pull.dtype());
    std::string* data = out->mutable_data();
    data->resize(AnswerBytes(rows, pull.dtype()));
    PST_RETURN_IF_ERROR(EncodeRows(rows, pull.dtype(), pull.worker(), data->data()));
  }
  return absl::OkStatus();
}

}  // namespace pst
