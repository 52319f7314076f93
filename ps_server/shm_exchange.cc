#include "ps_server/shm_exchange.h"

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"

namespace pst {

namespace {

// Bytes read from a region at a time: each block is checked for
// non-finite values while it is still in cache, instead of in a second pass
// over the whole gradient.
constexpr int64_t kReadBlockBytes = 256 << 10;

// Reads the push's gradients out of `region` into `buffer`; `answer_bytes`
// gets the size of the pushed variables in `answer_dtype`, `finite` whether
// every value read is finite.
absl::Status ReadPush(const PushRequest& push, int64_t offset, const OpenedRegion& region,
                      DType answer_dtype, PushRequest* buffer, int64_t* pushed_bytes,
                      int64_t* answer_bytes, bool* finite) {
  buffer->set_worker(push.worker());
  buffer->set_computed_at_version(push.computed_at_version());
  // Reuses the buffer's tensors (and their payloads' memory) in place.
  while (buffer->gradients_size() > push.gradients_size())
    buffer->mutable_gradients()->RemoveLast();
  *pushed_bytes = 0;
  *answer_bytes = 0;
  *finite = true;
  for (int i = 0; i < push.gradients_size(); ++i) {
    const Tensor& header = push.gradients(i);
    absl::StatusOr<int64_t> bytes = AnnouncedBytes(header);
    if (!bytes.ok()) return bytes.status();
    if (absl::Status in = region.CheckRange(offset, *bytes); !in.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient \"", header.name(), "\": ", in.message()));
    }
    Tensor* gradient =
        i < buffer->gradients_size() ? buffer->mutable_gradients(i) : buffer->add_gradients();
    gradient->set_name(header.name());
    gradient->mutable_shape()->Assign(header.shape().begin(), header.shape().end());
    gradient->set_dtype(header.dtype());
    std::string* data = gradient->mutable_data();
    data->resize(static_cast<size_t>(*bytes));
    const int element_bytes = std::max(DTypeBytes(header.dtype()), 1);
    const int64_t block = kReadBlockBytes / element_bytes * element_bytes;
    for (int64_t done = 0; done < *bytes; done += block) {
      const int64_t size = std::min(block, *bytes - done);
      if (absl::Status read =
              region.Read(offset + done, {data->data() + done, static_cast<size_t>(size)});
          !read.ok()) {
        return read;
      }
      *finite =
          *finite && EncodedFinite(absl::string_view(data->data() + done, size), header.dtype());
    }
    offset += *bytes;
    *pushed_bytes += *bytes;
    *answer_bytes += *bytes / element_bytes * DTypeBytes(answer_dtype);
  }
  return absl::OkStatus();
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

}  // namespace

absl::Status WriteShmAnswer(PullPayload* payload, const OpenedRegion& region, int64_t offset,
                            int64_t* bytes) {
  absl::Status status = WriteAnswerBytes(payload, region, offset, bytes);
  payload->values.clear();  // the variables' buffers go back to the shard
  return status;
}

absl::Status ReadShmPush(const PushRequest& push, const ShmTransfer& transfer,
                         const DType* answer_dtype, const OpenedRegion& region,
                         const RpcLimits& limits, PushRequest* buffer, bool* finite,
                         int64_t* bytes) {
  if (absl::Status shrunk = region.CheckNotShrunk(); !shrunk.ok()) return shrunk;
  if (absl::Status s = CheckPushSize(push, limits); !s.ok()) return s;
  const DType dtype =
      answer_dtype == nullptr || *answer_dtype == DTYPE_UNSPECIFIED ? FLOAT32 : *answer_dtype;
  int64_t answer_bytes = 0;
  if (absl::Status read = ReadPush(push, transfer.push_offset(), region, dtype, buffer, bytes,
                                   &answer_bytes, finite);
      !read.ok()) {
    return read;
  }
  if (answer_dtype != nullptr) {
    if (absl::Status in = region.CheckRange(transfer.answer_offset(), answer_bytes); !in.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the answer: ", in.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace pst
