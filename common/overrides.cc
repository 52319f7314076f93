#include "common/overrides.h"

#include <type_traits>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/device_spec.h"

namespace pst {
namespace internal {

std::vector<Override>& Registry() {
  static auto* table = new std::vector<Override>();
  return *table;
}

// Adds flag `flag` to the table; `apply` is how it changes its target: a
// callable (const T&, JobConfig*) -> absl::Status for kConfig, (const T&,
// RpcLimits*) for kLimits, nullptr for kSetting.
template <typename T, typename Apply>
bool Register(const absl::Flag<T>& flag, Target target, Programs programs, Forwarding forwarding,
              Apply apply) {
  Override entry{&absl::GetFlagReflectionHandle(flag), target, programs, forwarding, {}, {}};
  if constexpr (std::is_invocable_r_v<absl::Status, Apply, const T&, JobConfig*>) {
    entry.to_config = [apply](absl::string_view text, JobConfig* config) -> absl::Status {
      T value;
      std::string error;
      if (!absl::ParseFlag(text, &value, &error)) {
        return absl::InvalidArgumentError(absl::StrCat("\"", text, "\": ", error));
      }
      return apply(value, config);
    };
  } else if constexpr (std::is_invocable_v<Apply, const T&, RpcLimits*>) {
    entry.to_limits = [apply, &flag](RpcLimits* limits) { apply(absl::GetFlag(flag), limits); };
  }
  Registry().push_back(std::move(entry));
  return true;
}

}  // namespace internal
}  // namespace pst

// One entry of the table: defines flag `name` of `type` with `default_value`
// and `help`, and registers it with its target, the programs that take it,
// when pslaunch passes it on, and how it applies (see Register). An entry is
// all an override needs.
#define PST_OVERRIDE(type, name, default_value, help, target, programs, forwarding, apply) \
  ABSL_FLAG(type, name, default_value, help);                                             \
  [[maybe_unused]] static const bool pst_override_##name =                                \
      ::pst::internal::Register(FLAGS_##name, ::pst::Target::target, programs,            \
                                ::pst::Forwarding::forwarding, apply)

// Config overrides: every program that loads the job's config takes them,
// and pslaunch passes them on as well as writing them into the config file
// its tasks read. An empty or sentinel default leaves the file's value.
#define PST_CONFIG_OVERRIDE(type, name, default_value, help, apply)                            \
  PST_OVERRIDE(type, name, default_value, help, kConfig,                                       \
               ::pst::kPsServer | ::pst::kWorker | ::pst::kPslaunch | ::pst::kPsctl |         \
                   ::pst::kBenchmark,                                                          \
               kEveryStart, apply)

// The PS's limits: ps_server takes them, and pslaunch passes them on.
#define PST_LIMIT(type, name, help, field)                                              \
  PST_OVERRIDE(type, name, ::pst::RpcLimits().field, help, kLimits, ::pst::kPsServer,   \
               kEveryStart, [](const type& value, ::pst::RpcLimits* limits) {          \
                 limits->field = value;                                                \
               })
#define PST_TIME_LIMIT(name, help, field)                                                    \
  PST_OVERRIDE(double, name, absl::ToDoubleSeconds(::pst::RpcLimits().field), help, kLimits, \
               ::pst::kPsServer, kEveryStart, [](const double& seconds, ::pst::RpcLimits* limits) { \
                 limits->field = absl::Seconds(seconds);                                     \
               })

namespace pst {
namespace {

// Sets an enum field of the config from its name as a flag spells it
// (lower case, without `prefix`).
template <typename Enum>
absl::Status ParseChoice(bool (*parse)(const std::string&, Enum*), absl::string_view prefix,
                         absl::string_view text, absl::string_view what,
                         absl::string_view choices, Enum* value) {
  if (parse(absl::StrCat(prefix, absl::AsciiStrToUpper(text)), value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " \"", text, "\"; use ", choices));
}

}  // namespace
}  // namespace pst

// ---- Overrides of the config ----

PST_CONFIG_OVERRIDE(std::string, mode, "", "Override training.mode: sync, async or ssp.",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      absl::StatusOr<pst::Mode> mode = pst::ParseMode(text);
                      if (!mode.ok()) return mode.status();
                      config->mutable_training()->set_mode(*mode);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(int, epochs, 0, "Override training.epochs (0 = keep the config's).",
                    [](const int& epochs, pst::JobConfig* config) {
                      config->mutable_training()->set_epochs(epochs);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(int, workers, 0, "Override cluster.workers (0 = keep the config's).",
                    [](const int& workers, pst::JobConfig* config) {
                      config->mutable_cluster()->set_workers(workers);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(int, batch_size, 0,
                    "Override training.batch_size, per worker (0 = keep the config's).",
                    [](const int& batch_size, pst::JobConfig* config) {
                      config->mutable_training()->set_batch_size(batch_size);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(float, learning_rate, 0.0f,
                    "Override the optimizer's learning rate (0 = keep the config's).",
                    [](const float& rate, pst::JobConfig* config) {
                      pst::SetLearningRate(rate, config->mutable_training()->mutable_optimizer());
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(int, staleness, -1,
                    "Override training.staleness, the SSP bound (-1 = keep the config's).",
                    [](const int& staleness, pst::JobConfig* config) {
                      config->mutable_training()->set_staleness(staleness);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, wire_dtype, "",
                    "Override training.wire_dtype: fp32, fp16 or bf16 for parameters and "
                    "gradients on the wire.",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      pst::WireDtype dtype{};
                      PST_RETURN_IF_ERROR(pst::ParseChoice(&pst::WireDtype_Parse, "", text,
                                                           "type", "fp32, fp16 or bf16", &dtype));
                      config->mutable_training()->set_wire_dtype(dtype);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, device, "",
                    "Override training.device, where workers compute: auto (a GPU when one is "
                    "visible, else the CPU), cpu, or gpu:N.",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      PST_RETURN_IF_ERROR(pst::ParseDeviceSpec(text).status());
                      config->mutable_training()->set_device(text);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, devices, "",
                    "Override training.devices: towers, the local devices one worker splits each "
                    "batch over, e.g. cpu:2 (two CPU towers, a thread each), gpu:0,gpu:1, or "
                    "gpu:all. The batch size must divide evenly among them.",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      PST_RETURN_IF_ERROR(pst::ParseDeviceList(text).status());
                      config->mutable_training()->set_devices(text);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, exchange_schedule, "",
                    "Override training.exchange: layerwise (push each layer's gradient as "
                    "backward produces it and start each layer of the next forward pass once its "
                    "parameters are in) or whole_model (one push after backward, the whole model "
                    "back before forward).",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      pst::ExchangeSchedule schedule{};
                      PST_RETURN_IF_ERROR(pst::ParseChoice(&pst::ExchangeSchedule_Parse, "", text,
                                                           "schedule", "layerwise or whole_model",
                                                           &schedule));
                      config->mutable_training()->set_exchange(schedule);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, shm, "",
                    "Override cluster.shm: auto (a worker and a PS shard on the same host move "
                    "tensors through shared memory, gRPC carries only control messages) or off "
                    "(every byte over TCP).",
                    [](const std::string& text, pst::JobConfig* config) -> absl::Status {
                      pst::SharedMemory shm{};
                      PST_RETURN_IF_ERROR(pst::ParseChoice(&pst::SharedMemory_Parse, "SHM_", text,
                                                           "setting", "auto or off", &shm));
                      config->mutable_cluster()->set_shm(shm);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(std::string, checkpoint_dir, "",
                    "Override training.checkpoint.dir: where each shard writes its checkpoints "
                    "(<dir>/shard-<i>/; at shutdown, and every --checkpoint_every_steps), which a "
                    "restarted PS restores and psctl export --checkpoint=<dir> reads. Empty = keep "
                    "the config's.",
                    [](const std::string& dir, pst::JobConfig* config) {
                      config->mutable_training()->mutable_checkpoint()->set_dir(dir);
                      return absl::OkStatus();
                    });
PST_CONFIG_OVERRIDE(int, checkpoint_every_steps, 0,
                    "Override training.checkpoint.every_steps: a checkpoint each time the version "
                    "has advanced this much (0 = keep the config's).",
                    [](const int& steps, pst::JobConfig* config) {
                      config->mutable_training()->mutable_checkpoint()->set_every_steps(steps);
                      return absl::OkStatus();
                    });

// ---- The PS's limits ----

PST_LIMIT(int, max_message_bytes,
          "Largest request (Init, Push, ...) a PS accepts, in bytes; a larger one is refused with "
          "RESOURCE_EXHAUSTED and changes nothing.",
          max_request_bytes);
PST_LIMIT(int, max_names_per_request,
          "Most variables one exchange's pull may name or its push carry; more, or a name given "
          "twice, is refused with INVALID_ARGUMENT.",
          max_names_per_request);
PST_LIMIT(int, max_rows_per_pull,
          "Most embedding rows one pull may name, over all its tables; more is refused with "
          "INVALID_ARGUMENT before any row is looked up (workers piece larger pulls).",
          max_rows_per_pull);
PST_LIMIT(int64_t, max_reply_bytes,
          "Largest answer the PS encodes for one pull in a 16-bit wire type, in bytes; a pull "
          "whose answer would be larger is refused with RESOURCE_EXHAUSTED before it is built "
          "(float32 answers are sent from the variables' own buffers, which this does not "
          "bound).",
          max_reply_bytes);
PST_TIME_LIMIT(max_pull_wait_seconds,
               "Longest a pull waits for its min_version, whatever timeout_ms it asks for; then "
               "it ends with DEADLINE_EXCEEDED. Keep it above training.pull_timeout_seconds.",
               max_pull_wait);
PST_LIMIT(int, max_streams,
          "Exchanges (pushes and pulls, long-polls included) open at once; one more is refused "
          "with RESOURCE_EXHAUSTED. Training opens one per worker at a time.",
          max_streams);
PST_LIMIT(int, max_streams_per_worker,
          "Exchanges open at once for one worker id; one more is refused with "
          "RESOURCE_EXHAUSTED.",
          max_streams_per_worker);
PST_TIME_LIMIT(stream_idle_timeout_seconds,
               "An exchange that waits this long on its client (for its next message, or for it "
               "to read the last one) is ended with DEADLINE_EXCEEDED and its buffers are freed; "
               "nothing of an unfinished push is applied.",
               stream_idle_timeout);
PST_LIMIT(int, max_connections,
          "TCP connections held open at once, checked as each is accepted (before TLS or a "
          "token); one more waits in the listener's backlog until one closes. 0: what the "
          "descriptor limit (raised to its hard limit) leaves beside a reserve for checkpoints "
          "and logs.",
          max_connections);
PST_LIMIT(int, max_connections_per_source,
          "TCP connections held open at once from one source (an IPv4 address, or an IPv6 /64; "
          "each loopback address is its own); one more is reset and counted.",
          max_connections_per_source);
PST_TIME_LIMIT(handshake_timeout_seconds,
               "A connection that has not finished its TLS handshake and sent its HTTP/2 "
               "settings within this is closed.",
               handshake_timeout);
PST_TIME_LIMIT(connection_idle_timeout_seconds,
               "A connection with no call open for this long is closed (a worker connects again "
               "at its next call), so that idle connections do not hold the connection caps.",
               connection_idle_timeout);
PST_LIMIT(int64_t, min_push_bytes_per_second,
          "A push still arriving while it holds push buffer budget must bring at least this many "
          "bytes per second over each --stream_idle_timeout_seconds, or its exchange is ended "
          "with DEADLINE_EXCEEDED and the budget given back (a client dripping a few bytes is "
          "never idle); 0: no minimum.",
          min_push_bytes_per_second);
PST_LIMIT(int64_t, max_push_buffer_bytes,
          "Bytes that pushes being received may hold in total before they are applied (every "
          "SYNC push holds its shard's share); a push that would pass it, while others hold "
          "some, is refused with RESOURCE_EXHAUSTED. 0: one share per worker, plus one.",
          max_push_buffer_bytes);
PST_LIMIT(int, max_server_threads,
          "Threads that serve the gRPC calls; no call holds one while it waits (a waiting pull "
          "or AwaitWorkersDone leaves a waiter in the shard), so they are all the threads calls "
          "get. 0: automatic (one).",
          max_server_threads);

// ---- Settings the programs read themselves ----

PST_OVERRIDE(std::string, checkpoint_start, "auto",
             "What a PS does with the checkpoints in training.checkpoint.dir at start. auto: "
             "restore this run's newest valid checkpoint, start fresh if the directory holds "
             "none, and refuse to start (exit 2) if it holds checkpoints of which none is this "
             "run's to restore (all damaged, another run's or job's, or a finished run's). "
             "restore: restore the newest valid checkpoint, whichever run wrote it (resume a "
             "run), unless it holds another model than the config names (other variables, "
             "tables or table settings: exit 2). restore_other_model: restore it whatever model "
             "it holds. fresh: start from the initial weights, moving the old checkpoints to "
             "<dir>/shard-<i>/previous/. pslaunch passes it on to each PS's first start only: a "
             "restarted PS always uses auto, and restores this run's own.",
             kSetting, pst::kPsServer, kFirstStart, nullptr);
PST_OVERRIDE(bool, allow_insecure, false,
             "Serve plaintext (no cluster.tls) on an address other machines can reach; only on a "
             "trusted network, such as a private container network.",
             kSetting, pst::kPsServer, kEveryStart, nullptr);
PST_OVERRIDE(int, connect_timeout_seconds, 0,
             "How long to wait for every PS shard to accept a connection (a worker) or to answer "
             "(psctl). 0: 60 s for a worker, 5 s for psctl.",
             kSetting, pst::kWorker | pst::kPsctl, kEveryStart, nullptr);
PST_OVERRIDE(std::string, logdir, "",
             "The chief (worker:0) writes TensorBoard event files here (train/loss, "
             "train/samples_per_sec, train/staleness, test/loss, test/accuracy); other workers "
             "ignore it. Empty = none.",
             kSetting, pst::kWorker, kEveryStart, nullptr);

namespace pst {

absl::string_view ProgramName(Program program) {
  switch (program) {
    case kPsServer: return "ps_server";
    case kWorker: return "worker";
    case kPslaunch: return "pslaunch";
    case kPsctl: return "psctl";
    case kBenchmark: return "the benchmarks";
    case kPsreport: return "psreport";
  }
  return "?";
}

bool Override::Takes(Program program) const {
  if ((programs & program) != 0) return true;
  return program == kPslaunch && (programs & (kPsServer | kWorker)) != 0;
}

bool Override::Given() const { return flag->CurrentValue() != flag->DefaultValue(); }

const std::vector<Override>& Overrides() { return internal::Registry(); }

const Override* FindOverride(absl::string_view name) {
  for (const Override& entry : Overrides()) {
    if (entry.name() == name) return &entry;
  }
  return nullptr;
}

ConfigOverrides OverridesFromFlags() {
  ConfigOverrides overrides;
  for (const Override& entry : Overrides()) {
    if (entry.target != Target::kConfig || !entry.Given()) continue;
    overrides.push_back({std::string(entry.name()), entry.flag->CurrentValue(), entry.to_config});
  }
  return overrides;
}

absl::StatusOr<ConfigOverride> ConfigOverrideOf(absl::string_view name, absl::string_view value) {
  const Override* entry = FindOverride(name);
  if (entry == nullptr || entry->target != Target::kConfig) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is no config override"));
  }
  return ConfigOverride{std::string(name), std::string(value), entry->to_config};
}

RpcLimits RpcLimitsFromFlags() {
  RpcLimits limits;
  for (const Override& entry : Overrides()) {
    if (entry.target == Target::kLimits) entry.to_limits(&limits);
  }
  return limits;
}

std::vector<std::string> ForwardedFlags(Program task, Forwarding when) {
  std::vector<std::string> flags;
  for (const Override& entry : Overrides()) {
    if (entry.Takes(task) && entry.forwarding == when && entry.Given()) {
      flags.push_back(absl::StrCat("--", entry.name(), "=", entry.flag->CurrentValue()));
    }
  }
  return flags;
}

}  // namespace pst
