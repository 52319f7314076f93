#include "common/process_memory.h"

#include <malloc.h>

namespace pst {

void KeepLargeBuffersWarm() {
  // No allocation is served by a private mapping: mmap'd chunks are unmapped
  // on free, and the dynamic threshold stops adapting at 32 MiB, below a
  // 64 MiB model.
  mallopt(M_MMAP_MAX, 0);
  // Freed memory at the top of the heap stays mapped (up to 1 GiB) instead of
  // being trimmed and faulted in again by the next step.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  // Every thread allocates from the main heap. A thread's own arena lives in
  // 64 MiB mappings that glibc unmaps whenever one falls empty, whatever the
  // trim threshold, and gRPC's receive buffers come and go on its poller
  // threads: a 64 MiB push+pull took about 3 900 page faults (16 MB of fresh
  // pages) per round trip that way, and 13% more CPU (ps_bench).
  // Must run before the process starts its second thread.
  mallopt(M_ARENA_MAX, 1);
}

void ReturnFreedMemory() { malloc_trim(0); }

}  // namespace pst
