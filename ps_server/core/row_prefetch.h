// Reads a tiered table's cold rows ahead of the calls that need them, on a
// thread of its own, so that those calls rarely wait on the disk.
//
// The rows a worker's exchange pulls are the rows its next push trains:
// when an exchange arrives, the shard Requests the pulled ids the table
// does not hold in RAM; this reader fetches them from the disk tier while
// the exchange waits for its step (the other ranks, the apply). The pull's
// answer then Reads them (leaving them here), and the next update's
// promotion Takes them, so each cold row is read from disk once, off the
// shard's lock.
//
// Freshness. A row here is what the disk tier held when it was read. The
// owner calls Forget for every id it writes to or deletes from the disk
// tier, before the write: an entry of such an id is dropped, and a read of
// it in flight is discarded when it lands. So a row served from here is
// always the disk tier's current row (or its absence: a row never stored
// there, answered by its initial value).
//
// Bounds. At most `max_rows` rows are held or in flight; ids requested
// past that are not read ahead (counted in skipped()). Rows that no call
// took are dropped once they are `max_age` ticks older than the newest
// request (a pull of rows that no update trains: an evaluation).
//
// Thread-safety: every method may be called from any thread; the owner
// calls Request, Forget, Read and Take under its shard's lock, and the
// reader never takes that lock, so a Read or Take that waits for a read in
// flight cannot deadlock.
#ifndef PST_PS_SERVER_CORE_ROW_PREFETCH_H_
#define PST_PS_SERVER_CORE_ROW_PREFETCH_H_

#include <cstdint>
#include <deque>
#include <span>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ps_server/core/disk_rows.h"

namespace pst {

class RowPrefetch {
 public:
  // `disk` must outlive this object.
  RowPrefetch(const DiskRows* disk, int64_t max_rows, int64_t max_age);
  // Stops the reader; reads in flight finish first.
  ~RowPrefetch();
  RowPrefetch(const RowPrefetch&) = delete;
  RowPrefetch& operator=(const RowPrefetch&) = delete;

  // Queues reads of `ids` (cold now, as the owner sees them) at `tick`.
  // An id already held or queued is not read again; its tick is renewed.
  void Request(std::span<const uint64_t> ids, int64_t tick);
  // Drops what is held or in flight for `ids` (see Freshness).
  void Forget(std::span<const uint64_t> ids);

  enum class Outcome {
    kReady,   // the row was here, read ahead
    kWaited,  // its read was in flight; the call waited for it
    kAbsent,  // never requested, or forgotten or dropped: the caller reads the disk itself
  };
  struct Answer {
    Outcome outcome = Outcome::kAbsent;
    // With kReady or kWaited: whether the disk tier held the row (else the
    // row has its initial value), and the read's error, if any.
    bool found = false;
    absl::Status status;
  };
  // `id`'s row into *row, keeping it here for a later Take (unless its
  // read failed: a failed read is answered once).
  Answer Read(uint64_t id, DiskRow* row);
  // `id`'s row into *row, removing it from here.
  Answer Take(uint64_t id, DiskRow* row);

  // Rows read ahead; requested ids not read ahead for want of room.
  int64_t prefetched() const;
  int64_t skipped() const;
  // Rows or reads held now.
  int64_t size() const;

 private:
  struct Entry {
    uint64_t serial = 0;  // which request the entry is; a stale read's serial differs
    int64_t tick = 0;
    bool ready = false;
    bool found = false;
    absl::Status status;
    DiskRow row;
  };

  Answer Serve(uint64_t id, DiskRow* row, bool take);
  void Run();
  // Drops the ready rows older than max_age ticks before newest_tick_.
  void DropOld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DiskRows* const disk_;
  const int64_t max_rows_;
  const int64_t max_age_;
  mutable absl::Mutex mu_;
  absl::CondVar landed_;  // a read landed or was discarded
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, uint64_t>> queue_ ABSL_GUARDED_BY(mu_);  // id, serial
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t newest_tick_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t swept_tick_ ABSL_GUARDED_BY(mu_) = 0;  // newest_tick_ at the last DropOld
  int64_t prefetched_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ROW_PREFETCH_H_
