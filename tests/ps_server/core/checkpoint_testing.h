// What the tests of checkpoint files and of the Checkpointer share: a small
// shard with momentum (state to round-trip), its model and a push, and a
// scratch folder.
#ifndef PST_TESTS_PS_SERVER_CORE_CHECKPOINT_TESTING_H_
#define PST_TESTS_PS_SERVER_CORE_CHECKPOINT_TESTING_H_

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/fresh_dir.h"

namespace pst::checkpoint_testing {

inline std::unique_ptr<ParameterShard> MomentumShard(int shard_index = 0, int snapshot_every_steps = 0) {
  ShardOptions options;
  options.snapshot_every_steps = snapshot_every_steps;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.shard = shard_index;
  options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
  options.optimizer.mutable_sgd()->set_momentum(0.9f);
  return std::move(*ParameterShard::Create(options));
}

inline void Init(ParameterShard* shard) {
  InitRequest init;
  std::vector<float> w = {1, 2, 3};
  EncodeTensor("w", std::vector<int64_t>{3}, w, init.add_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
}

inline void PushOnes(ParameterShard* shard) {
  PushRequest push;
  push.set_computed_at_version(shard->version());
  std::vector<float> g = {1, 1, 1};
  EncodeTensor("w", std::vector<int64_t>{3}, g, push.add_gradients());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, push, &response).ok());
}

inline std::string FreshDir(const std::string& name) { return FreshScratchDir(name); }

}  // namespace pst::checkpoint_testing

#endif  // PST_TESTS_PS_SERVER_CORE_CHECKPOINT_TESTING_H_
