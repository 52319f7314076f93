// Memory for a row store's blocks of records: pieces of one size, carved
// from chunks of at least 2 MiB, 2 MiB-aligned, that the kernel is asked
// to back with transparent huge pages (madvise MADV_HUGEPAGE; where the
// host allows them only on request, as on `madvise`). A large table's rows
// are scattered over memory, and with 4 KiB pages nearly every row's
// update is a TLB miss besides a cache miss; on huge pages the misses of
// many rows share a page.
//
// A piece given back is reused by the next Take; chunks are unmapped when
// the arena is destroyed. A chunk's pages are committed as pieces of it
// are written, so a small table costs the pages it touches (a huge page
// where the kernel grants one), not the chunk.
//
// Thread-safe: a store takes pieces on its shard's thread, and a frozen
// view's blocks give theirs back on whichever thread drops the view last.
#ifndef PST_PS_SERVER_CORE_RECORD_ARENA_H_
#define PST_PS_SERVER_CORE_RECORD_ARENA_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pst {

class RecordArena {
 public:
  // Pieces of `piece_bytes` (> 0) bytes, each 64-byte aligned.
  explicit RecordArena(size_t piece_bytes);
  ~RecordArena();
  RecordArena(const RecordArena&) = delete;
  RecordArena& operator=(const RecordArena&) = delete;

  // A piece, its contents undefined. Throws std::bad_alloc when no memory
  // can be mapped.
  void* Take();
  // Gives back a piece Take returned.
  void Give(void* piece);

  size_t piece_bytes() const { return piece_bytes_; }
  // Bytes mapped: every chunk, used or not.
  size_t mapped_bytes() const;

 private:
  const size_t piece_bytes_;
  const size_t chunk_bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::pair<void*, size_t>> mappings_ ABSL_GUARDED_BY(mu_);
  char* next_ ABSL_GUARDED_BY(mu_) = nullptr;  // the current chunk's unused part
  size_t left_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_RECORD_ARENA_H_
