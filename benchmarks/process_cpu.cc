#include "benchmarks/process_cpu.h"

#include <time.h>
#include <unistd.h>

#include <cstdlib>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pst {

double ProcessCpuSeconds(pid_t pid) {
  // The process's CPU-time clock counts nanoseconds; /proc/<pid>/stat counts
  // clock ticks (10 ms), which a process that has just started may not have
  // reached.
  clockid_t clock;
  timespec time{};
  if (clock_getcpuclockid(pid, &clock) == 0 && clock_gettime(clock, &time) == 0) {
    return static_cast<double>(time.tv_sec) + static_cast<double>(time.tv_nsec) * 1e-9;
  }
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // The command name, field 2, is in parentheses and may hold spaces.
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return 0;
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(name_end + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return 0;  // utime and stime are fields 14 and 15
  int64_t utime = 0, stime = 0;
  if (!absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime)) return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int64_t ProcessResidentBytes(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/statm"));
  int64_t pages = 0, resident = 0;
  if (!(file >> pages >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

std::string LoadAverage() {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 1) return "n/a";
  return absl::StrCat(load[0]);
}

}  // namespace pst
