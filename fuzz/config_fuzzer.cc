// Config parsing under libFuzzer: any bytes given as a config file (text
// format, or JSON when they start with '{') are either refused with an error
// or, once defaulted and validated, describe a job every PS shard can be
// built for. Nothing may crash, and no sanitizer may report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/config.h"
#include "ps_server/core/parameter_shard.h"
#include "spdlog/spdlog.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pst::JobConfig> config = pst::ParseConfig(text, "fuzz.textproto");
  if (!config.ok()) return 0;
  pst::ApplyDefaults(&*config);
  // Defaults only fill what is unset: a second pass changes nothing.
  pst::JobConfig again = *config;
  pst::ApplyDefaults(&again);
  if (again.SerializeAsString() != config->SerializeAsString()) __builtin_trap();
  if (!pst::ValidateConfig(*config).ok()) return 0;

  // A config that validates starts every process of its cluster: ps:0 and
  // worker:0 exist, and each shard's options build a shard.
  if (!pst::ValidateTask(*config, {pst::TaskId::Kind::kPs, 0}).ok()) __builtin_trap();
  if (!pst::ValidateTask(*config, {pst::TaskId::Kind::kWorker, 0}).ok()) __builtin_trap();
  (void)pst::ModeName(config->training().mode());
  (void)pst::LearningRate(config->training().optimizer());
  // A shard keeps state per worker and ValidateConfig sets no upper bound on
  // cluster.workers: past a few thousand, Create would only test the
  // allocator. The first shards stand for the rest.
  if (config->cluster().workers() > 4096) return 0;
  const int shards = config->cluster().ps_size() < 4 ? config->cluster().ps_size() : 4;
  for (int shard = 0; shard < shards; ++shard) {
    if (!pst::ParameterShard::Create(pst::ShardOptionsFromConfig(*config, shard)).ok()) {
      __builtin_trap();
    }
  }
  return 0;
}
