#include "tests/support/memory_cgroup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace pst {
namespace {

constexpr char kV1Root[] = "/sys/fs/cgroup/memory";
constexpr char kV2Root[] = "/sys/fs/cgroup";

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status Write(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", value, " to ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Create(const std::string& name,
                                                                   int64_t limit_bytes) {
  const std::string leaf = absl::StrCat("pstrain-test-", getpid(), "-", name);
  const bool v1 = access(absl::StrCat(kV1Root, "/memory.limit_in_bytes").c_str(), F_OK) == 0 ||
                  access(absl::StrCat(kV1Root, "/cgroup.procs").c_str(), F_OK) == 0;
  const bool v2 = !v1 && absl::StrContains(Read(absl::StrCat(kV2Root, "/cgroup.subtree_control")),
                                           "memory");
  if (!v1 && !v2) {
    return absl::FailedPreconditionError(
        "no memory cgroup controller to use here (neither cgroup v1's /sys/fs/cgroup/memory "
        "nor cgroup v2 with memory in /sys/fs/cgroup/cgroup.subtree_control)");
  }
  const std::string dir = absl::StrCat(v1 ? kV1Root : kV2Root, "/", leaf);
  if (mkdir(dir.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the memory cgroup ", dir, " (", std::strerror(errno), "): needs root"));
  }
  std::unique_ptr<MemoryCgroup> cgroup(new MemoryCgroup(dir, v2));
  const std::string limit = absl::StrCat(limit_bytes);
  if (v2) {
    PST_RETURN_IF_ERROR(Write(dir + "/memory.max", limit));
    // Where swap is counted apart, none is allowed, so the bound is memory.
    (void)Write(dir + "/memory.swap.max", "0");
  } else {
    PST_RETURN_IF_ERROR(Write(dir + "/memory.limit_in_bytes", limit));
    (void)Write(dir + "/memory.memsw.limit_in_bytes", limit);
  }
  return cgroup;
}

MemoryCgroup::~MemoryCgroup() { rmdir(dir_.c_str()); }

absl::Status MemoryCgroup::Add(pid_t pid) const {
  return Write(dir_ + "/cgroup.procs", absl::StrCat(pid));
}

absl::StatusOr<int64_t> MemoryCgroup::usage() const {
  const std::string path = dir_ + (v2_ ? "/memory.current" : "/memory.usage_in_bytes");
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(Read(path)), &bytes)) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path));
  }
  return bytes;
}

}  // namespace pst
