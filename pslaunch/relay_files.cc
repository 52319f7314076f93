#include "pslaunch/relay_files.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pst {

absl::StatusOr<std::pair<std::string, std::string>> FindRelay(std::string binary, std::string conf,
                                                              const std::string& bin_dir) {
  if (binary.empty()) {
    std::vector<std::string> folders =
        absl::StrSplit(getenv("PATH") == nullptr ? "" : getenv("PATH"), ':', absl::SkipEmpty());
    folders.insert(folders.end(), {"/usr/sbin", "/usr/local/sbin"});
    for (const std::string& folder : folders) {
      const std::string candidate = folder + "/nghttpx";
      if (access(candidate.c_str(), X_OK) == 0) {
        binary = candidate;
        break;
      }
    }
    if (binary.empty()) {
      return absl::FailedPreconditionError(
          "--relay: no nghttpx on PATH, in /usr/sbin or in /usr/local/sbin; install "
          "nghttp2-proxy or pass --relay_binary");
    }
  } else if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--relay_binary=", binary, " is not an executable file"));
  }
  if (conf.empty()) {
    for (const std::string& candidate : {bin_dir + "/../share/pstrain/deploy/relay/nghttpx.conf",
                                         bin_dir + "/../../deploy/relay/nghttpx.conf",
                                         std::string("/etc/pstrain/relay/nghttpx.conf")}) {
      if (std::filesystem::is_regular_file(candidate)) {
        conf = std::filesystem::weakly_canonical(candidate).string();
        break;
      }
    }
    if (conf.empty()) {
      return absl::FailedPreconditionError(
          "--relay: no nghttpx.conf beside --bin_dir or in /etc/pstrain/relay; pass "
          "--relay_conf (the repository's deploy/relay/nghttpx.conf)");
    }
  } else if (!std::filesystem::is_regular_file(conf)) {
    return absl::FailedPreconditionError(absl::StrCat("--relay_conf=", conf, " is not a file"));
  }
  return std::make_pair(binary, conf);
}

}  // namespace pst
