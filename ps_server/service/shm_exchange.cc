#include "ps_server/service/shm_exchange.h"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/core/streamed_update.h"
#include "ps_server/core/update_settings.h"

namespace pst {

namespace {

// Bytes read from a region at a time: each block is checked for
// non-finite values while it is still in cache, instead of in a second pass
// over the whole gradient.
constexpr int64_t kReadBlockBytes = 256 << 10;

// Elements staged at a time (StageShmPush): a block's gradient, as read
// and decoded, stays in L2 while it is checked and applied.
constexpr int64_t kStageBlockElements = 64 << 10;

// A thread's buffers for StageShmPush, kept for its next exchange.
struct StageBuffers {
  std::vector<float> values;  // a block's gradient values
  std::vector<char> wire;     // its 16-bit bytes
};

StageBuffers& ThisThreadsStageBuffers() {
  thread_local StageBuffers buffers;
  if (buffers.values.empty()) {
    buffers.values.resize(kStageBlockElements);
    buffers.wire.resize(kStageBlockElements * sizeof(uint16_t));
  }
  return buffers;
}

// Where one gradient lies in the region.
struct StagePlace {
  int64_t push_offset = 0;
  int64_t bytes = 0;
};

// Each gradient's place, every range checked against the region (the
// answer's with `answer_element_bytes` > 0) before anything is read, and
// the push against the limits. Gradient i is bytes[i] bytes: the shard's
// own size, whatever its header announces.
absl::StatusOr<std::vector<StagePlace>> PlanStage(const PushRequest& push,
                                                  const ShmTransfer& transfer,
                                                  int answer_element_bytes,
                                                  const OpenedRegion& region,
                                                  const RpcLimits& limits,
                                                  std::span<const int64_t> bytes) {
  if (absl::Status shrunk = region.CheckNotShrunk(); !shrunk.ok()) return shrunk;
  PST_RETURN_IF_ERROR(CheckPushSize(push, limits));
  if (bytes.size() != static_cast<size_t>(push.gradients_size())) {
    return absl::InternalError("a shared push's sizes do not match its gradients");
  }
  std::vector<StagePlace> places;
  int64_t offset = transfer.push_offset();
  int64_t answer_bytes = 0;
  for (const Tensor& header : push.gradients()) {
    const int64_t size = bytes[places.size()];
    if (absl::Status in = region.CheckRange(offset, size); !in.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient \"", header.name(), "\": ", in.message()));
    }
    places.push_back({.push_offset = offset, .bytes = size});
    offset += size;
    answer_bytes += size / DTypeBytes(header.dtype()) * answer_element_bytes;
  }
  if (answer_element_bytes > 0) {
    if (absl::Status in = region.CheckRange(transfer.answer_offset(), answer_bytes); !in.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the answer: ", in.message()));
    }
  }
  return places;
}

// Reads the push's gradients out of `region`, from where `places` says,
// into `buffer`; `bytes` gets the bytes read, `finite` whether every value
// read is finite.
absl::Status ReadPush(const PushRequest& push, const std::vector<StagePlace>& places,
                      const OpenedRegion& region, PushRequest* buffer, int64_t* bytes,
                      bool* finite) {
  buffer->set_worker(push.worker());
  buffer->set_computed_at_version(push.computed_at_version());
  if (push.has_sequence()) {
    buffer->set_sequence(push.sequence());
  } else {
    buffer->clear_sequence();
  }
  // Rows are in the header by now (inline, or read out of the region by
  // ReadShmRows); rates travel inline.
  *buffer->mutable_rows() = push.rows();
  CopyRates(push, buffer);
  // Reuses the buffer's tensors (and their payloads' memory) in place.
  while (buffer->gradients_size() > push.gradients_size())
    buffer->mutable_gradients()->RemoveLast();
  *bytes = 0;
  *finite = true;
  for (int i = 0; i < push.gradients_size(); ++i) {
    const Tensor& header = push.gradients(i);
    const StagePlace& place = places[i];
    Tensor* gradient =
        i < buffer->gradients_size() ? buffer->mutable_gradients(i) : buffer->add_gradients();
    gradient->set_name(header.name());
    gradient->mutable_shape()->Assign(header.shape().begin(), header.shape().end());
    gradient->set_dtype(header.dtype());
    std::string* data = gradient->mutable_data();
    data->resize(static_cast<size_t>(place.bytes));
    const int element_bytes = std::max(DTypeBytes(header.dtype()), 1);
    const int64_t block = kReadBlockBytes / element_bytes * element_bytes;
    for (int64_t done = 0; done < place.bytes; done += block) {
      const int64_t size = std::min(block, place.bytes - done);
      if (absl::Status read = region.Read(place.push_offset + done,
                                          {data->data() + done, static_cast<size_t>(size)});
          !read.ok()) {
        return read;
      }
      *finite =
          *finite && EncodedFinite(absl::string_view(data->data() + done, size), header.dtype());
    }
    *bytes += place.bytes;
  }
  return absl::OkStatus();
}

// The wire type of an exchange's answer; null: it pulls nothing.
int AnswerElementBytes(const DType* answer_dtype) {
  if (answer_dtype == nullptr) return 0;
  return DTypeBytes(*answer_dtype == DTYPE_UNSPECIFIED ? FLOAT32 : *answer_dtype);
}

absl::Status WriteAnswerBytes(PullPayload* payload, const OpenedRegion& region, int64_t offset,
                              int64_t* bytes) {
  const int element_bytes = DTypeBytes(payload->dtype);
  int64_t total = 0;
  for (const Values& values : payload->values) {
    total += static_cast<int64_t>(values->size()) * element_bytes;
  }
  if (absl::Status in = region.CheckRange(offset, total); !in.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the answer: ", in.message()));
  }
  for (const Values& values : payload->values) {
    const int64_t size = static_cast<int64_t>(values->size()) * element_bytes;
    std::span<const char> wire;
    if (element_bytes == sizeof(float)) {
      wire = {reinterpret_cast<const char*>(values->data()), static_cast<size_t>(size)};
    } else {
      payload->encoded.resize(static_cast<size_t>(size));
      EncodeValuesTo(*values, payload->dtype, payload->encoded.data());
      wire = {payload->encoded.data(), static_cast<size_t>(size)};
    }
    if (absl::Status written = region.Write(offset, wire); !written.ok()) return written;
    offset += size;
  }
  *bytes = total;
  return absl::OkStatus();
}

// Where one table's rows lie, checked against the region and the budget
// `left` (bytes still allowed); InvalidArgument naming the table otherwise.
absl::Status CheckRowsRange(const OpenedRegion& region, absl::string_view what,
                            absl::string_view table, int64_t offset, int64_t bytes, int64_t* left) {
  if (absl::Status in = region.CheckRange(offset, bytes); !in.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of embedding table \"", table, "\": ", in.message()));
  }
  if (bytes > *left) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of embedding table \"", table, "\" take ", bytes,
                     " bytes, more than this PS takes in one request (--max_message_bytes)"));
  }
  *left -= bytes;
  return absl::OkStatus();
}

// Copies region bytes [offset, offset + bytes) into `out` (checked to lie
// within the region).
absl::Status CopyOut(const OpenedRegion& region, int64_t offset, int64_t bytes, std::string* out) {
  out->resize(static_cast<size_t>(bytes));
  return region.Read(offset, {out->data(), out->size()});
}

}  // namespace

absl::Status ReadShmRows(const ShmTransfer& transfer, const OpenedRegion& region,
                         const RpcLimits& limits, PushRequest* push, PullRequest* pull) {
  if (transfer.push_rows().empty() && transfer.pull_rows().empty()) return absl::OkStatus();
  PST_RETURN_IF_ERROR(region.CheckNotShrunk());
  // Every list and range is checked before a byte is copied.
  if (!transfer.push_rows().empty()) {
    if (transfer.push_rows_size() != push->rows_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shared region holds ", transfer.push_rows_size(),
                       " tables' pushed rows; the header names ", push->rows_size()));
    }
    int64_t left = limits.max_request_bytes;
    for (int i = 0; i < push->rows_size(); ++i) {
      const EmbeddingRows& rows = push->rows(i);
      const ShmRows& place = transfer.push_rows(i);
      if (!rows.ids().empty() || !rows.data().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the pushed rows of embedding table \"", rows.table(),
                         "\" are both in the header and in the shared region"));
      }
      PST_RETURN_IF_ERROR(CheckRowsRange(region, "the pushed ids", rows.table(), place.ids_offset(),
                                         place.ids_bytes(), &left));
      PST_RETURN_IF_ERROR(CheckRowsRange(region, "the pushed rows", rows.table(),
                                         place.data_offset(), place.data_bytes(), &left));
    }
  }
  if (!transfer.pull_rows().empty()) {
    const int asked = pull == nullptr ? 0 : pull->rows_size();
    if (transfer.pull_rows_size() != asked) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shared region holds ", transfer.pull_rows_size(),
                       " tables' pulled ids; the pull names ", asked));
    }
    int64_t left = limits.max_request_bytes;
    int64_t rows = 0;  // as CheckPullRows counts them, from the sizes alone
    for (int i = 0; i < asked; ++i) {
      const EmbeddingRows& named = pull->rows(i);
      const ShmRows& place = transfer.pull_rows(i);
      if (!named.ids().empty() || !named.data().empty() || place.data_offset() != 0 ||
          place.data_bytes() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("the pulled ids of embedding table \"", named.table(),
                         "\" must lie in the shared region alone, with no data"));
      }
      PST_RETURN_IF_ERROR(CheckRowsRange(region, "the pulled ids", named.table(),
                                         place.ids_offset(), place.ids_bytes(), &left));
      rows += place.ids_bytes() / static_cast<int64_t>(sizeof(uint64_t));
    }
    PST_RETURN_IF_ERROR(CheckPulledRowCount(rows, limits));
  }
  for (int i = 0; i < transfer.push_rows_size(); ++i) {
    const ShmRows& place = transfer.push_rows(i);
    EmbeddingRows* rows = push->mutable_rows(i);
    PST_RETURN_IF_ERROR(
        CopyOut(region, place.ids_offset(), place.ids_bytes(), rows->mutable_ids()));
    PST_RETURN_IF_ERROR(
        CopyOut(region, place.data_offset(), place.data_bytes(), rows->mutable_data()));
  }
  for (int i = 0; i < transfer.pull_rows_size(); ++i) {
    const ShmRows& place = transfer.pull_rows(i);
    PST_RETURN_IF_ERROR(CopyOut(region, place.ids_offset(), place.ids_bytes(),
                                pull->mutable_rows(i)->mutable_ids()));
  }
  return absl::OkStatus();
}

absl::Status CheckShmRowsAnswer(const ShmTransfer& transfer, int64_t answer_bytes,
                                const OpenedRegion& region) {
  if (absl::Status in = region.CheckRange(transfer.rows_answer_offset(), answer_bytes); !in.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the answer's rows: ", in.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteShmRowsAnswer(const ShmTransfer& transfer, const OpenedRegion& region,
                                PullResponse* header, int64_t* bytes) {
  int64_t total = 0;
  for (const EmbeddingRows& rows : header->rows())
    total += static_cast<int64_t>(rows.data().size());
  PST_RETURN_IF_ERROR(CheckShmRowsAnswer(transfer, total, region));
  int64_t offset = transfer.rows_answer_offset();
  for (EmbeddingRows& rows : *header->mutable_rows()) {
    PST_RETURN_IF_ERROR(region.Write(offset, {rows.data().data(), rows.data().size()}));
    offset += static_cast<int64_t>(rows.data().size());
    rows.clear_data();
  }
  *bytes = total;
  return absl::OkStatus();
}

absl::Status WriteShmAnswer(PullPayload* payload, const OpenedRegion& region, int64_t offset,
                            int64_t* bytes) {
  absl::Status status = WriteAnswerBytes(payload, region, offset, bytes);
  payload->values.clear();  // the variables' buffers go back to the shard
  return status;
}

absl::Status ReadShmPush(const PushRequest& push, std::span<const int64_t> gradient_bytes,
                         const ShmTransfer& transfer, const DType* answer_dtype,
                         const OpenedRegion& region, const RpcLimits& limits,
                         PushRequest* buffer, bool* finite, int64_t* bytes) {
  absl::StatusOr<std::vector<StagePlace>> places = PlanStage(
      push, transfer, AnswerElementBytes(answer_dtype), region, limits, gradient_bytes);
  if (!places.ok()) return places.status();
  return ReadPush(push, *places, region, buffer, bytes, finite);
}

absl::Status StageShmPush(const PushRequest& push, std::span<const int64_t> gradient_bytes,
                          const ShmTransfer& transfer, const DType* answer_dtype,
                          const OpenedRegion& region, const RpcLimits& limits,
                          StreamedUpdate* update, int64_t* bytes, bool answer_as_staged) {
  *bytes = 0;
  absl::StatusOr<std::vector<StagePlace>> places = PlanStage(
      push, transfer, AnswerElementBytes(answer_dtype), region, limits, gradient_bytes);
  if (!places.ok()) return places.status();
  StageBuffers& buffers = ThisThreadsStageBuffers();
  int64_t answer_offset = transfer.answer_offset();  // gradient i's answer
  for (int i = 0; i < push.gradients_size(); ++i) {
    const Tensor& header = push.gradients(i);
    const StagePlace& place = (*places)[i];
    const int element_bytes = DTypeBytes(header.dtype());
    const int64_t elements = place.bytes / element_bytes;
    const bool in_place =
        element_bytes == sizeof(float) && place.push_offset % alignof(float) == 0;
    // The new values of elements [first, first + count), just staged, into
    // the answer (checked to fit by PlanStage).
    auto answer = [&, answer_offset](int64_t first, int64_t count) -> absl::Status {
      if (!answer_as_staged) return absl::OkStatus();
      const float* staged = update->staged_values(i)->data() + first;
      return region.Write(answer_offset + first * static_cast<int64_t>(sizeof(float)),
                          {reinterpret_cast<const char*>(staged), count * sizeof(float)});
    };
    answer_offset += elements * static_cast<int64_t>(sizeof(float));
    if (in_place) {
      // float32 is applied where it lies, a large gradient in parts at once:
      // the optimizer reads each value once, and a value that is not finite
      // (written there before or during the read) gives a result that is
      // not, which refuses the update; a copy and a check pass are saved.
      if (absl::Status s = update->ApplyWhole(
              i, elements, kStageBlockElements,
              [&](VariableStore::StageTarget* target, int64_t first, int64_t count) {
                absl::Status read =
                    region.Visit(place.push_offset + first * element_bytes, count * element_bytes,
                                 [&](std::span<const char> bytes) {
                                   target->Apply(first,
                                                 {reinterpret_cast<const float*>(bytes.data()),
                                                  static_cast<size_t>(count)});
                                 });
                return read.ok() ? answer(first, count) : read;
              });
          !s.ok()) {
        return s;
      }
      if (!update->finite(i)) {
        // Name the culprit if the region still shows it (the commit refuses
        // the update either way).
        for (int64_t first = 0; first < elements; first += kStageBlockElements) {
          const int64_t count = std::min(kStageBlockElements, elements - first);
          const std::span<char> data(reinterpret_cast<char*>(buffers.values.data()),
                                     count * element_bytes);
          if (absl::Status s = region.Read(place.push_offset + first * element_bytes, data);
              !s.ok()) {
            return s;
          }
          if (absl::Status s = CheckGradientFinite(absl::string_view(data.data(), data.size()),
                                                   header.dtype(), first, header.name());
              !s.ok()) {
            return s;
          }
        }
      }
    } else {
      for (int64_t first = 0; first < elements; first += kStageBlockElements) {
        const int64_t count = std::min(kStageBlockElements, elements - first);
        const int64_t offset = place.push_offset + first * element_bytes;
        const std::span<float> values(buffers.values.data(), count);
        // float32 lands as the values themselves; 16-bit types are decoded
        // into them.
        char* landing = element_bytes == sizeof(float) ? reinterpret_cast<char*>(values.data())
                                                       : buffers.wire.data();
        const std::span<char> data(landing, values.size() * element_bytes);
        PST_RETURN_IF_ERROR(region.Read(offset, data));
        const absl::string_view read(data.data(), data.size());
        if (absl::Status s = CheckGradientFinite(read, header.dtype(), first, header.name());
            !s.ok()) {
          return s;
        }
        if (landing != reinterpret_cast<char*>(values.data())) {
          DecodeValues(read, header.dtype(), values);
        }
        update->Apply(i, first, values);
        PST_RETURN_IF_ERROR(answer(first, count));
        update->Progressed();
      }
    }
    *bytes += place.bytes;
  }
  return absl::OkStatus();
}

}  // namespace pst
