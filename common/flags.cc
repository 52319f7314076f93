#include "common/flags.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/exit.h"
#include "common/security.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "",
          "Cluster + job config (protobuf text format, or JSON). Empty: the built-in "
          "configs/local.textproto (Fashion-MNIST, 1 PS + 2 workers, SYNC).");
ABSL_FLAG(std::string, mode, "", "Override training.mode: sync, async or ssp.");
ABSL_FLAG(std::string, wire_dtype, "",
          "Override training.wire_dtype: fp32, fp16 or bf16 for parameters and gradients on the wire.");
ABSL_FLAG(std::string, device, "",
          "Override training.device, where workers compute: auto (a GPU when one is visible, "
          "else the CPU), cpu, or gpu:N.");
ABSL_FLAG(std::string, devices, "",
          "Override training.devices: towers, the local devices one worker splits each batch "
          "over, e.g. cpu:2 (two CPU towers, a thread each), gpu:0,gpu:1, or gpu:all. The batch "
          "size must divide evenly among them.");
ABSL_FLAG(std::string, exchange_schedule, "",
          "Override training.exchange: layerwise (push each layer's gradient as backward "
          "produces it and start each layer of the next forward pass once its parameters are "
          "in) or whole_model (one push after backward, the whole model back before forward).");
ABSL_FLAG(std::string, shm, "",
          "Override cluster.shm: auto (a worker and a PS shard on the same host move tensors "
          "through shared memory, gRPC carries only control messages) or off (every byte over "
          "TCP).");
ABSL_FLAG(int, staleness, -1, "Override training.staleness, the SSP bound (-1 = keep the config's).");
ABSL_FLAG(int, epochs, 0, "Override training.epochs (0 = keep the config's).");
ABSL_FLAG(int, workers, 0, "Override cluster.workers (0 = keep the config's).");
ABSL_FLAG(int, batch_size, 0, "Override training.batch_size, per worker (0 = keep the config's).");
ABSL_FLAG(float, learning_rate, 0.0f,
          "Override the optimizer's learning rate (0 = keep the config's).");
ABSL_FLAG(bool, check_config, false,
          "Only check the config (after ${VAR} expansion and the flag overrides), the task, and "
          "the files this host's tasks would use (TLS files, token, checkpoint directory); print "
          "a one-line summary and exit: 0 if valid, 2 with the error if not.");

namespace pst {

absl::Status CheckCommandLine(int argc, char** argv) {
  // Abseil's own flags (help, flag files) are left to its parser.
  static const std::set<absl::string_view> kAbseilFlags = {
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument
    const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t equals = body.find('=');
    const absl::string_view name = body.substr(0, equals);
    if (kAbseilFlags.count(name) > 0) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && equals == absl::string_view::npos && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --noflag
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "; see --help"));
    }
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(body.substr(equals + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    // Sets the flag to the value the parser will set it to anyway.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", error));
    }
  }
  return absl::OkStatus();
}

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.version_string = [program = std::filesystem::path(argv[0]).filename().string()] {
    return absl::StrCat(program, " (pstrain) ", PST_VERSION, "\n");
  };
  absl::SetFlagsUsageConfig(config);
  if (absl::Status s = CheckCommandLine(argc, argv); !s.ok()) {
    ExitWithError(std::filesystem::path(argv[0]).filename().string(), s);
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");
  return positional;
}

ConfigOverrides OverridesFromFlags() {
  ConfigOverrides overrides;
  if (std::string mode = absl::GetFlag(FLAGS_mode); !mode.empty()) overrides.mode = mode;
  if (int v = absl::GetFlag(FLAGS_epochs); v != 0) overrides.epochs = v;
  if (int v = absl::GetFlag(FLAGS_workers); v != 0) overrides.workers = v;
  if (int v = absl::GetFlag(FLAGS_batch_size); v != 0) overrides.batch_size = v;
  if (float v = absl::GetFlag(FLAGS_learning_rate); v != 0.0f) overrides.learning_rate = v;
  if (int v = absl::GetFlag(FLAGS_staleness); v >= 0) overrides.staleness = v;
  if (std::string v = absl::GetFlag(FLAGS_wire_dtype); !v.empty()) overrides.wire_dtype = v;
  if (std::string v = absl::GetFlag(FLAGS_device); !v.empty()) overrides.device = v;
  if (std::string v = absl::GetFlag(FLAGS_devices); !v.empty()) overrides.devices = v;
  if (std::string v = absl::GetFlag(FLAGS_exchange_schedule); !v.empty()) overrides.exchange = v;
  if (std::string v = absl::GetFlag(FLAGS_shm); !v.empty()) overrides.shm = v;
  return overrides;
}

std::vector<std::string> OverrideFlagsAsArgs() {
  ConfigOverrides overrides = OverridesFromFlags();
  std::vector<std::string> args;
  if (overrides.mode) args.push_back(absl::StrCat("--mode=", *overrides.mode));
  if (overrides.epochs) args.push_back(absl::StrCat("--epochs=", *overrides.epochs));
  if (overrides.workers) args.push_back(absl::StrCat("--workers=", *overrides.workers));
  if (overrides.batch_size) args.push_back(absl::StrCat("--batch_size=", *overrides.batch_size));
  if (overrides.staleness) args.push_back(absl::StrCat("--staleness=", *overrides.staleness));
  if (overrides.wire_dtype) args.push_back(absl::StrCat("--wire_dtype=", *overrides.wire_dtype));
  if (overrides.device) args.push_back(absl::StrCat("--device=", *overrides.device));
  if (overrides.devices) args.push_back(absl::StrCat("--devices=", *overrides.devices));
  if (overrides.exchange) args.push_back(absl::StrCat("--exchange_schedule=", *overrides.exchange));
  if (overrides.shm) args.push_back(absl::StrCat("--shm=", *overrides.shm));
  if (overrides.learning_rate) {
    args.push_back(absl::StrCat("--learning_rate=", *overrides.learning_rate));
  }
  return args;
}

absl::StatusOr<JobConfig> LoadJobConfigFromFlags(PsPorts ps_ports) {
  return LoadJobConfig(absl::GetFlag(FLAGS_config), OverridesFromFlags(), ps_ports);
}

absl::Status CheckTaskFiles(const JobConfig& config, bool ps, bool workers) {
  if (ps) {
    if (const std::string& dir = config.training().checkpoint().dir(); !dir.empty()) {
      if (absl::Status s = CheckWritableDirectory(dir, "training.checkpoint.dir"); !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<ClusterSecurity> server =
        ClusterSecurity::FromConfig(config.cluster(), ClusterSecurity::Role::kServer);
    if (!server.ok()) return server.status();
  }
  if (workers) {
    absl::StatusOr<ClusterSecurity> client =
        ClusterSecurity::FromConfig(config.cluster(), ClusterSecurity::Role::kClient);
    if (!client.ok()) return client.status();
  }
  return absl::OkStatus();
}

void FinishConfigCheck(absl::string_view program, const JobConfig& config,
                       const absl::Status& check) {
  if (!check.ok()) ExitWithError(program, check);
  std::printf("config OK: %s\n", ConfigSummary(config).c_str());
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace pst
