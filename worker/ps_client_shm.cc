// PsClient's same-host path: an exchange whose tensors move through a
// shared region (common/shared_memory.h), gRPC carrying only names, shapes,
// offsets and versions.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "rpc/chunk_wire.h"
#include "spdlog/spdlog.h"
#include "worker/ps_client.h"

namespace pst {

namespace {

// A refusal that means "this shard cannot share memory with us", as
// opposed to a failed call: the worker then uses TCP.
bool IsRefusal(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION:  // disabled, another host or IPC namespace
    case grpc::StatusCode::INVALID_ARGUMENT:     // a region larger than it takes
    case grpc::StatusCode::UNIMPLEMENTED:        // a PS without shared memory
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<bool> PsClient::UseSharedMemory(int s) {
  Shard& shard = shards_[s];
  if (transport_ == Transport::kTcp || shard.shm_refused) return false;
  if (shard.region != nullptr) return true;
  auto refuse = [&](absl::string_view why) -> absl::StatusOr<bool> {
    if (transport_ == Transport::kShm) {
      return absl::FailedPreconditionError(
          absl::StrCat("ps:", s, " (", shard.address, "): no shared memory (", why,
                       "); run the worker on the shard's host, in its IPC namespace, or use TCP"));
    }
    shard.shm_refused = true;
    spdlog::info("ps:{} ({}): tensors travel over TCP ({})", s, shard.address, std::string(why));
    return false;
  };
  // A push and its answer, each room for float32 whatever the wire type.
  int64_t elements = 0;
  for (size_t i : shard.slices) elements += slices_[i].count;
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create(2 * elements * static_cast<int64_t>(sizeof(float)));
  if (!region.ok()) return refuse(region.status().message());
  absl::StatusOr<std::string> boot_id = HostBootId();
  if (!boot_id.ok()) return refuse(boot_id.status().message());
  ShmAttachRequest request;
  request.set_worker(worker_);
  request.set_name((*region)->name());
  request.set_bytes(static_cast<int64_t>((*region)->bytes().size()));
  request.set_boot_id(*boot_id);
  ShmAttachResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kRpcDeadline);
  grpc::Status rpc = shard.stub->ShmAttach(&context, request, &response);
  // Whatever the answer, the name goes: the shard has opened the region
  // (and unlinked it too), or never will.
  (*region)->Unlink();
  if (!rpc.ok()) {
    if (IsRefusal(rpc)) return refuse(rpc.error_message());
    return ShardError(s, rpc);
  }
  shard.region = std::move(*region);
  shard.region_handle = response.region();
  if (!shard.shm_logged) {
    shard.shm_logged = true;
    spdlog::info("ps:{} ({}): tensors travel through shared memory ({} bytes)", s, shard.address,
                 shard.region->bytes().size());
  }
  return true;
}

grpc::ByteBuffer PsClient::SharedRequest(const ShardExchange& exchange, OpenExchange* open) {
  Shard& shard = shards_[exchange.shard];
  const std::span<char> region = shard.region->bytes();
  const int element_bytes = DTypeBytes(wire_dtype_);
  ShmTransfer transfer;
  transfer.set_region(shard.region_handle);
  transfer.set_push_offset(0);
  transfer.set_answer_offset(static_cast<int64_t>(region.size() / 2));
  open->answer_offset = transfer.answer_offset();
  PushRequest header;
  header.set_worker(worker_);
  if (exchange.gradients != nullptr) {
    header.set_computed_at_version(exchange.computed_at);
    char* next = region.data();
    for (size_t i : shard.slices) {
      const VariableSlice& slice = slices_[i];
      Tensor* tensor = header.add_gradients();
      tensor->set_name(slice.name);
      tensor->mutable_shape()->Assign(slice.shape.begin(), slice.shape.end());
      tensor->set_dtype(wire_dtype_);
      EncodeValuesTo((*exchange.gradients)[slice.variable].subspan(slice.offset, slice.count),
                     wire_dtype_, next);
      next += slice.count * element_bytes;
    }
  }
  ChunkBuilder builder;
  builder.SetHeader(header);
  if (exchange.pull) builder.SetExtra(*exchange.pull);
  builder.SetShm(transfer);
  return builder.Finish();
}

absl::Status PsClient::TakeSharedAnswer(const ShardExchange& exchange, const OpenExchange& open) {
  const int s = exchange.shard;
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  std::vector<size_t> order;
  if (absl::Status checked = CheckPullHeader(s, open.answer.header, &order); !checked.ok()) {
    return checked;
  }
  const char* next = shard.region->bytes().data() + open.answer_offset;
  for (size_t position : order) {
    const VariableSlice& slice = slices_[shard.slices[position]];
    std::span<float> values = (*exchange.out)[slice.variable].subspan(slice.offset, slice.count);
    const size_t bytes = static_cast<size_t>(slice.count) * element_bytes;
    if (element_bytes == sizeof(float)) {
      std::memcpy(values.data(), next, bytes);
    } else {
      DecodeValues(absl::string_view(next, bytes), wire_dtype_, values);
    }
    next += bytes;
  }
  return absl::OkStatus();
}

}  // namespace pst
