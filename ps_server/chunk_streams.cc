#include "ps_server/chunk_streams.h"

#include <array>
#include <atomic>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"

namespace pst {
namespace {

// Each gradient's element size, in header order.
std::vector<int> ElementBytes(const PushRequest& header) {
  std::vector<int> sizes;
  for (const Tensor& g : header.gradients()) sizes.push_back(DTypeBytes(g.dtype()));
  return sizes;
}

// Sets up `request` from the stream's header, with every gradient's buffer
// sized as `bytes` (what the shard expects); returns where each gradient's
// bytes go. The buffers keep their old bytes: the pieces overwrite every
// one of them before the stream is accepted.
std::vector<char*> BeginPush(const PushRequest& header, const std::vector<int64_t>& bytes,
                             PushRequest* request) {
  request->set_worker(header.worker());
  request->set_computed_at_version(header.computed_at_version());
  auto* gradients = request->mutable_gradients();
  if (gradients->size() > header.gradients_size()) {
    gradients->DeleteSubrange(header.gradients_size(),
                              gradients->size() - header.gradients_size());
  }
  while (gradients->size() < header.gradients_size()) gradients->Add();
  std::vector<char*> destinations;
  for (int i = 0; i < header.gradients_size(); ++i) {
    const Tensor& announced = header.gradients(i);
    Tensor* gradient = gradients->Mutable(i);
    gradient->set_name(announced.name());
    gradient->mutable_shape()->CopyFrom(announced.shape());
    gradient->set_dtype(announced.dtype());
    gradient->mutable_data()->resize(bytes[i]);
    destinations.push_back(gradient->mutable_data()->data());
  }
  return destinations;
}

// InvalidArgument naming the first non-finite value in `data`, the bytes
// of gradient `name` from byte `offset` on.
absl::Status NonFinitePiece(const std::string& name, DType dtype, int64_t offset,
                            absl::string_view data) {
  std::vector<float> values(data.size() / DTypeBytes(dtype));
  DecodeValues(data, dtype, values);
  const int64_t first = offset / DTypeBytes(dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient for \"", name, "\" has a non-finite value (", values[i], ") at element ",
          first + static_cast<int64_t>(i), "; nothing was applied"));
    }
  }
  return absl::OkStatus();
}

// Copies the chunk's pieces to `destinations` (each gradient's bytes in the
// reassembled push), checking each as it lands (in cache) for a non-finite
// value, which refuses the whole push.
absl::Status AddPieces(const ReceivedChunk& chunk, const PushRequest& header,
                       PieceSequence* sequence, const std::vector<char*>& destinations) {
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor, piece.offset, piece.size); !s.ok()) {
      return s;
    }
    const Tensor& gradient = header.gradients(piece.tensor);
    char* data = destinations[piece.tensor] + piece.offset;
    chunk.CopyData(piece, data);
    const absl::string_view copied(data, piece.size);
    if (!EncodedFinite(copied, gradient.dtype())) {
      return NonFinitePiece(gradient.name(), gradient.dtype(), piece.offset, copied);
    }
  }
  return absl::OkStatus();
}

// Applies the chunk's pieces to `update` a cache-sized block at a time:
// copied out of gRPC's buffers, checked for non-finite values and staged
// while in L1. A non-finite value refuses the whole push.
absl::Status ApplyPieces(const ReceivedChunk& chunk, const PushRequest& header,
                         PieceSequence* sequence, StreamedUpdate* update, int lane) {
  constexpr int64_t kBlockElements = 4096;
  alignas(64) std::array<char, kBlockElements * sizeof(float)> wire;
  alignas(64) std::array<float, kBlockElements> block;
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    if (absl::Status s = sequence->Accept(piece.tensor, piece.offset, piece.size); !s.ok()) {
      return s;
    }
    const Tensor& gradient = header.gradients(piece.tensor);
    const int element_bytes = DTypeBytes(gradient.dtype());
    ReceivedChunk::PieceReader reader(chunk, piece);
    int64_t offset = piece.offset;
    // float32 lands in `block` as it is; 16-bit types are decoded into it.
    char* landing = element_bytes == sizeof(float) ? reinterpret_cast<char*>(block.data())
                                                   : wire.data();
    while (reader.left() >= element_bytes) {  // pieces hold whole elements (Accept)
      const int64_t elements = std::min(kBlockElements, reader.left() / element_bytes);
      const absl::string_view data(landing, elements * element_bytes);
      reader.Read(static_cast<int64_t>(data.size()), landing);
      if (!EncodedFinite(data, gradient.dtype())) {
        return NonFinitePiece(gradient.name(), gradient.dtype(), offset, data);
      }
      const std::span<float> values(block.data(), elements);
      if (landing == wire.data()) DecodeValues(data, gradient.dtype(), values);
      update->Apply(piece.tensor, offset / element_bytes, values, lane);
      offset += static_cast<int64_t>(data.size());
    }
  }
  return absl::OkStatus();
}

}  // namespace

// The lanes of one push; a push that is not split has one, of its own.
class PushJoin {
 public:
  // `buffers` (split pushes) lends the buffer a reassembled push goes into.
  PushJoin(int lanes, ParameterShard* shard, MessagePool<PushRequest>* buffers)
      : lanes_(lanes), shard_(shard), buffers_(buffers), arrived_(lanes, false),
        cancels_(lanes) {}
  ~PushJoin() {
    update_.reset();  // drops an update that was not committed
    if (own_buffer_ != nullptr) buffers_->Give(std::move(own_buffer_));
  }

  // What every lane works on, once the first lane's header has begun it.
  struct Push {
    std::vector<int64_t> bytes;        // each gradient's, on the wire
    StreamedUpdate* update = nullptr;  // applied as it streams in; or null:
    PushRequest* buffer = nullptr;     // reassembled here,
    std::vector<char*> destinations;   // each gradient's bytes in `buffer`
  };

  // Lane `lane` has read its first message: `header`, and `identity`, what
  // every lane of the push must bring alike (the header but for the lane
  // index, and the pull). The first lane begins the push on the shard,
  // reassembling it, if it must be, into `buffer` (a push that is not split)
  // or into a buffer of the join's. Why the lane cannot go on otherwise;
  // `counted` says whether the shard has counted that refusal.
  absl::StatusOr<const Push*> Arrive(int lane, const PushRequest& header, std::string identity,
                                     const StreamCall& call, PushRequest* buffer, bool* counted) {
    *counted = false;
    {
      absl::MutexLock lock(&cancel_mu_);
      cancels_[lane] = call.cancel;
    }
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (arrived_[lane]) {
      return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " of push ",
                                                     header.lane().push_id(), " came twice"));
    }
    arrived_[lane] = true;
    if (begun_) {
      if (identity != identity_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lane ", lane, " of push ", header.lane().push_id(),
            " carries another header or pull than the push's first lane"));
      }
      return &push_;
    }
    begun_ = true;
    identity_ = std::move(identity);
    absl::StatusOr<ParameterShard::StreamedPush> begun = shard_->BeginStreamedPush(header);
    if (!begun.ok()) {
      *counted = true;
      return begun.status();
    }
    push_.bytes = std::move(begun->bytes);
    update_ = std::move(begun->update);
    if (update_ != nullptr) {
      update_->SplitIntoLanes(lanes_);
      update_->SetCancel([this] { CancelLanes(/*except=*/-1); });
      push_.update = update_.get();
    } else {
      if (lanes_ > 1) {
        own_buffer_ = buffers_->Take();
        buffer = own_buffer_.get();
      }
      push_.destinations = BeginPush(header, push_.bytes, buffer);
      push_.buffer = buffer;
    }
    return &push_;
  }

  // Lane `lane` failed with `status`: so does every lane, and the others'
  // calls are ended. A push the shard has not counted (`counted`) is
  // counted as refused unless it was already committed.
  void Fail(int lane, absl::Status status, bool counted) {
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return;
      failure_ = std::move(status);
      if (!counted && !committed_) shard_->CountRejectedPush();
      changed_.SignalAll();
    }
    CancelLanes(lane);
  }

  // The lane has applied or copied all its pieces. The last lane to get here
  // commits the push; the others wait for it. The push's outcome, the same
  // for every lane.
  absl::Status Finish(const StreamCall& call, PushResponse* response) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (++finished_ == lanes_) {
      // Nothing else touches the push now; the shard may call CancelLanes
      // under its own lock, so it is not called under this one.
      mu_.Unlock();
      absl::Status outcome =
          push_.update != nullptr
              ? shard_->CommitStreamedPush(std::move(update_), response)
              : shard_->Push(*push_.buffer, response, {.values_finite = true});
      mu_.Lock();
      outcome_ = outcome;
      response_ = *response;
      committed_ = true;
      changed_.SignalAll();
      return outcome;
    }
    if (absl::Status s = Await(call, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return committed_;
        });
        !s.ok()) {
      return s;
    }
    *response = response_;
    return outcome_;
  }

  // The answer of a push that was not answered as it streamed in: made by
  // the first lane to ask, with `make`, and sent by every lane in part.
  absl::StatusOr<const PreparedPull*> Answer(
      const StreamCall& call, absl::FunctionRef<absl::StatusOr<PreparedPull>()> make) {
    absl::MutexLock lock(&mu_);
    if (!answering_) {
      answering_ = true;
      mu_.Unlock();  // a pull may wait, e.g. for a SYNC step
      absl::StatusOr<PreparedPull> made = make();
      mu_.Lock();
      answer_status_ = made.status();
      if (made.ok()) answer_ = *std::move(made);
      answered_ = true;
      changed_.SignalAll();
    } else if (absl::Status s = Await(call, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                 return answered_;
               });
               !s.ok()) {
      return s;
    }
    if (!answer_status_.ok()) return answer_status_;
    return &answer_;
  }

 private:
  // Waits until `ready`, or until a lane fails, the lanes are cancelled,
  // the call ends or its deadline passes.
  absl::Status Await(const StreamCall& call, absl::FunctionRef<bool()> ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Cancellation and the call's end come without a signal: look every
    // few milliseconds.
    constexpr absl::Duration kLook = absl::Milliseconds(20);
    while (!ready()) {
      if (!failure_.ok()) return failure_;
      if (cancelled_.load()) {
        return absl::AbortedError(
            "a lane of the push stalled while other updates waited; the push was cancelled and "
            "nothing of it was applied");
      }
      if (call.cancelled && call.cancelled()) {
        return absl::CancelledError("the worker went away while the lanes of its push met");
      }
      if (absl::Now() >= call.deadline) {
        return absl::DeadlineExceededError(
            "the other lanes of the push did not all arrive before the call's deadline");
      }
      changed_.WaitWithTimeout(&mu_, kLook);
    }
    return absl::OkStatus();
  }

  // Ends every lane's call but `except`'s.
  void CancelLanes(int except) {
    cancelled_ = except < 0;
    absl::MutexLock lock(&cancel_mu_);
    for (int lane = 0; lane < lanes_; ++lane) {
      if (lane != except && cancels_[lane]) cancels_[lane]();
    }
  }

  const int lanes_;
  ParameterShard* const shard_;
  MessagePool<PushRequest>* const buffers_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  std::string identity_ ABSL_GUARDED_BY(mu_);
  // Written by the first lane under mu_, then read by every lane, which
  // got its address under mu_.
  Push push_;
  std::unique_ptr<StreamedUpdate> update_;
  std::unique_ptr<PushRequest> own_buffer_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);
  PushResponse response_ ABSL_GUARDED_BY(mu_);
  bool answering_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status answer_status_ ABSL_GUARDED_BY(mu_);
  PreparedPull answer_ ABSL_GUARDED_BY(mu_);

  // The shard calls CancelLanes under its own lock (a stalled update), so
  // the lanes' cancels have a lock of their own, never held into the shard.
  absl::Mutex cancel_mu_;
  std::vector<std::function<void()>> cancels_ ABSL_GUARDED_BY(cancel_mu_);
  std::atomic<bool> cancelled_{false};  // by the shard, as stalled
};

std::shared_ptr<PushJoin> PushJoins::Join(const PushRequest& header, ParameterShard* shard) {
  absl::MutexLock lock(&mu_);
  for (auto it = joins_.begin(); it != joins_.end();) {  // those every lane has left
    it = it->second.expired() ? joins_.erase(it) : std::next(it);
  }
  std::weak_ptr<PushJoin>& entry = joins_[{header.worker(), header.lane().push_id()}];
  std::shared_ptr<PushJoin> join = entry.lock();
  if (join == nullptr) {
    join = std::make_shared<PushJoin>(header.lane().count(), shard, &buffers_);
    entry = join;
  }
  return join;
}

namespace {

// The lane a header's stream is, of how many; InvalidArgument for an
// impossible one.
absl::Status CheckLane(const PushRequest& header, bool may_split) {
  const PushLane& lane = header.lane();
  const int lanes = std::max(1, lane.count());
  if (lanes > 1 && !may_split) {
    return absl::InvalidArgumentError("only a PushPull may be split into lanes (PushLane)");
  }
  if (lanes > kMaxLanes || lane.index() < 0 || lane.index() >= lanes) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane.index(), " of ", lane.count(),
                                                   ": a push has 1 to ", kMaxLanes,
                                                   " lanes, numbered from 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ServePushStream(ReadMessage read, const StreamCall& call, ParameterShard* shard,
                             PushRequest* buffer, PushResponse* response, ReceivedPush* received,
                             PushEcho* echo, PushJoins* joins) {
  *received = ReceivedPush{};
  grpc::ByteBuffer message;
  ReceivedChunk chunk;
  PushRequest header;
  std::optional<PieceSequence> sequence;
  std::shared_ptr<PushJoin> join;
  const PushJoin::Push* push = nullptr;
  int lane = 0;
  // Every refusal fails the push's other lanes too, and is counted once.
  auto refuse = [&](absl::Status status, bool counted = false) {
    if (join != nullptr) {
      join->Fail(lane, status, counted);
    } else if (!counted) {
      shard->CountRejectedPush();
    }
    return status;
  };
  while (read(&message)) {
    if (push != nullptr && push->update != nullptr) push->update->Progressed();
    received->bytes += static_cast<int64_t>(message.Length());
    if (absl::Status s = chunk.Parse(&message); !s.ok()) return refuse(s);
    if (!sequence) {
      if (!chunk.has_header()) {
        return refuse(absl::InvalidArgumentError("a push stream must start with its header"));
      }
      if (!chunk.ParseHeader(&header)) {
        return refuse(absl::InvalidArgumentError("a push stream's header is not a PushRequest"));
      }
      received->computed_at_version = header.computed_at_version();
      if (absl::Status s = CheckLane(header, joins != nullptr); !s.ok()) return refuse(s);
      const int lanes = std::max(1, header.lane().count());
      lane = header.lane().index();
      received->counts_push = lane == 0;
      join = lanes > 1 ? joins->Join(header, shard)
                       : std::make_shared<PushJoin>(1, shard, /*buffers=*/nullptr);
      PushRequest identity = header;
      identity.mutable_lane()->clear_index();
      bool counted = false;
      absl::StatusOr<const PushJoin::Push*> begun =
          join->Arrive(lane, header, identity.SerializeAsString() + chunk.ExtraBytes(), call,
                       buffer, &counted);
      if (!begun.ok()) return refuse(begun.status(), counted);
      push = *begun;
      if (echo != nullptr) {
        if (absl::Status s = echo->Start(chunk, header, push->update != nullptr); !s.ok()) {
          return refuse(s);
        }
      }
      std::vector<int64_t> bytes = push->bytes;
      sequence.emplace(lanes > 1 ? PieceSequence::ForLane(std::move(bytes), ElementBytes(header),
                                                          lane, lanes)
                                 : PieceSequence(std::move(bytes), ElementBytes(header)));
    } else if (chunk.has_header()) {
      return refuse(absl::InvalidArgumentError("a push stream carries a second header"));
    }
    absl::Status added =
        push->update != nullptr
            ? ApplyPieces(chunk, header, &*sequence, push->update, lane)
            : AddPieces(chunk, header, &*sequence, push->destinations);
    if (!added.ok()) return refuse(added);
    if (echo != nullptr && push->update != nullptr) {
      if (absl::Status s = echo->Staged(chunk, *push->update); !s.ok()) {
        join->Fail(lane, s, /*counted=*/true);  // the worker went away: not a refusal
        return s;
      }
    }
  }
  if (!sequence) return refuse(absl::InvalidArgumentError("the push stream was empty: no header"));
  if (absl::Status s = sequence->Finish(); !s.ok()) return refuse(s);
  received->join = join;
  received->lane = lane;
  received->lanes = std::max(1, header.lane().count());
  return join->Finish(call, response);
}

void CapturePull(int64_t version, const std::vector<const Variable*>& variables, DType dtype,
                 PullPayload* out) {
  out->header.Clear();
  out->header.set_version(version);
  out->dtype = dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype;
  out->values.clear();
  for (const Variable* v : variables) {
    Tensor* tensor = out->header.add_variables();
    tensor->set_name(v->name);
    tensor->mutable_shape()->Assign(v->shape.begin(), v->shape.end());
    tensor->set_dtype(out->dtype);
    out->values.push_back(v->values);
  }
}

PreparedPull PreparePull(const std::shared_ptr<PullPayload>& payload) {
  PreparedPull pull;
  pull.header = payload->header;
  pull.element_bytes = DTypeBytes(payload->dtype);
  const bool referenced = pull.element_bytes == sizeof(float);  // float32 bytes are the values
  int64_t encoded_bytes = 0;
  for (const Values& values : payload->values) {
    pull.tensor_bytes.push_back(static_cast<int64_t>(values->size()) * pull.element_bytes);
    encoded_bytes += referenced ? 0 : pull.tensor_bytes.back();
  }
  payload->encoded.resize(encoded_bytes);
  char* next = payload->encoded.data();
  for (const Values& values : payload->values) {
    if (referenced) {
      pull.wire.push_back(reinterpret_cast<const char*>(values->data()));
      pull.pins.push_back(values);
    } else {
      EncodeValuesTo(*values, payload->dtype, next);
      pull.wire.push_back(next);
      pull.pins.push_back(payload);
      next += values->size() * pull.element_bytes;
    }
  }
  // From here the pins hold the buffers; the payload need not.
  payload->values.clear();
  return pull;
}

int64_t SendPreparedPull(const PreparedPull& pull, WriteMessage write,
                         const google::protobuf::MessageLite* last_extra, int lane, int lanes) {
  const std::vector<std::vector<PieceRef>> plan =
      PlanChunks(pull.tensor_bytes, std::vector<int>(pull.tensor_bytes.size(), pull.element_bytes));
  std::vector<size_t> chunks;  // this lane's
  for (size_t c = 0; c < plan.size(); ++c) {
    if (LaneOfChunk(c, lanes) == lane) chunks.push_back(c);
  }
  const std::vector<PieceRef> none;
  ChunkBuilder builder;
  int64_t sent = 0;
  for (size_t i = 0; i < std::max<size_t>(1, chunks.size()); ++i) {
    if (i == 0) builder.SetHeader(pull.header);
    for (const PieceRef& ref : chunks.empty() ? none : plan[chunks[i]]) {
      builder.AddPiece(ref.tensor, ref.offset,
                       {pull.wire[ref.tensor] + ref.offset, static_cast<size_t>(ref.bytes)},
                       pull.pins[ref.tensor]);
    }
    const bool last = i + 1 >= chunks.size();
    if (last && last_extra != nullptr) builder.SetExtra(*last_extra);
    grpc::ByteBuffer message = builder.Finish();
    sent += static_cast<int64_t>(message.Length());
    grpc::WriteOptions options;
    if (last) options.set_last_message();
    if (!write(message, options)) return -1;
  }
  return sent;
}

int64_t SendPullPayload(const std::shared_ptr<PullPayload>& payload, WriteMessage write,
                        const google::protobuf::MessageLite* last_extra) {
  return SendPreparedPull(PreparePull(payload), write, last_extra);
}

void AskForPushedVariables(const PushRequest& push, PullRequest* pull) {
  pull->set_worker(push.worker());
  pull->clear_names();
  for (const Tensor& gradient : push.gradients()) pull->add_names(gradient.name());
}

namespace {

absl::Status WorkerWentAway() {
  return absl::CancelledError("the worker went away during a PushPull");
}

// PushPull's answer: the staged values of each chunk as it is staged, or,
// when the push is not applied while it streams in, a pull once it is in.
class PushPullEcho final : public PushEcho {
 public:
  PushPullEcho(WriteMessage write, std::shared_ptr<PullPayload> payload, bool async)
      : write_(write), payload_(std::move(payload)), async_(async) {}

  absl::Status Start(const ReceivedChunk& first, const PushRequest& header,
                     bool streamed) override {
    if (!first.has_extra() || !first.ParseExtra(&pull_)) {
      return absl::InvalidArgumentError(
          "a PushPull's first message must carry its PullRequest (PushChunk.pull)");
    }
    dtype_ = pull_.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : pull_.dtype();
    if (DTypeBytes(dtype_) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown wire dtype ", static_cast<int>(pull_.dtype()), " in a PushPull's pull"));
    }
    if (header.lane().count() > 1) {
      for (const Tensor& gradient : header.gradients()) {
        if (gradient.dtype() != dtype_) {
          return absl::InvalidArgumentError(
              "a PushPull split into lanes must push and pull one dtype: its lanes' answers are "
              "planned as its push");
        }
      }
    }
    AskForPushedVariables(header, &pull_);
    answer_.Clear();
    for (const Tensor& gradient : header.gradients()) {
      Tensor* variable = answer_.add_variables();
      variable->set_name(gradient.name());
      variable->mutable_shape()->CopyFrom(gradient.shape());
      variable->set_dtype(dtype_);
    }
    gradient_element_bytes_ = ElementBytes(header);
    // Committed, the push is the version after the one it was computed at,
    // or later: an ASYNC pull that asks for no more needs no wait. (SSP's
    // pulls may have to wait for slower workers, SYNC's for the step.)
    echo_ = streamed && async_ && pull_.min_version() <= header.computed_at_version() + 1;
    return absl::OkStatus();
  }

  absl::Status Staged(const ReceivedChunk& chunk, const StreamedUpdate& update) override {
    if (!echo_) return absl::OkStatus();  // the answer is a pull once the push is in
    ChunkBuilder builder;
    if (!header_sent_) {
      header_sent_ = true;
      builder.SetHeader(answer_);
      PrepareEncoding(update);
    }
    const int element_bytes = DTypeBytes(dtype_);
    for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
      const int64_t first = piece.offset / gradient_element_bytes_[piece.tensor];
      const int64_t count = piece.size / gradient_element_bytes_[piece.tensor];
      const Values& staged = update.staged_values(piece.tensor);
      const std::span<const float> values(staged->data() + first, count);
      const int64_t offset = first * element_bytes;
      if (element_bytes == sizeof(float)) {  // float32: the staged values are the wire bytes
        builder.AddPiece(piece.tensor, offset,
                         {reinterpret_cast<const char*>(values.data()), values.size_bytes()},
                         staged);
      } else {
        char* wire = encoded_[piece.tensor] + offset;
        EncodeValuesTo(values, dtype_, wire);
        builder.AddPiece(piece.tensor, offset, {wire, static_cast<size_t>(count * element_bytes)},
                         payload_);
      }
    }
    grpc::ByteBuffer message = builder.Finish();
    sent_ += static_cast<int64_t>(message.Length());
    if (!write_(message, grpc::WriteOptions())) {
      return WorkerWentAway();
    }
    return absl::OkStatus();
  }

  // After the push: the answer's end, or all of it if nothing was streamed
  // (this lane's part of it, for a lane of a split push).
  absl::Status Finish(const PushPullContext& context, const ReceivedPush& push,
                      const StreamCall& call, const PushResponse& response) {
    PushPullDone done;
    *done.mutable_push() = response;
    if (echo_) {
      done.set_version(response.version());
      ChunkBuilder builder;
      builder.SetExtra(done);
      grpc::ByteBuffer message = builder.Finish();
      sent_ += static_cast<int64_t>(message.Length());
      grpc::WriteOptions options;
      options.set_last_message();
      if (!write_(message, options)) {
        return WorkerWentAway();
      }
      return absl::OkStatus();
    }
    absl::StatusOr<const PreparedPull*> answer =
        push.join->Answer(call, [&]() -> absl::StatusOr<PreparedPull> {
          absl::Status status = context.shard->PullVisit(
              pull_, context.pull_deadline(pull_),
              [&](int64_t version, const std::vector<const Variable*>& variables) {
                CapturePull(version, variables, dtype_, payload_.get());
              });
          if (!status.ok()) {
            payload_->values.clear();  // nothing captured may stay pinned
            return status;
          }
          return PreparePull(payload_);
        });
    if (!answer.ok()) return answer.status();
    done.set_version((*answer)->header.version());
    const int64_t sent = SendPreparedPull(**answer, write_, &done, push.lane, push.lanes);
    if (sent < 0) return WorkerWentAway();
    sent_ += sent;
    return absl::OkStatus();
  }

  int64_t sent() const { return sent_; }

 private:
  // 16-bit answers are encoded into the payload's buffer, one region per
  // variable.
  void PrepareEncoding(const StreamedUpdate& update) {
    const int element_bytes = DTypeBytes(dtype_);
    if (element_bytes == sizeof(float)) return;
    int64_t total = 0;
    for (int i = 0; i < answer_.variables_size(); ++i) {
      total += static_cast<int64_t>(update.staged_values(i)->size()) * element_bytes;
    }
    payload_->encoded.resize(total);
    char* next = payload_->encoded.data();
    for (int i = 0; i < answer_.variables_size(); ++i) {
      encoded_.push_back(next);
      next += update.staged_values(i)->size() * element_bytes;
    }
  }

  WriteMessage write_;
  std::shared_ptr<PullPayload> payload_;
  const bool async_;  // the shard's mode is ASYNC
  PullRequest pull_;
  DType dtype_ = FLOAT32;
  PullResponse answer_;  // the header: the pushed variables, no data
  std::vector<int> gradient_element_bytes_;
  std::vector<char*> encoded_;
  bool echo_ = false;         // each staged chunk's values go back at once
  bool header_sent_ = false;
  int64_t sent_ = 0;
};

}  // namespace

absl::Status ServePushPull(ReadMessage read, WriteMessage write, const StreamCall& call,
                           const PushPullContext& context, PushResponse* response,
                           ReceivedPush* received, int64_t* bytes_sent) {
  PushPullEcho echo(write, context.payloads->Take(), context.shard->mode() == ASYNC);
  absl::Status status = ServePushStream(read, call, context.shard, context.buffer, response,
                                        received, &echo, context.joins);
  if (status.ok()) status = echo.Finish(context, *received, call, *response);
  received->join.reset();
  *bytes_sent = echo.sent();
  return status;
}

std::shared_ptr<PullPayload> PullPayloadPool::Take() {
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<PullPayload>& payload : payloads_) {
    if (payload.use_count() == 1) {
      // gRPC's last read of its bytes happened before it dropped its pin.
      std::atomic_thread_fence(std::memory_order_acquire);
      return payload;
    }
  }
  payloads_.push_back(std::make_shared<PullPayload>());
  return payloads_.back();
}

}  // namespace pst
