// The shard's end of a shared-memory exchange (ps_server/service/shm_exchange.h) on
// control messages and region contents from the fuzzer's input: the first
// byte says how to size the region (and whether to shrink it under the
// shard, and whether the exchange pulls), the next two give the length of a
// serialized ExchangeChunk (its header, pull and shm), which follows, and
// the rest is written into the region. The push and the pull run as the
// service runs them (ps_server/service/exchange_shm_path.cc): the push read whole and
// then applied, or (control bit 64, where the shard can stream it) staged
// straight out of the region, with the answer written as it is staged
// where it pulls and bit 128 is set. Embedding rows the shm part places in
// the region (ShmTransfer.push_rows, pull_rows) are copied out of it first
// (ReadShmRows), the answer's room for rows checked, and the rows answered
// written back into it, as the call does (ps_server/service/exchange_call.cc).
// Whatever they say:
//  - nothing outside the region is read or written (ASan watches the
//    shard's buffers; the shard's mapping of the region is touched only
//    through OpenedRegion, which checks every range against it), and a
//    region shrunk under the shard is refused, not a crash;
//  - the model stays finite, its embedding rows too;
//  - the version moves only with a push the shard reports as applied, and
//    a refused exchange (no push outcome) leaves it where it was: rows
//    placed outside the region, lists that do not match the header's, more
//    than the limits allow, an answer without room for its rows;
//  - a push that did not move the version (refused rows: unknown tables,
//    ids twice or cut short, rows of the wrong width, non-finite values)
//    left every table as it was, rows, optimizer state and counters.
// The shard (fuzz/small_shard.h) holds embedding tables, so the rows a
// header carries inline or places in the region, and the rows a pull
// names, reach them.
// A broken promise is reported on stderr and ends the run with a trap.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/push_outcome.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "fuzz/small_shard.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/shm_exchange.h"
#include "ps_server/core/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst::fuzz {
namespace {

bool ModelFinite(ParameterShard* shard) {
  PullRequest pull;
  PullResponse response;
  if (!pst::Pull(*shard, pull, absl::Now(), &response).ok()) return false;
  for (const Tensor& t : response.variables()) {
    std::vector<float> values(t.data().size() / sizeof(float));
    DecodeTensor(t, values);
    for (float v : values) {
      if (!std::isfinite(v)) return false;
    }
  }
  return true;
}

// Every table's rows, state and counters, as a checkpoint holds them.
std::string Tables(ParameterShard* shard) {
  const ShardCheckpoint snapshot = shard->Snapshot();
  std::string tables;
  for (const ShardCheckpoint::Embedding& e : snapshot.embeddings()) {
    tables += e.SerializeAsString();
  }
  return tables;
}

bool RowsFinite(ParameterShard* shard) {
  const ShardCheckpoint snapshot = shard->Snapshot();
  for (const ShardCheckpoint::Embedding& e : snapshot.embeddings()) {
    for (size_t i = 0; i + sizeof(float) <= e.values().size(); i += sizeof(float)) {
      float v;
      std::memcpy(&v, e.values().data() + i, sizeof(float));
      if (!std::isfinite(v)) return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace pst::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pst;
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  if (size < 3) return 0;
  const uint8_t control = data[0];
  const size_t request_bytes = std::min<size_t>(data[1] | (data[2] << 8), size - 3);
  ExchangeChunk request;
  if (!request.ParseFromArray(data + 3, static_cast<int>(request_bytes))) return 0;
  const uint8_t* contents = data + 3 + request_bytes;
  const size_t contents_bytes = size - 3 - request_bytes;

  static std::unique_ptr<ParameterShard> shard = fuzz::MakeSmallShard();
  static PullPayloadPool payloads;
  static PushRequest buffer;
  // Small bounds, for the rows' checks against them to be reached.
  static const RpcLimits limits{
      .max_request_bytes = 8192, .max_names_per_request = 8, .max_rows_per_pull = 64};
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t region_bytes = page * (1 + (control & 3));
  // Named, so that a hostile owner can shrink it (a sealed one cannot).
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create(region_bytes, SharedRegion::Kind::kNamed);
  FUZZ_INVARIANT(region.ok());
  std::memcpy((*region)->bytes().data(), contents,
              std::min<size_t>(contents_bytes, (*region)->bytes().size()));
  // A hostile owner shrinks the region after the shard opened it.
  const int owner = (control & 4) ? shm_open((*region)->name().c_str(), O_RDWR, 0) : -1;
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Open((*region)->name(), region_bytes, (*region)->proof());
  FUZZ_INVARIANT(opened.ok());
  if (owner >= 0) {
    FUZZ_INVARIANT(ftruncate(owner, ((control >> 3) & 3) * page / 2) == 0);
    close(owner);
  }
  // The one worker's exchanges; a pull never waits.
  PushRequest header = request.header();
  header.set_worker(0);
  const bool pushes = header.gradients_size() > 0 || header.rows_size() > 0;  // as the service
  const bool pulls = (control & 32) != 0;
  PullRequest pull = request.pull();
  pull.set_worker(0);
  const int64_t before = shard->version();
  const std::string tables_before = pushes ? fuzz::Tables(shard.get()) : std::string();
  PushResponse pushed;
  // The rows in the region, copied out before anything is applied, and the
  // room for the answer's rows checked.
  absl::Status status =
      ReadShmRows(request.shm(), **opened, limits, &header, pulls ? &pull : nullptr);
  if (status.ok() && pulls && RowsAnswerInRegion(request.shm())) {
    status = CheckPullRows(pull, limits);
    if (status.ok()) {
      status = CheckShmRowsAnswer(request.shm(), shard->RowsAnswerBytes(pull), **opened);
    }
  }
  if (status.ok() && pushes) {
    const DType dtype = pull.dtype();
    const DType* answer_dtype = pulls ? &dtype : nullptr;
    absl::StatusOr<ParameterShard::StreamedPush> begun = shard->BeginStreamedPush(header);
    status = begun.status();
    int64_t bytes = 0;
    if (status.ok() && (control & 64) && begun->update != nullptr) {
      status = StageShmPush(header, begun->bytes, request.shm(), answer_dtype, **opened, limits,
                            begun->update.get(), &bytes, pulls && (control & 128));
      if (status.ok()) status = shard->CommitStreamedPush(std::move(begun->update), &pushed);
    } else if (status.ok()) {
      begun->update.reset();  // as when another update holds the staging
      bool finite = false;
      status = ReadShmPush(header, begun->bytes, request.shm(), answer_dtype, **opened, limits,
                           &buffer, &finite, &bytes);
      if (status.ok()) status = pst::Push(*shard, buffer, &pushed, {.values_finite = finite});
    }
  }
  const int64_t moved = shard->version() - before;
  FUZZ_INVARIANT(moved == (AdvancedTheVersion(pushed.outcome()) ? 1 : 0));
  if (!status.ok()) FUZZ_INVARIANT(moved == 0);
  if (pushes && moved == 0) FUZZ_INVARIANT(fuzz::Tables(shard.get()) == tables_before);
  if (status.ok() && pulls) {
    if (pushes) {
      AskForPushedVariables(header, &pull);
    } else {
      status = CheckPullNames(pull, limits);
    }
    std::shared_ptr<PullPayload> payload = payloads.Take();
    if (status.ok()) {
      status = pst::PullVisit(
          *shard, pull, absl::Now(),
          [&](int64_t version, const std::vector<const Variable*>& variables,
              const PulledRows& rows) {
            CapturePull(version, variables, pull.dtype(), payload.get());
            FUZZ_INVARIANT(rows.AnswerTo(&payload->header).ok());  // no disk tier here
          });
    }
    int64_t written = 0;
    if (status.ok()) {
      status = WriteShmAnswer(payload.get(), **opened, request.shm().answer_offset(), &written);
    }
    if (status.ok() && RowsAnswerInRegion(request.shm())) {
      status = WriteShmRowsAnswer(request.shm(), **opened, &payload->header, &written);
      for (const EmbeddingRows& rows : payload->header.rows()) {
        FUZZ_INVARIANT(!status.ok() || rows.data().empty());  // the values went to the region
      }
    }
    payload->values.clear();
  }
  FUZZ_INVARIANT(shard->version() - before == moved);  // a pull changes nothing
  FUZZ_INVARIANT(fuzz::ModelFinite(shard.get()));
  FUZZ_INVARIANT(fuzz::RowsFinite(shard.get()));
  return 0;
}
