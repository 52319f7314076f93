#include "ps_server/core/row_prefetch.h"

#include <algorithm>
#include <array>
#include <vector>

namespace pst {

namespace {
// Ids a read pass takes from the queue at once: the lock is let go for the
// pass, so a Request or a waiter gets in between passes.
constexpr size_t kReadPass = 256;
}  // namespace

RowPrefetch::RowPrefetch(const DiskRows* disk, int64_t max_rows, int64_t max_age)
    : disk_(disk), max_rows_(max_rows), max_age_(max_age), reader_([this] { Run(); }) {}

RowPrefetch::~RowPrefetch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reader_.join();
}

void RowPrefetch::Request(std::span<const uint64_t> ids, int64_t tick) {
  absl::MutexLock lock(&mu_);
  newest_tick_ = std::max(newest_tick_, tick);
  if (newest_tick_ - swept_tick_ > max_age_) DropOld();
  for (uint64_t id : ids) {
    if (auto it = entries_.find(id); it != entries_.end()) {
      it->second.tick = tick;
      continue;
    }
    if (static_cast<int64_t>(entries_.size()) >= max_rows_) {
      ++skipped_;
      continue;
    }
    const uint64_t serial = next_serial_++;
    Entry& entry = entries_[id];
    entry.serial = serial;
    entry.tick = tick;
    queue_.emplace_back(id, serial);
  }
}

void RowPrefetch::Forget(std::span<const uint64_t> ids) {
  absl::MutexLock lock(&mu_);
  if (entries_.empty()) return;
  for (uint64_t id : ids) entries_.erase(id);
}

RowPrefetch::Answer RowPrefetch::Read(uint64_t id, DiskRow* row) { return Serve(id, row, false); }

RowPrefetch::Answer RowPrefetch::Take(uint64_t id, DiskRow* row) { return Serve(id, row, true); }

RowPrefetch::Answer RowPrefetch::Serve(uint64_t id, DiskRow* row, bool take) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
  Answer answer;
  answer.outcome = Outcome::kReady;
  if (!it->second.ready) {
    answer.outcome = Outcome::kWaited;
    const uint64_t serial = it->second.serial;
    // The entry may go (Forget on another thread) while this waits.
    while (true) {
      landed_.Wait(&mu_);
      it = entries_.find(id);
      if (it == entries_.end() || it->second.serial != serial) return {};
      if (it->second.ready) break;
    }
  }
  Entry& entry = it->second;
  answer.found = entry.found;
  answer.status = entry.status;
  // A failed read is answered once: the next call reads the disk itself.
  if (take || !entry.status.ok()) {
    *row = std::move(entry.row);
    entries_.erase(it);
  } else {
    *row = entry.row;
  }
  return answer;
}

void RowPrefetch::Run() {
  std::vector<std::pair<uint64_t, uint64_t>> pass;
  std::vector<uint64_t> ids;
  std::vector<DiskRow> rows;
  std::array<bool, kReadPass> found;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](RowPrefetch* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      if (stopping_) return;
      pass.clear();
      while (!queue_.empty() && pass.size() < kReadPass) {
        pass.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    // In id order, the disk tier's key order: one batched read.
    std::sort(pass.begin(), pass.end());
    ids.resize(pass.size());
    for (size_t i = 0; i < pass.size(); ++i) ids[i] = pass[i].first;
    rows.resize(pass.size());
    const absl::Status status =
        disk_->GetSorted(ids, rows, std::span<bool>(found.data(), pass.size()));
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < pass.size(); ++i) {
      auto it = entries_.find(pass[i].first);
      // Forgotten (or forgotten and requested again) while it was read.
      if (it == entries_.end() || it->second.serial != pass[i].second) continue;
      it->second.ready = true;
      it->second.found = found[i];
      it->second.status = status;
      it->second.row = std::move(rows[i]);
      ++prefetched_;
    }
    landed_.SignalAll();
  }
}

void RowPrefetch::DropOld() {
  swept_tick_ = newest_tick_;
  const int64_t oldest_kept = newest_tick_ - max_age_;
  absl::erase_if(entries_, [oldest_kept](const auto& entry) {
    return entry.second.ready && entry.second.tick < oldest_kept;
  });
}

int64_t RowPrefetch::prefetched() const {
  absl::MutexLock lock(&mu_);
  return prefetched_;
}

int64_t RowPrefetch::skipped() const {
  absl::MutexLock lock(&mu_);
  return skipped_;
}

int64_t RowPrefetch::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace pst
