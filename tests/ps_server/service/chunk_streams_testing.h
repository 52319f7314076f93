// What the tests of chunk_streams share: small models, requests and checks.
#ifndef PST_TESTS_PS_SERVER_SERVICE_CHUNK_STREAMS_TESTING_H_
#define PST_TESTS_PS_SERVER_SERVICE_CHUNK_STREAMS_TESTING_H_

#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "placement/variable_spec.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/support/thread_count.h"
#include "worker/client/ps_client.h"

namespace pst::chunk_streams_testing {

// A shard (ASYNC unless told, SGD with learning rate 1: a push of g
// subtracts g) behind a real gRPC server on 127.0.0.1.
class ServedShard {
 public:
  explicit ServedShard(int workers = 1,
                       absl::Duration stalled_stream_timeout = absl::Seconds(5),
                       Mode mode = ASYNC) {
    ShardOptions options;
    options.mode = mode;
    options.stalled_stream_timeout = stalled_stream_timeout;
    options.num_workers = workers;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    auto running = StartGrpcServer("127.0.0.1:0", shard_.get(), AdminHooks{});
    EXPECT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    address_ = "127.0.0.1:" + std::to_string(server_.port);
  }
  ~ServedShard() {
    shard_->BeginShutdown();
    server_.grpc_server->Shutdown();
  }
  const std::string& address() const { return address_; }
  ParameterShard* shard() { return shard_.get(); }

 private:
  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::string address_;
};

// Values exact in float32, float16 and bfloat16 (at most 7 significant bits).
inline std::vector<float> Ramp(int64_t n, float start, float step) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = start + step * static_cast<float>(i % 64);
  return values;
}

// Models whose wire size sits at and around the chunk size, so that both the
// unary path (<= one chunk) and streams of 2 or many chunks are exercised.
struct BoundaryCase {
  const char* name;
  std::vector<VariableSpec> model;
  DType dtype;
};
inline std::vector<BoundaryCase> ChunkBoundaryCases() {
  const int64_t chunk_floats = kChunkBytes / 4;
  return {
      {"one chunk exactly (unary)", {{"w", {chunk_floats}}}, FLOAT32},
      {"chunk + 1 element", {{"w", {chunk_floats + 1}}}, FLOAT32},
      {"chunk - 1 element, then a bias", {{"w", {chunk_floats - 1}}, {"b", {2}}}, FLOAT32},
      {"many chunks, several variables",
       {{"k", {1000, 1001}}, {"b", {7}}, {"k2", {3, 333}}}, FLOAT32},
      {"bf16, odd count past two chunks", {{"w", {kChunkBytes + 3}}}, BFLOAT16},
      {"fp16, odd counts", {{"a", {kChunkBytes / 2 + 1}}, {"c", {5}}}, FLOAT16},
  };
}

// A model's initial values, a gradient and a buffer to pull into, with the
// spans PsClient takes. Values are exact in every wire dtype (Ramp).
class ModelBuffers {
 public:
  explicit ModelBuffers(const std::vector<VariableSpec>& model) : model_(model) {
    for (const VariableSpec& spec : model) {
      initial.push_back(Ramp(spec.size(), 1.0f, 0.5f));
      gradient.push_back(Ramp(spec.size(), -4.0f, 1.0f));
      pulled.emplace_back(spec.size(), 0.0f);
    }
    for (size_t v = 0; v < model.size(); ++v) {
      initial_spans.emplace_back(initial[v]);
      gradient_spans.emplace_back(gradient[v]);
      pulled_spans.emplace_back(pulled[v]);
    }
  }
  ModelBuffers(const ModelBuffers&) = delete;
  ModelBuffers& operator=(const ModelBuffers&) = delete;

  // Whether `pulled` holds the initial values after `steps` SGD steps of
  // learning rate 1 with the gradient; names the first element that does not.
  ::testing::AssertionResult PulledAfter(int steps) const {
    for (size_t v = 0; v < model_.size(); ++v) {
      for (size_t i = 0; i < pulled[v].size(); ++i) {
        const float expected = initial[v][i] - static_cast<float>(steps) * gradient[v][i];
        if (pulled[v][i] != expected) {
          return ::testing::AssertionFailure() << model_[v].name << "[" << i << "] is "
                                               << pulled[v][i] << ", expected " << expected
                                               << " after " << steps << " step(s)";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::vector<std::vector<float>> initial, gradient, pulled;
  std::vector<std::span<const float>> initial_spans, gradient_spans;
  std::vector<std::span<float>> pulled_spans;

 private:
  std::vector<VariableSpec> model_;
};

}  // namespace pst::chunk_streams_testing

#endif  // PST_TESTS_PS_SERVER_SERVICE_CHUNK_STREAMS_TESTING_H_
