#include "ps_server/core/record_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace pst {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlignment = 64;

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

RecordArena::RecordArena(size_t piece_bytes)
    : piece_bytes_(RoundUp(piece_bytes, kAlignment)),
      chunk_bytes_(RoundUp(piece_bytes_, kHugePage)) {}

RecordArena::~RecordArena() {
  absl::MutexLock lock(&mu_);
  for (const auto& [address, bytes] : mappings_) munmap(address, bytes);
}

void* RecordArena::Take() {
  absl::MutexLock lock(&mu_);
  if (!free_.empty()) {
    void* piece = free_.back();
    free_.pop_back();
    return piece;
  }
  if (left_ < piece_bytes_) {
    // One huge page more than the chunk, so that a 2 MiB boundary falls in
    // it: the chunk starts there (the kernel backs only aligned 2 MiB
    // ranges with a huge page), and the rest is unmapped again.
    const size_t bytes = chunk_bytes_ + kHugePage;
    void* mapped =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    char* const first = static_cast<char*>(mapped);
    char* const start =
        reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(first), kHugePage));
    if (start > first) munmap(first, start - first);
    if (const size_t tail = first + bytes - (start + chunk_bytes_); tail > 0) {
      munmap(start + chunk_bytes_, tail);
    }
    mappings_.emplace_back(start, chunk_bytes_);
    next_ = start;
    left_ = chunk_bytes_;
    // A request, not a need: a host without transparent huge pages refuses
    // it (EINVAL), and the chunk is ordinary memory.
    madvise(next_, chunk_bytes_, MADV_HUGEPAGE);
  }
  void* piece = next_;
  next_ += piece_bytes_;
  left_ -= piece_bytes_;
  return piece;
}

void RecordArena::Give(void* piece) {
  absl::MutexLock lock(&mu_);
  free_.push_back(piece);
}

size_t RecordArena::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const auto& mapping : mappings_) bytes += mapping.second;
  return bytes;
}

}  // namespace pst
