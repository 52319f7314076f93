// Exchange calls (proto/ps.proto) made message by message through the
// generated stub, as a hostile or minimal client would make them: for the
// tests of the PS's data plane.
#ifndef PST_TESTS_SUPPORT_EXCHANGE_CALLS_H_
#define PST_TESTS_SUPPORT_EXCHANGE_CALLS_H_

#include <fcntl.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/region_handoff.h"
#include "common/shared_memory.h"
#include "gtest/gtest.h"
#include "grpcpp/client_context.h"
#include "ps.grpc.pb.h"
#include "rpc/worker_session.h"

namespace pst {

// What an exchange answered: its messages, and its status.
struct ExchangeOutcome {
  grpc::Status status;
  std::vector<ExchangeAnswer> answers;
  // The last message's `done`, if it had one.
  const ExchangeDone* done() const {
    return answers.empty() || !answers.back().has_done() ? nullptr : &answers.back().done();
  }
};

// Sends `messages` (all of them, then the end of the request) and reads the
// whole answer; as the process of `session` (rpc/worker_session.h) if not 0.
inline ExchangeOutcome CallExchange(ParameterServer::Stub* stub,
                                    const std::vector<ExchangeChunk>& messages,
                                    absl::Duration deadline = absl::Seconds(30),
                                    uint64_t session = 0) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (session != 0) context.AddMetadata(kSessionMetadataKey, absl::StrCat(session));
  auto stream = stub->Exchange(&context);
  for (const ExchangeChunk& message : messages) {
    if (!stream->Write(message)) break;
  }
  stream->WritesDone();
  ExchangeOutcome outcome;
  ExchangeAnswer answer;
  while (stream->Read(&answer)) outcome.answers.push_back(answer);
  outcome.status = stream->Finish();
  return outcome;
}

// An exchange's one message for `push`, whose gradients carry their data:
// the header, and each gradient's bytes as one piece.
inline ExchangeChunk WholePush(const PushRequest& push) {
  ExchangeChunk chunk;
  PushRequest* header = chunk.mutable_header();
  header->set_worker(push.worker());
  header->set_computed_at_version(push.computed_at_version());
  for (int i = 0; i < push.gradients_size(); ++i) {
    Tensor* gradient = header->add_gradients();
    *gradient = push.gradients(i);
    gradient->clear_data();
    TensorPiece* piece = chunk.add_pieces();
    piece->set_tensor(i);
    piece->set_data(push.gradients(i).data());
  }
  return chunk;
}

// An exchange's one message for a pull alone, by `worker`.
inline ExchangeChunk PullOnly(const PullRequest& pull, int worker = 0) {
  ExchangeChunk chunk;
  chunk.mutable_header()->set_worker(worker);
  *chunk.mutable_pull() = pull;
  return chunk;
}

// The values of the answer's variable `tensor`, pieces put back together.
inline std::string AnswerBytes(const std::vector<ExchangeAnswer>& answers, int tensor) {
  std::string bytes;
  for (const ExchangeAnswer& answer : answers) {
    for (const TensorPiece& piece : answer.pieces()) {
      if (piece.tensor() != tensor) continue;
      if (bytes.size() < piece.offset() + piece.data().size()) {
        bytes.resize(piece.offset() + piece.data().size());
      }
      bytes.replace(piece.offset(), piece.data().size(), piece.data());
    }
  }
  return bytes;
}

// Attaches `region` as `worker` through `stub`, as a worker does: a named
// one by name and proof, a sealed one by handing its descriptor to the
// socket the answer names. `*handle` gets the shard's handle for it.
inline grpc::Status AttachRegion(ParameterServer::Stub* stub, int worker, SharedRegion& region,
                                 uint64_t* handle, const std::string& boot_id = "") {
  ShmAttachRequest request;
  request.set_worker(worker);
  request.set_bytes(static_cast<int64_t>(region.bytes().size()));
  request.set_boot_id(boot_id.empty() ? *HostBootId() : boot_id);
  const bool sealed = region.kind() == SharedRegion::Kind::kSealed;
  if (sealed) {
    request.set_sealed(true);
  } else {
    request.set_name(region.name());
    request.set_proof(region.proof());
  }
  ShmAttachResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub->ShmAttach(&context, request, &response);
  *handle = response.region();
  if (!status.ok() || !sealed) return status;
  absl::StatusOr<uint64_t> handed = HandOverRegion(
      response.handoff_socket(), response.handoff_nonce(), region.fd(), absl::Seconds(30));
  if (!handed.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(handed.status().code()),
                        std::string(handed.status().message()));
  }
  *handle = *handed;
  return grpc::Status::OK;
}

// A region of `bytes` made here and attached by `worker` through `stub`,
// its first `elements` floats set to `value` (a gradient at offset 0);
// `*handle` gets the shard's handle for it, `*owner` (if given) a
// descriptor of its own, to shrink it with (the region is then a named
// one: a sealed one cannot shrink).
inline std::unique_ptr<SharedRegion> AttachFilledRegion(ParameterServer::Stub* stub, int worker,
                                                        int64_t bytes, int64_t elements, float value,
                                                        uint64_t* handle, int* owner = nullptr) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(
      bytes, owner != nullptr ? SharedRegion::Kind::kNamed : SharedRegion::Kind::kSealed);
  EXPECT_TRUE(region.ok()) << region.status();
  if (owner != nullptr) *owner = shm_open((*region)->name().c_str(), O_RDWR, 0);
  const grpc::Status status = AttachRegion(stub, worker, **region, handle);
  EXPECT_TRUE(status.ok()) << status.error_message();
  const std::vector<float> gradient(static_cast<size_t>(elements), value);
  std::memcpy((*region)->bytes().data(), gradient.data(), gradient.size() * sizeof(float));
  return std::move(*region);
}

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_EXCHANGE_CALLS_H_
