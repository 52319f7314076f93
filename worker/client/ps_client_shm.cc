// ShardChannel's same-host path: an exchange whose tensors move through a
// shared region (common/shared_memory.h), gRPC carrying only names, shapes,
// offsets and versions.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/region_handoff.h"
#include "common/tensor_codec.h"
#include "rpc/chunk_wire.h"
#include "spdlog/spdlog.h"
#include "worker/client/shard_channel.h"

namespace pst {

namespace {

// A refusal that means "this shard cannot share memory with us", as
// opposed to a failed call: the worker then uses TCP.
bool IsRefusal(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION:  // disabled, another host or IPC namespace
    case grpc::StatusCode::INVALID_ARGUMENT:     // a region larger than it takes
    case grpc::StatusCode::UNIMPLEMENTED:        // a PS without shared memory
    case grpc::StatusCode::PERMISSION_DENIED:    // the region's proof did not match
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<bool> ShardChannel::UseSharedMemory(int s) {
  Shard& shard = shards_[s];
  // A shard holding only rows shares a region for them; one holding
  // neither slices nor rows (a model without tables) has no use for one.
  if (transport_ == Transport::kTcp || shard.shm_refused ||
      (shard.slices.empty() && tables_.empty())) {
    return false;
  }
  if (shard.tensors_in_region && wire_dtype_ != FLOAT32) {
    // The gradients would be encoded over themselves.
    return absl::FailedPreconditionError(
        absl::StrCat("the wire type changed to ", DType_Name(wire_dtype_),
                     " after AllocateTensors placed float32 tensors in shared memory; set it "
                     "before"));
  }
  if (shard.region_attached) return true;
  auto refuse = [&](absl::string_view why) -> absl::StatusOr<bool> {
    if (!shard.tensors_in_region) {
      shard.region.reset();
    } else if (absl::Status detached = shard.region->Detach(); !detached.ok()) {
      // The tensors stay, at their addresses, in memory no other process
      // can map; without that the worker must not go on computing there.
      return absl::Status(
          detached.code(),
          absl::StrCat("ps:", s, " (", address(s), "): ", why,
                       "; and the tensors could not leave its region: ", detached.message()));
    }
    if (transport_ == Transport::kShm) {
      return absl::FailedPreconditionError(
          absl::StrCat("ps:", s, " (", address(s), "): no shared memory (", why,
                       "); run the worker on the shard's host, in its IPC namespace, or use TCP"));
    }
    shard.shm_refused = true;
    spdlog::info("ps:{} ({}): tensors travel over TCP ({})", s, address(s), std::string(why));
    return false;
  };
  if (shard.region == nullptr) {
    // A push and its answer, each room for float32 whatever the wire type,
    // and room for rows, within the largest region the shard takes.
    int64_t elements = 0;
    for (size_t i : shard.slices) elements += slices_[i].count;
    const int64_t dense_room = elements * static_cast<int64_t>(sizeof(float));
    int64_t rows_room = tables_.empty() ? 0 : kRowsRoomBytes;
    if (shard.max_request_bytes > 0 && shard.max_reply_bytes > 0) {
      rows_room = std::clamp<int64_t>(
          shard.max_request_bytes + shard.max_reply_bytes - 2 * dense_room, 0, rows_room);
    }
    // Nothing of this worker's would lie there (the shard's limits leave
    // no room for rows): its rows stay inline, and no region is made.
    if (dense_room + rows_room == 0) return false;
    absl::StatusOr<std::unique_ptr<SharedRegion>> region =
        SharedRegion::Create(2 * dense_room + rows_room);
    if (!region.ok()) return refuse(region.status().message());
    shard.region = std::move(*region);
    shard.dense_room = dense_room;
  } else if (!shard.region->fresh()) {
    // The shard has (or may have) the old object: only a new one can be
    // offered.
    if (absl::Status renewed = shard.region->Renew(); !renewed.ok()) {
      return refuse(renewed.message());
    }
  }
  absl::StatusOr<std::string> boot_id = HostBootId();
  if (!boot_id.ok()) return refuse(boot_id.status().message());
  uint64_t handle = 0;
  shard.rows_in_region = false;
  grpc::Status rpc = OfferRegion(s, *boot_id, &handle);
  if (!rpc.ok()) {
    if (IsRefusal(rpc)) return refuse(rpc.error_message());
    return ShardError(s, rpc);
  }
  shard.region_handle = handle;
  shard.region_attached = true;
  if (!shard.shm_logged) {
    shard.shm_logged = true;
    spdlog::info("ps:{} ({}): tensors travel through shared memory ({} bytes)", s, address(s),
                 shard.region->bytes().size());
  }
  return true;
}

grpc::Status ShardChannel::OfferRegion(int s, const std::string& boot_id, uint64_t* handle) {
  Shard& shard = shards_[s];
  SharedRegion& region = *shard.region;
  ShmAttachRequest request;
  request.set_worker(worker_);
  request.set_bytes(static_cast<int64_t>(region.bytes().size()));
  request.set_boot_id(boot_id);
  if (region.kind() == SharedRegion::Kind::kSealed) {
    request.set_sealed(true);
    ShmAttachResponse response;
    grpc::ClientContext context;
    PrepareContext(&context, kRpcDeadline);
    grpc::Status rpc = endpoint(s).stub->ShmAttach(&context, request, &response);
    // Refused for what a named region would be refused for too.
    if (!rpc.ok()) return rpc;
    absl::StatusOr<uint64_t> handed =
        response.handoff_socket().empty()
            ? absl::FailedPreconditionError("the shard takes named regions only")
            : HandOverRegion(response.handoff_socket(), response.handoff_nonce(), region.fd(),
                             kRpcDeadline);
    // Handed over or not, the shard may hold it now.
    region.MarkOffered();
    if (handed.ok()) {
      *handle = *handed;
      shard.rows_in_region = response.rows_in_region();
      return grpc::Status::OK;
    }
    spdlog::info("ps:{} ({}): the sealed region was not taken ({}); offering a named one", s,
                 address(s), std::string(handed.status().message()));
    if (absl::Status renewed = region.Renew(SharedRegion::Kind::kNamed); !renewed.ok()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          std::string(renewed.message()));
    }
    request.set_sealed(false);
  }
  request.set_name(region.name());
  request.set_proof(region.proof());
  ShmAttachResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, kRpcDeadline);
  grpc::Status rpc = endpoint(s).stub->ShmAttach(&context, request, &response);
  // Whatever the answer, the name goes: the shard has opened the region
  // (and unlinked it too), or never will.
  region.MarkOffered();
  *handle = response.region();
  shard.rows_in_region = response.rows_in_region();
  return rpc;
}

absl::Status ShardChannel::LeaveRegionAfterFailure(int s, absl::Status failure) {
  Shard& shard = shards_[s];
  shard.region_attached = false;
  if (absl::Status detached = shard.region->Detach(); !detached.ok()) {
    return Reworded(failure, absl::StrCat(failure.message(),
                                          "; and the shared region could not be moved away "
                                          "from the shard: ", detached.message()));
  }
  return failure;
}

absl::StatusOr<ShardChannel::Tensors> ShardChannel::AllocateTensors() {
  std::vector<int64_t> elements;  // per variable
  std::vector<int> pieces;        // slices per variable
  for (const VariableSlice& slice : slices_) {
    if (slice.variable >= elements.size()) {
      elements.resize(slice.variable + 1, 0);
      pieces.resize(slice.variable + 1, 0);
    }
    elements[slice.variable] += slice.count;
    ++pieces[slice.variable];
  }
  Tensors tensors;
  tensors.gradients.resize(elements.size());
  tensors.values.resize(elements.size());
  std::vector<bool> placed(elements.size(), false);
  for (int s = 0; s < num_shards() && wire_dtype_ == FLOAT32; ++s) {
    absl::StatusOr<bool> shared = UseSharedMemory(s);
    if (!shared.ok()) return shared.status();
    if (!*shared) continue;
    // Where SharedRequest puts each gradient and the shard each value: the
    // shard's slices packed in order, the answer after them.
    Shard& shard = shards_[s];
    char* push = shard.region->bytes().data();
    char* answer = push + shard.dense_room;
    int64_t offset = 0;
    for (size_t i : shard.slices) {
      const VariableSlice& slice = slices_[i];
      const size_t count = static_cast<size_t>(slice.count);
      if (pieces[slice.variable] == 1) {
        tensors.gradients[slice.variable] = {reinterpret_cast<float*>(push + offset), count};
        tensors.values[slice.variable] = {reinterpret_cast<float*>(answer + offset), count};
        placed[slice.variable] = true;
        shard.tensors_in_region = true;
      }
      offset += slice.count * static_cast<int64_t>(sizeof(float));
    }
  }
  for (size_t v = 0; v < elements.size(); ++v) {
    if (placed[v]) continue;
    const size_t count = static_cast<size_t>(elements[v]);
    std::vector<float>& memory = own_tensors_.emplace_back(2 * count, 0.0f);
    tensors.gradients[v] = std::span<float>(memory).first(count);
    tensors.values[v] = std::span<float>(memory).subspan(count);
  }
  return tensors;
}

grpc::ByteBuffer ShardChannel::SharedRequest(const ShardExchange& exchange, OpenExchange* open) {
  Shard& shard = shards_[exchange.shard];
  const std::span<char> region = shard.region->bytes();
  const int element_bytes = DTypeBytes(wire_dtype_);
  ShmTransfer transfer;
  transfer.set_region(shard.region_handle);
  transfer.set_push_offset(0);
  transfer.set_answer_offset(shard.dense_room);
  open->answer_offset = transfer.answer_offset();
  PushRequest header;
  header.set_worker(worker_);
  if (shard.rates.has_value()) *header.mutable_rates() = *shard.rates;
  if (exchange.gradients != nullptr) {
    TagPush(exchange.shard, exchange.computed_at, &header);
    char* next = region.data();
    for (size_t i : shard.slices) {
      const VariableSlice& slice = slices_[i];
      Tensor* tensor = header.add_gradients();
      tensor->set_name(slice.name);
      tensor->mutable_shape()->Assign(slice.shape.begin(), slice.shape.end());
      tensor->set_dtype(wire_dtype_);
      const std::span<const float> gradient =
          (*exchange.gradients)[slice.variable].subspan(slice.offset, slice.count);
      // A gradient computed where it goes (AllocateTensors) is sent as is.
      if (element_bytes != sizeof(float) || reinterpret_cast<const char*>(gradient.data()) != next) {
        EncodeValuesTo(gradient, wire_dtype_, next);
      }
      next += slice.count * element_bytes;
    }
  }
  ChunkBuilder builder;
  EmbeddingRowsList* rows =
      exchange.rows != nullptr && exchange.rows->pushes() && exchange.rows_part == 0
          ? exchange.rows->push_rows(exchange.shard)
          : nullptr;
  if (rows != nullptr) TagPush(exchange.shard, exchange.computed_at, &header);
  // Named, so that the values come back in the order of the slices, where
  // AllocateTensors placed them (a push's answer keeps the push's order).
  const bool names_slices = exchange.pull && exchange.gradients == nullptr &&
                            exchange.pull->names().empty() && !exchange.pull->rows_only();
  const bool pulls_rows =
      exchange.pull && exchange.pull->rows_size() > 0 && exchange.rows != nullptr;
  if (shard.rows_in_region && (rows != nullptr || pulls_rows)) {
    // A copy of the pull whose ids move into the region (the exchange is
    // started again, from the same request, after a lost region).
    PullRequest pull;
    if (exchange.pull) pull = *exchange.pull;
    const int64_t answer_bytes =
        pulls_rows ? exchange.rows->pull_answer_bytes(exchange.shard, exchange.rows_part) : 0;
    if (PlaceRowsInRegion(exchange.shard, rows, answer_bytes, &header, pulls_rows ? &pull : nullptr,
                          &transfer)) {
      open->rows_in_region = pulls_rows;
      open->rows_answer_offset = transfer.rows_answer_offset();
      if (names_slices) {
        for (size_t i : shard.slices) pull.add_names(slices_[i].name);
      }
      builder.SetHeader(header);
      if (exchange.pull) builder.SetExtra(pull);
      builder.SetShm(transfer);
      return builder.Finish();
    }
  }
  // The rows inline, lent to the header while it is serialized.
  if (rows != nullptr) header.mutable_rows()->Swap(rows);
  builder.SetHeader(header);
  if (rows != nullptr) header.mutable_rows()->Swap(rows);
  if (names_slices) {
    PullRequest pull = *exchange.pull;
    for (size_t i : shard.slices) pull.add_names(slices_[i].name);
    builder.SetExtra(pull);
  } else if (exchange.pull) {
    builder.SetExtra(*exchange.pull);
  }
  builder.SetShm(transfer);
  return builder.Finish();
}

bool ShardChannel::PlaceRowsInRegion(int s, const EmbeddingRowsList* push, int64_t answer_bytes,
                                     PushRequest* header, PullRequest* pull,
                                     ShmTransfer* transfer) {
  Shard& shard = shards_[s];
  const std::span<char> region = shard.region->bytes();
  const int64_t begin = 2 * shard.dense_room;
  const int64_t room = static_cast<int64_t>(region.size()) - begin;
  int64_t needed = answer_bytes;
  if (push != nullptr) {
    for (const EmbeddingRows& rows : *push) {
      needed += static_cast<int64_t>(rows.ids().size() + rows.data().size());
    }
  }
  if (pull != nullptr) {
    for (const EmbeddingRows& rows : pull->rows())
      needed += static_cast<int64_t>(rows.ids().size());
  }
  if (needed > room) return false;
  int64_t next = begin;
  auto put = [&](const std::string& bytes) {
    const int64_t at = next;
    if (!bytes.empty()) std::memcpy(region.data() + at, bytes.data(), bytes.size());
    next += static_cast<int64_t>(bytes.size());
    return at;
  };
  if (push != nullptr) {
    for (const EmbeddingRows& rows : *push) {
      ShmRows* place = transfer->add_push_rows();
      place->set_ids_offset(put(rows.ids()));
      place->set_ids_bytes(static_cast<int64_t>(rows.ids().size()));
      place->set_data_offset(put(rows.data()));
      place->set_data_bytes(static_cast<int64_t>(rows.data().size()));
      EmbeddingRows* named = header->add_rows();
      named->set_table(rows.table());
      named->set_dtype(rows.dtype());
    }
  }
  if (pull != nullptr) {
    for (EmbeddingRows& rows : *pull->mutable_rows()) {
      ShmRows* place = transfer->add_pull_rows();
      place->set_ids_offset(put(rows.ids()));
      place->set_ids_bytes(static_cast<int64_t>(rows.ids().size()));
      rows.clear_ids();
    }
  }
  transfer->set_rows_answer_offset(next);
  return true;
}

absl::Status ShardChannel::TakeSharedAnswer(const ShardExchange& exchange, const OpenExchange& open) {
  const int s = exchange.shard;
  Shard& shard = shards_[s];
  const int element_bytes = DTypeBytes(wire_dtype_);
  std::vector<size_t> order;
  if (absl::Status checked = CheckPullHeader(s, open.answer.header, open.answer.rows_only, &order);
      !checked.ok()) {
    return checked;
  }
  const std::span<const char> region = shard.region->bytes();
  const char* next = region.data() + open.answer_offset;
  for (size_t k = 0; k < order.size(); ++k) {
    const VariableSlice& slice = slices_[shard.slices[order[k]]];
    std::span<float> values = (*exchange.out)[slice.variable].subspan(slice.offset, slice.count);
    const size_t bytes = static_cast<size_t>(slice.count) * element_bytes;
    const char* destination = reinterpret_cast<const char*>(values.data());
    if (order[k] != k && destination >= region.data() &&
        destination < region.data() + region.size()) {
      // Copying would overwrite values still to be read.
      return absl::InternalError(absl::StrCat(
          "ps:", s, " answered a shared pull out of the order it was asked for"));
    }
    if (element_bytes == sizeof(float)) {
      // Nothing to copy for values that lie where the caller reads them.
      if (destination != next) std::memcpy(values.data(), next, bytes);
    } else {
      DecodeValues(absl::string_view(next, bytes), wire_dtype_, values);
    }
    next += bytes;
  }
  return absl::OkStatus();
}

}  // namespace pst
