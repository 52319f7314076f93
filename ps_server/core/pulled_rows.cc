#include "ps_server/core/pulled_rows.h"

namespace pst {

int64_t PulledRows::row_count() const {
  int64_t count = 0;
  for (const EmbeddingRows& rows : request_.rows()) {
    count += static_cast<int64_t>(rows.ids().size() / sizeof(uint64_t));
  }
  return count;
}

int64_t PulledRows::reply_bytes() const {
  int64_t bytes = 0;
  // Per table: the values, the name, and tags, lengths and the dtype (at
  // most 40 bytes).
  for (const EmbeddingRows& rows : request_.rows()) {
    bytes += table_.AnswerBytes(rows, request_.dtype()) +
             static_cast<int64_t>(rows.table().size()) + 40;
  }
  return bytes;
}

absl::Status PulledRows::AnswerTo(PullResponse* response) const {
  const DType dtype = request_.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : request_.dtype();
  for (const EmbeddingRows& rows : request_.rows()) {
    EmbeddingRows* out = response->add_rows();
    out->set_table(rows.table());
    out->set_dtype(dtype);
    std::string* data = out->mutable_data();
    data->resize(static_cast<size_t>(table_.AnswerBytes(rows, dtype)));
    if (absl::Status s = table_.EncodeRows(rows, dtype, request_.worker(), data->data()); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

}  // namespace pst
