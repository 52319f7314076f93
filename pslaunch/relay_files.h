// Where pslaunch --relay finds the HTTP/2 relay (nghttpx) and its
// configuration file.
#ifndef PST_PSLAUNCH_RELAY_FILES_H_
#define PST_PSLAUNCH_RELAY_FILES_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace pst {

// The relay's program and configuration file: `binary` and `conf` as the
// flags give them (--relay_binary, --relay_conf), or, where empty, the
// first nghttpx on PATH, /usr/sbin or /usr/local/sbin and the first
// nghttpx.conf beside `bin_dir` (installed or in the source tree) or in
// /etc/pstrain/relay. FailedPrecondition naming what to install or pass.
absl::StatusOr<std::pair<std::string, std::string>> FindRelay(std::string binary, std::string conf,
                                                              const std::string& bin_dir);

}  // namespace pst

#endif  // PST_PSLAUNCH_RELAY_FILES_H_
