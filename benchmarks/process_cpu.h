// The CPU time a process has used, for the benchmarks' CPU-per-round-trip
// figures, and its resident memory, for their bytes-per-row figures.
#ifndef PST_BENCHMARKS_PROCESS_CPU_H_
#define PST_BENCHMARKS_PROCESS_CPU_H_

#include <sys/types.h>

#include <cstdint>

namespace pst {

// User plus system CPU seconds of process `pid`, every thread of it, from
// /proc/<pid>/stat; 0 if it cannot be read (the process is gone).
double ProcessCpuSeconds(pid_t pid);

// Resident bytes of process `pid`, from /proc/<pid>/statm; 0 if it cannot
// be read.
int64_t ProcessResidentBytes(pid_t pid);

}  // namespace pst

#endif  // PST_BENCHMARKS_PROCESS_CPU_H_
