// A memory cgroup a test makes for processes it starts, so that what they
// commit is charged to a bound of the test's choosing, as a container's
// memory limit would charge it. Needs root and a writable memory
// controller (cgroup v1's /sys/fs/cgroup/memory, or v2 with memory
// delegated at /sys/fs/cgroup); Create says why not otherwise, for the
// test to skip with that reason.
#ifndef PST_TESTS_SUPPORT_MEMORY_CGROUP_H_
#define PST_TESTS_SUPPORT_MEMORY_CGROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pst {

class MemoryCgroup {
 public:
  // A new cgroup named after this process and `name`, limited to
  // `limit_bytes` (swap included where the kernel counts it).
  // FailedPrecondition, saying what is missing, where none can be made.
  static absl::StatusOr<std::unique_ptr<MemoryCgroup>> Create(const std::string& name,
                                                             int64_t limit_bytes);
  // Removes the cgroup; every process put in it must have ended.
  ~MemoryCgroup();

  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  // Moves process `pid` into the cgroup: what it commits from then on is
  // charged here.
  absl::Status Add(pid_t pid) const;
  // Bytes charged to the cgroup now.
  absl::StatusOr<int64_t> usage() const;

 private:
  MemoryCgroup(std::string dir, bool v2) : dir_(std::move(dir)), v2_(v2) {}
  std::string dir_;
  bool v2_;
};

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_MEMORY_CGROUP_H_
