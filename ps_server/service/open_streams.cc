#include "ps_server/service/open_streams.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transient_refusal.h"
#include "spdlog/spdlog.h"

namespace pst {

int64_t OpenStreams::SteadyNanos() {
  // Monotonic: a wall-clock step must not end a healthy stream.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

OpenStreams::OpenStreams(const RpcLimits& limits, std::function<int64_t()> push_buffer_budget)
    : limits_(limits),
      push_buffer_budget_(std::move(push_buffer_budget)),
      watchdog_([this] { Watch(); }) {}

OpenStreams::~OpenStreams() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_signal_.Signal();
  }
  watchdog_.join();
}

void OpenStreams::CountRefusal() { ++refused_; }

int64_t OpenStreams::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

std::unique_ptr<OpenStreams::Stream> OpenStreams::Admit(
    std::function<void(const absl::Status&)> end_call) {
  std::function<void(const absl::Status&)> end_displaced;
  absl::Status displaced_status;
  std::unique_ptr<Stream> stream(new Stream(this, std::move(end_call)));
  {
    absl::MutexLock lock(&mu_);
    if (unnamed_ >= limits_.max_streams) {
      Stream* oldest = nullptr;
      for (Stream* open : streams_) {
        if (open->released_ || open->claimed_worker_ || !open->ended_.ok()) continue;
        if (oldest == nullptr || open->arrival_ < oldest->arrival_) oldest = open;
      }
      if (oldest != nullptr) {
        CountRefusal();
        oldest->ended_ = MarkTransient(
            absl::ResourceExhaustedError(absl::StrCat(
                "this exchange had not named its worker when ", unnamed_,
                " such exchanges were open, this PS's limit (--max_streams), and a newer one "
                "came; try again")),
            TransientRefusal::kOverloaded);
        ReleaseLocked(oldest);
        end_displaced = oldest->end_call_;
        displaced_status = oldest->ended_;
      }
    }
    stream->since_.store(SteadyNanos());
    stream->arrival_ = ++arrivals_;
    ++unnamed_;
    streams_.insert(stream.get());
  }
  // Outside mu_: ending a call may run its events, which destroy its Stream.
  if (end_displaced) end_displaced(displaced_status);
  return stream;
}

OpenStreams::Stream::~Stream() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->ReleaseLocked(this);
  owner_->streams_.erase(this);
}

void OpenStreams::Stream::Release() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->ReleaseLocked(this);
}

void OpenStreams::ReleaseLocked(Stream* stream) {
  if (!stream->released_) {
    stream->released_ = true;
    --(stream->claimed_worker_ ? named_ : unnamed_);
  }
  if (stream->claimed_worker_ && --per_worker_[stream->worker_] == 0) {
    per_worker_.erase(stream->worker_);
  }
  stream->claimed_worker_ = false;
  push_buffer_bytes_ -= stream->reserved_bytes_;
  stream->reserved_bytes_ = 0;
}

absl::Status OpenStreams::Stream::ClaimWorker(int worker) {
  absl::MutexLock lock(&owner_->mu_);
  if (claimed_worker_ || released_) return absl::OkStatus();
  if (owner_->named_ >= owner_->limits_.max_streams) {
    owner_->CountRefusal();
    return MarkTransient(absl::ResourceExhaustedError(absl::StrCat(
                             "this PS already serves ", owner_->named_,
                             " exchanges, its limit (--max_streams); try again later")),
                         TransientRefusal::kOverloaded);
  }
  int& open = owner_->per_worker_[worker];
  if (open >= owner_->limits_.max_streams_per_worker) {
    if (open == 0) owner_->per_worker_.erase(worker);
    owner_->CountRefusal();
    return MarkTransient(absl::ResourceExhaustedError(absl::StrCat(
                             "worker:", worker, " already has ", open,
                             " exchanges open on this PS, its limit (--max_streams_per_worker)")),
                         TransientRefusal::kOverloaded);
  }
  ++open;
  --owner_->unnamed_;
  ++owner_->named_;
  worker_ = worker;
  claimed_worker_ = true;
  return absl::OkStatus();
}

absl::Status OpenStreams::Stream::ReservePushBuffer(int64_t bytes) {
  const int64_t budget = owner_->push_buffer_budget_();
  absl::MutexLock lock(&owner_->mu_);
  const int64_t held = owner_->push_buffer_bytes_;
  // One push is always let through, so a budget below one share slows
  // pushes down instead of refusing them all.
  if (held > 0 && held + bytes > budget) {
    owner_->CountRefusal();
    return MarkTransient(absl::ResourceExhaustedError(absl::StrCat(
                             "the pushes this PS is receiving already hold ", held, " bytes; ",
                             bytes, " more would pass its budget of ", budget,
                             " (--max_push_buffer_bytes); try again later")),
                         TransientRefusal::kOverloaded);
  }
  owner_->push_buffer_bytes_ += bytes;
  reserved_bytes_ += bytes;
  if (!metered_.load() && owner_->limits_.min_push_bytes_per_second > 0) {
    metered_.store(true);
    window_start_ = SteadyNanos();
    window_received_ = received_.load(std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

void OpenStreams::Stream::ReceivedAll() { metered_.store(false); }

absl::Status OpenStreams::Stream::ended() const {
  absl::MutexLock lock(&owner_->mu_);
  return ended_;
}

OpenStreams::Stream::ClientWait::ClientWait(Stream* stream) : stream_(stream) {
  stream_->since_.store(SteadyNanos());
  stream_->waiting_.fetch_add(1);
}

OpenStreams::Stream::ClientWait::~ClientWait() {
  stream_->since_.store(SteadyNanos());
  stream_->waiting_.fetch_sub(1);
}

int OpenStreams::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

int OpenStreams::unnamed() const {
  absl::MutexLock lock(&mu_);
  return unnamed_;
}

int64_t OpenStreams::push_buffer_bytes() const {
  absl::MutexLock lock(&mu_);
  return push_buffer_bytes_;
}

std::optional<absl::Status> OpenStreams::TooSlow(Stream* stream, int64_t now) {
  if (!stream->metered_.load()) return std::nullopt;
  const int64_t window_ns = absl::ToInt64Nanoseconds(limits_.stream_idle_timeout);
  if (now - stream->window_start_ < window_ns) return std::nullopt;
  const int64_t received = stream->received_.load(std::memory_order_relaxed);
  const int64_t brought = received - stream->window_received_;
  const double seconds = static_cast<double>(now - stream->window_start_) * 1e-9;
  if (static_cast<double>(brought) >= limits_.min_push_bytes_per_second * seconds) {
    stream->window_start_ = now;
    stream->window_received_ = received;
    return std::nullopt;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the push brought ", brought, " bytes in ", absl::FormatDuration(absl::Nanoseconds(
                                                        now - stream->window_start_)),
      " while it held push buffer budget, below the ", limits_.min_push_bytes_per_second,
      " bytes per second this PS asks (--min_push_bytes_per_second); the call is ended and "
      "nothing of the push was applied"));
}

void OpenStreams::Watch() {
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(limits_.stream_idle_timeout);
  // Checked a few times per timeout: a stream ends within 1.25 timeouts of
  // its last message.
  const absl::Duration poll = std::clamp(limits_.stream_idle_timeout / 4, absl::Milliseconds(5),
                                         absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    stop_signal_.WaitWithTimeout(&mu_, poll);
    const int64_t now = SteadyNanos();
    std::vector<std::pair<std::function<void(const absl::Status&)>, absl::Status>> to_end;
    for (Stream* stream : streams_) {
      if (!stream->ended_.ok()) continue;
      const int64_t idle = now - stream->since_.load();
      if (stream->waiting_.load() == 0 || idle < timeout_ns) {
        // Not idle, but a push may still arrive too slowly.
        if (std::optional<absl::Status> slow = TooSlow(stream, now)) {
          stream->ended_ = *std::move(slow);
          spdlog::warn("ended a push{} arriving below --min_push_bytes_per_second",
                       stream->claimed_worker_ ? absl::StrCat(" of worker:", stream->worker_) : "");
          to_end.emplace_back(stream->end_call_, stream->ended_);
        }
        continue;
      }
      stream->ended_ = absl::DeadlineExceededError(absl::StrCat(
          "the stream waited ", absl::FormatDuration(absl::Nanoseconds(idle)),
          " on the client (for its next message, or for it to read the last one), longer than "
          "this PS allows (--stream_idle_timeout_seconds); the call is ended and nothing of an "
          "unfinished push was applied"));
      spdlog::warn("ended a streamed call{} idle for {} (--stream_idle_timeout_seconds)",
                   stream->claimed_worker_ ? absl::StrCat(" of worker:", stream->worker_) : "",
                   absl::FormatDuration(absl::Nanoseconds(idle)));
      to_end.emplace_back(stream->end_call_, stream->ended_);
    }
    // Outside mu_: ending a call may run its events, which destroy its
    // Stream.
    mu_.Unlock();
    for (auto& [end_call, status] : to_end) end_call(status);
    mu_.Lock();
  }
}

}  // namespace pst
