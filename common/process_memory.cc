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
}

}  // namespace pst
