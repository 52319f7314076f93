// What the ParameterShard tests share (parameter_shard_test.cc,
// parameter_shard_liveness_test.cc, parameter_shard_streamed_test.cc): small
// models and requests, and the shard's calls as a test makes them.
#ifndef PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_TESTING_H_
#define PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"

namespace pst::shard_testing {

inline OptimizerConfig PlainSgd(float lr) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(lr);
  return config;
}

inline ShardOptions Options(Mode mode, int workers, float lr = 1.0f) {
  ShardOptions options;
  options.mode = mode;
  options.num_workers = workers;
  options.optimizer = PlainSgd(lr);
  return options;
}

inline std::unique_ptr<ParameterShard> MakeShard(const ShardOptions& options) {
  auto shard = ParameterShard::Create(options);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

inline std::unique_ptr<ParameterShard> MakeShard(Mode mode, int workers, float lr = 1.0f) {
  auto shard = ParameterShard::Create(Options(mode, workers, lr));
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

inline void AddTensor(const std::string& name, std::vector<int64_t> shape, std::vector<float> values,
               google::protobuf::RepeatedPtrField<Tensor>* out) {
  EncodeTensor(name, shape, values, out->Add());
}

// Two variables: "w" [2, 2] = {1, 2, 3, 4} and "b" [2] = {0, 0}.
inline void InitTwoVariables(ParameterShard* shard) {
  InitRequest init;
  AddTensor("w", {2, 2}, {1, 2, 3, 4}, init.mutable_variables());
  AddTensor("b", {2}, {0, 0}, init.mutable_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  ASSERT_TRUE(response.accepted());
}

// Registers `worker` with the shard, as a worker's client does first.
inline void RegisterWorker(ParameterShard* shard, int worker) {
  RegisterRequest request;
  request.set_worker(worker);
  RegisterResponse response;
  ASSERT_TRUE(shard->Register(request, &response).ok());
}

inline PushRequest Gradient(int worker, int64_t version, std::vector<float> w, std::vector<float> b) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  AddTensor("w", {2, 2}, std::move(w), push.mutable_gradients());
  AddTensor("b", {2}, std::move(b), push.mutable_gradients());
  return push;
}

inline std::vector<float> PullValues(ParameterShard* shard, const std::string& name,
                              int64_t* version = nullptr) {
  PullRequest pull;
  pull.add_names(name);
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response);
  EXPECT_TRUE(status.ok()) << status;
  if (version) *version = response.version();
  std::vector<float> values(response.variables(0).data().size() / sizeof(float));
  DecodeTensor(response.variables(0), values);
  return values;
}

inline StatsResponse StatsOf(ParameterShard* shard) {
  StatsResponse stats;
  shard->Stats(&stats);
  return stats;
}

}  // namespace pst::shard_testing

#endif  // PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_TESTING_H_
