// The CPU time a process has used, for the benchmarks' CPU-per-round-trip
// figures, its resident memory, for their bytes-per-row figures, and the
// host's load, which their rows carry.
#ifndef PST_BENCHMARKS_PROCESS_CPU_H_
#define PST_BENCHMARKS_PROCESS_CPU_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace pst {

// User plus system CPU seconds of process `pid`, every thread of it, from
// its CPU-time clock (nanoseconds), else from /proc/<pid>/stat (clock
// ticks); 0 if neither can be read (the process is gone).
double ProcessCpuSeconds(pid_t pid);

// Resident bytes of process `pid`, from /proc/<pid>/statm; 0 if it cannot
// be read.
int64_t ProcessResidentBytes(pid_t pid);

// The host's 1-minute load average as text, or "n/a" if it cannot be read.
std::string LoadAverage();

}  // namespace pst

#endif  // PST_BENCHMARKS_PROCESS_CPU_H_
