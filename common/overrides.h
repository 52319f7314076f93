// The command-line overrides, in one table: every flag that changes the
// job's config, the PS's limits or a program's settings, with the programs
// that take it. The table defines the Abseil flags, decides which program
// accepts which and writes their --help (common/flags.h), applies them
// (OverridesFromFlags, RpcLimitsFromFlags) and makes pslaunch pass them on
// to its tasks (ForwardedFlags). Adding an override is one entry in
// common/overrides.cc; a setting that a program reads itself also needs an
// ABSL_DECLARE_FLAG where it is read.
//
// pslaunch takes every override that ps_server or a worker takes, and
// passes each one it is given on to the tasks that take it.
#ifndef PST_COMMON_OVERRIDES_H_
#define PST_COMMON_OVERRIDES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/server_limits.h"

namespace pst {

// The programs that parse this project's flags (ParseCommandLineFlags).
enum Program : uint32_t {
  kPsServer = 1u << 0,
  kWorker = 1u << 1,
  kPslaunch = 1u << 2,
  kPsctl = 1u << 3,
  kBenchmark = 1u << 4,  // ps_bench, socket_bench, gpu_bench
  kPsreport = 1u << 5,
};
using Programs = uint32_t;

// "ps_server", "worker", ...
absl::string_view ProgramName(Program program);

// What an override changes.
enum class Target {
  kConfig,   // the job's config, over the file, when given
  kLimits,   // the PS's RpcLimits, always: the flag's default is the limit's
  kSetting,  // something the programs that take it read themselves
};

// When pslaunch passes an override it was given on to a task.
enum class Forwarding {
  kEveryStart,  // on the task's command line, restarts included
  kFirstStart,  // on its first start only: a choice a restart must not repeat
};

struct Override {
  const absl::CommandLineFlag* flag;  // name, help, default and current value
  Target target;
  Programs programs;  // pslaunch is implied by ps_server or worker (Takes)
  Forwarding forwarding;
  // kConfig: changes `config` as `value` (the flag's text) says; an error
  // says why the value is refused, without the flag's name.
  std::function<absl::Status(absl::string_view value, JobConfig* config)> to_config;
  // kLimits: sets the flag's current value into `limits`.
  std::function<void(RpcLimits* limits)> to_limits;

  absl::string_view name() const { return flag->Name(); }
  bool Takes(Program program) const;
  // Whether the flag's value differs from its default (a default is never
  // an override, and never passed on).
  bool Given() const;
};

// Every override, in the table's order.
const std::vector<Override>& Overrides();

// The entry of flag `name`, or nullptr when the flag is no override.
const Override* FindOverride(absl::string_view name);

// The config overrides given on the command line, in the table's order.
ConfigOverrides OverridesFromFlags();

// The config override of flag `name` with `value` (tests, tools);
// InvalidArgument when `name` is no config override.
absl::StatusOr<ConfigOverride> ConfigOverrideOf(absl::string_view name, absl::string_view value);

// The PS's limits as the flags set them (their defaults: RpcLimits{}).
RpcLimits RpcLimitsFromFlags();

// "--name=value" for every override given on the command line that `task`
// takes and that pslaunch passes on `when`.
std::vector<std::string> ForwardedFlags(Program task, Forwarding when);

}  // namespace pst

#endif  // PST_COMMON_OVERRIDES_H_
