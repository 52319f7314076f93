// Process-wide allocator settings for moving large tensors.
//
// glibc serves every allocation above its mmap threshold (dynamic, at most
// 32 MiB) with a fresh mapping and returns it to the kernel on free, so each
// step's multi-megabyte buffers would be page-faulted in again, and writing
// into a page touched for the first time is many times slower than writing
// into memory already mapped. The binaries that move large tensors
// (ps_server, worker, ps_bench, gpu_bench) call KeepLargeBuffersWarm first
// thing in main, so that the user needs no MALLOC_* environment tuning.
#ifndef PST_COMMON_PROCESS_MEMORY_H_
#define PST_COMMON_PROCESS_MEMORY_H_

namespace pst {

// Serves large allocations from the heap and keeps freed memory mapped, so
// that buffers freed in one step are reused warm in the next. Idempotent.
// Call it before the process starts a thread: it also puts every thread's
// allocations in the one main heap.
void KeepLargeBuffersWarm();

// Gives the kernel back the pages of freed heap memory (malloc_trim), which
// KeepLargeBuffersWarm otherwise keeps: for after a large free that is not
// part of a step's rhythm, e.g. buffers of abandoned calls. Takes the heap's
// lock for a walk of its free chunks (milliseconds for gigabytes).
void ReturnFreedMemory();

}  // namespace pst

#endif  // PST_COMMON_PROCESS_MEMORY_H_
