#include "common/flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/exit.h"
#include "common/security.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "",
          "Cluster + job config (protobuf text format, or JSON). Empty: the built-in "
          "configs/local.textproto (Fashion-MNIST, 1 PS + 2 workers, SYNC).");
ABSL_FLAG(bool, check_config, false,
          "Only check the config (after ${VAR} expansion and the flag overrides), the task, and "
          "the files this host's tasks would use (TLS files, token, checkpoint directory); print "
          "a one-line summary and exit: 0 if valid, 2 with the error if not.");

namespace pst {
namespace {

// "ps_server and pslaunch": the programs that take `entry`.
std::string TakenBy(const Override& entry) {
  std::vector<std::string> names;
  for (Program program : {kPsServer, kWorker, kPslaunch, kPsctl, kBenchmark, kPsreport}) {
    if (entry.Takes(program)) names.emplace_back(ProgramName(program));
  }
  if (names.size() == 1) return names[0];
  return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "), " and ", names.back());
}

// "    --name (help); default: value;" wrapped at 80 columns, as Abseil's
// own --help writes it.
void AppendFlagHelp(const absl::CommandLineFlag& flag, std::string* text) {
  const std::string default_value = flag.IsOfType<std::string>()
                                        ? absl::StrCat("\"", flag.DefaultValue(), "\"")
                                        : flag.DefaultValue();
  const std::string line =
      absl::StrCat("--", flag.Name(), " (", flag.Help(), "); default: ", default_value, ";");
  constexpr size_t kWidth = 80;
  std::string indent = "    ";
  std::string current = indent;
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    if (current.size() > indent.size() && current.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(text, current, "\n");
      indent = "      ";
      current = indent;
    }
    if (current.size() > indent.size()) current += ' ';
    absl::StrAppend(&current, word);
  }
  absl::StrAppend(text, current, "\n");
}

}  // namespace

absl::Status CheckCommandLine(int argc, char** argv, Program program) {
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
    if (const Override* entry = FindOverride(name); entry != nullptr && !entry->Takes(program)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, ": ", std::filesystem::path(argv[0]).filename().string(),
          " does not take it (a flag of ",
          TakenBy(*entry), "); see --help"));
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

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage,
                                         Program program) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.version_string = [program = std::filesystem::path(argv[0]).filename().string()] {
    return absl::StrCat(program, " (pstrain) ", PST_VERSION, "\n");
  };
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" || arg == "-helpshort") {
      std::fputs(HelpText(std::filesystem::path(argv[0]).filename().string(), usage, program)
                     .c_str(),
                 stdout);
      std::fflush(stdout);
      std::exit(0);
    }
  }
  if (absl::Status s = CheckCommandLine(argc, argv, program); !s.ok()) {
    ExitWithError(std::filesystem::path(argv[0]).filename().string(), s);
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  spdlog::set_pattern(kLogPattern);
  return positional;
}

std::string HelpText(absl::string_view name, absl::string_view usage, Program program) {
  std::vector<const absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (FindOverride(name) == nullptr && !absl::StrContains(flag->Filename(), "absl/")) {
      own.push_back(flag);
    }
  }
  std::sort(own.begin(), own.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string text = absl::StrCat(name, ": ", usage, "\n\n  Flags:\n");
  for (const absl::CommandLineFlag* flag : own) AppendFlagHelp(*flag, &text);
  const bool launcher = program == kPslaunch;
  const std::pair<Target, absl::string_view> groups[] = {
      {Target::kConfig, launcher ? "Overrides of the config (they win over the file; passed on "
                                   "to every task)"
                                 : "Overrides of the config (they win over the file)"},
      {Target::kLimits, launcher ? "Limits of the PS (passed on to every ps_server)"
                                 : "Limits of the PS"},
      {Target::kSetting, launcher ? "Settings of the tasks (passed on to the tasks that take them)"
                                  : "Settings"},
  };
  for (const auto& [target, title] : groups) {
    std::string group;
    for (const Override& entry : Overrides()) {
      if (entry.target == target && entry.Takes(program)) AppendFlagHelp(*entry.flag, &group);
    }
    if (!group.empty()) absl::StrAppend(&text, "  ", title, ":\n", group);
  }
  absl::StrAppend(&text, "\n--helpfull lists every flag, Abseil's included.\n");
  return text;
}

absl::StatusOr<JobConfig> LoadJobConfigFromFlags(PsPorts ps_ports) {
  return LoadJobConfig(absl::GetFlag(FLAGS_config), OverridesFromFlags(), ps_ports);
}

namespace {

// The data set's files a worker opens at start (a CTR file the first worker
// generates is not looked for): InvalidArgument naming the field, the path
// and the way out.
absl::Status CheckDataFiles(const DatasetConfig& data) {
  std::vector<std::pair<std::string, std::string>> files;  // (field, path)
  std::string fix;
  if (data.has_fashion_mnist()) {
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      files.emplace_back("training.dataset.fashion_mnist.dir",
                         absl::StrCat(data.fashion_mnist().dir(), "/", name));
    }
    fix = "install Debian's dataset-fashion-mnist or set training.dataset.fashion_mnist.dir to "
          "the folder that holds its four .gz files";
  } else if (data.has_ctr() && !data.ctr().has_generate()) {
    files = {{"training.dataset.ctr.train_file", data.ctr().train_file()},
             {"training.dataset.ctr.test_file", data.ctr().test_file()}};
    fix = "name an existing file, or add training.dataset.ctr.generate to have the first worker "
          "write it";
  }
  for (const auto& [field, path] : files) {
    if (path.empty()) continue;
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, " does not exist; ", fix));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTaskFiles(const JobConfig& config, bool ps, bool workers) {
  if (ps) {
    if (const std::string& dir = config.training().checkpoint().dir(); !dir.empty()) {
      if (absl::Status s = CheckWritableDirectory(dir, "training.checkpoint.dir"); !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = CheckEmbeddingDisks(config); !s.ok()) return s;
    absl::StatusOr<ClusterSecurity> server =
        ClusterSecurity::FromConfig(config.cluster(), ClusterSecurity::Role::kServer);
    if (!server.ok()) return server.status();
  }
  if (workers) {
    absl::StatusOr<ClusterSecurity> client =
        ClusterSecurity::FromConfig(config.cluster(), ClusterSecurity::Role::kClient);
    if (!client.ok()) return client.status();
    // A worker command (a Python script) reads its own data.
    if (config.cluster().worker_command().empty()) {
      if (absl::Status s = CheckDataFiles(config.training().dataset()); !s.ok()) return s;
    }
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
