// PsClient's same-host path from the worker's side, against in-process
// shards: tensors that AllocateTensors places in a shard's region move with
// no copy on this side and stay where they are when the shard loses the
// region. The shard's side (validation, hostile regions) is
// tests/ps_server/service/shm_exchange_test.cc; whole jobs are tests/e2e.
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::Each;
using ::testing::HasSubstr;

// Two small variables, each whole on one shard, and one cut over both.
const std::vector<VariableSpec> kModel = {
    {"dense_0/kernel", {64, 32}}, {"dense_0/bias", {32}}, {"big", {512, 64}}};
constexpr int kCut = 2;  // the variable that lies on both shards

JobConfig AsyncSgd() {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(1);
  // The test's client brings its own variables (kModel), not the MLP below.
  config.mutable_cluster()->set_worker_command("ps_client_shm_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(ASYNC);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.5f);
  t->mutable_model()->mutable_mlp()->add_hidden(8);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

// A line of /proc/self/maps.
struct Mapping {
  uintptr_t begin = 0, end = 0;
  uint64_t offset = 0;  // into the object
  std::string path;     // "" if it names no file, else the file and its inode
  bool Holds(const void* address) const {
    const auto at = reinterpret_cast<uintptr_t>(address);
    return begin <= at && at < end;
  }
};

std::vector<Mapping> Mappings() {
  std::vector<Mapping> mappings;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode;
    Mapping mapping;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, mapping.path);
    // Every memfd has the same path: the inode tells them apart.
    if (!mapping.path.empty()) absl::StrAppend(&mapping.path, "#", inode);
    const size_t dash = range.find('-');
    mapping.begin = std::stoull(range.substr(0, dash), nullptr, 16);
    mapping.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    mapping.offset = std::stoull(offset, nullptr, 16);
    mappings.push_back(std::move(mapping));
  }
  return mappings;
}

// The path of the mapping `address` lies in ("" if none names a file).
std::string MappingOf(const void* address) {
  for (const Mapping& mapping : Mappings()) {
    if (mapping.Holds(address)) return mapping.path;
  }
  return "";
}

// The first float of another mapping of the object at `path` (the shard's,
// in this process) than the one holding `ours`; nullopt if there is none.
std::optional<float> FirstFloatOfOtherMapping(const std::string& path, const void* ours) {
  for (const Mapping& mapping : Mappings()) {
    if (mapping.path == path && mapping.offset == 0 && !mapping.Holds(ours)) {
      return *reinterpret_cast<const float*>(mapping.begin);
    }
  }
  return std::nullopt;
}

// In a sealed region (a memfd) or a named one.
bool InSharedRegion(std::span<const float> tensor) {
  const std::string path = MappingOf(tensor.data());
  return absl::StrContains(path, "/memfd:pstrain-region") ||
         absl::StrContains(path, "/dev/shm/pstrain-");
}

bool InSealedRegion(std::span<const float> tensor) {
  return absl::StrContains(MappingOf(tensor.data()), "/memfd:pstrain-region");
}

class PsClientShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
        InProcessCluster::Start(AsyncSgd(), 2);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  std::unique_ptr<PsClient> Connect(PsClient::Transport transport) {
    const auto& ps = cluster_->config().cluster().ps();
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
        std::vector<std::string>(ps.begin(), ps.end()), 0, absl::Seconds(10));
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    (*client)->SetVariables(kModel);
    (*client)->set_transport(transport);
    EXPECT_TRUE((*client)->Register().ok());
    return std::move(*client);
  }

  // Initializes every variable to ones (unless already initialized).
  static void InitOnes(PsClient* client) {
    std::vector<std::vector<float>> ones;
    for (const VariableSpec& v : kModel) ones.emplace_back(v.size(), 1.0f);
    ASSERT_TRUE(client->Init({ones.begin(), ones.end()}).ok());
  }

  // Pushes `gradient` everywhere and takes the new values into `tensors`.
  static absl::Status PushPull(PsClient* client, const PsClient::Tensors& tensors,
                               float gradient, std::vector<int64_t>* versions) {
    for (std::span<float> g : tensors.gradients) std::fill(g.begin(), g.end(), gradient);
    std::vector<PushResponse> responses;
    const std::vector<int64_t> at = *versions;
    return client->Exchange({.computed_at = at,
                             .gradients = {tensors.gradients.begin(), tensors.gradients.end()},
                             .min_versions = at,
                             .timeout = absl::Seconds(10),
                             .values = tensors.values},
                            versions, &responses);
  }

  // A shared-memory client whose tensors AllocateTensors placed, after one
  // exchange (every value 0.5).
  void StartPlaced() {
    placed_client_ = Connect(PsClient::Transport::kShm);
    ASSERT_NE(placed_client_, nullptr);
    absl::StatusOr<PsClient::Tensors> tensors = placed_client_->AllocateTensors();
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    placed_tensors_ = std::move(*tensors);
    InitOnes(placed_client_.get());
    placed_versions_ = {0, 0};
    ASSERT_TRUE(PushPull(placed_client_.get(), *placed_tensors_, 1.0f, &placed_versions_).ok());
  }

  std::unique_ptr<InProcessCluster> cluster_;
  std::unique_ptr<PsClient> placed_client_;
  std::optional<PsClient::Tensors> placed_tensors_;
  std::vector<int64_t> placed_versions_;
};

TEST_F(PsClientShmTest, TensorsLieInTheRegionsAndExchangeWhereTheyLie) {
  std::unique_ptr<PsClient> client = Connect(PsClient::Transport::kShm);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PsClient::Tensors> tensors = client->AllocateTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->values.size(), kModel.size());
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_EQ(static_cast<int64_t>(tensors->values[v].size()), kModel[v].size());
    EXPECT_EQ(static_cast<int64_t>(tensors->gradients[v].size()), kModel[v].size());
    // A variable cut over two regions cannot be one span in either.
    EXPECT_EQ(InSharedRegion(tensors->values[v]), v != kCut) << kModel[v].name;
    EXPECT_EQ(InSharedRegion(tensors->gradients[v]), v != kCut) << kModel[v].name;
  }
  EXPECT_TRUE(client->uses_shared_memory(0));
  EXPECT_TRUE(client->uses_shared_memory(1));
  // The shards are in this network namespace: the regions are sealed memfds.
  EXPECT_TRUE(InSealedRegion(tensors->values[0]));
  InitOnes(client.get());

  std::vector<int64_t> versions = {0, 0};
  ASSERT_TRUE(PushPull(client.get(), *tensors, 1.0f, &versions).ok());  // 1 - 0.5 * 1
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_THAT(tensors->values[v], Each(0.5f)) << kModel[v].name;
  }
  // A pull alone leaves the values in the same places.
  for (std::span<float> values : tensors->values) std::fill(values.begin(), values.end(), 7.0f);
  ASSERT_TRUE(
      client
          ->Exchange(
              {.min_versions = {0, 0}, .timeout = absl::Seconds(10), .values = tensors->values},
              &versions, nullptr)
          .ok());
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_THAT(tensors->values[v], Each(0.5f)) << kModel[v].name;
  }
}

TEST_F(PsClientShmTest, ARegionTheShardLostIsRenewedWhereTheTensorsLie) {
  ASSERT_NO_FATAL_FAILURE(StartPlaced());
  PsClient* client = placed_client_.get();
  std::optional<PsClient::Tensors>& tensors = placed_tensors_;
  std::vector<int64_t>& versions = placed_versions_;
  const std::string before = MappingOf(tensors->values[0].data());

  // Another client of the same worker attaches its own region: the shards
  // forget this one's, as a restarted shard would.
  std::unique_ptr<PsClient> other = Connect(PsClient::Transport::kShm);
  ASSERT_NE(other, nullptr);
  std::vector<std::vector<float>> scratch;
  for (const VariableSpec& v : kModel) scratch.emplace_back(v.size(), 0.0f);
  std::vector<int64_t> other_versions;
  ASSERT_TRUE(other
                  ->Exchange({.min_versions = {0, 0},
                              .timeout = absl::Seconds(10),
                              .values = {scratch.begin(), scratch.end()}},
                             &other_versions, nullptr)
                  .ok());

  ASSERT_TRUE(PushPull(client, *tensors, 1.0f, &versions).ok());  // 0.5 - 0.5 * 1
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_THAT(tensors->values[v], Each(0.0f)) << kModel[v].name;
  }
  EXPECT_TRUE(InSharedRegion(tensors->values[0]));
  EXPECT_NE(MappingOf(tensors->values[0].data()), before);  // a new object, the same address
}

TEST_F(PsClientShmTest, AFailedExchangeMovesTheRegionAwayFromWhatTheShardReads) {
  ASSERT_NO_FATAL_FAILURE(StartPlaced());
  PsClient* client = placed_client_.get();
  std::optional<PsClient::Tensors>& tensors = placed_tensors_;
  std::vector<int64_t>& versions = placed_versions_;
  const float* gradient = tensors->gradients[0].data();
  const std::string pushed_through = MappingOf(gradient);

  // The shards refuse a NaN gradient: the call fails.
  const absl::Status failed =
      PushPull(client, *tensors, std::numeric_limits<float>::quiet_NaN(), &versions);
  ASSERT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
  // The tensors keep their address and contents, in memory of their own
  // with no name in /dev/shm.
  EXPECT_EQ(MappingOf(gradient), "");
  EXPECT_TRUE(std::isnan(tensors->gradients[0][0]));
  // The next backward writes its gradient where it lies; the object the
  // shard mapped for the failed call still holds that call's push.
  for (std::span<float> g : tensors->gradients) std::fill(g.begin(), g.end(), 2.0f);
  std::optional<float> shards_view = FirstFloatOfOtherMapping(pushed_through, gradient);
  ASSERT_TRUE(shards_view.has_value()) << "the shard no longer maps " << pushed_through;
  EXPECT_TRUE(std::isnan(*shards_view)) << *shards_view;

  // The next exchange offers the new object and goes through it.
  ASSERT_TRUE(PushPull(client, *tensors, 1.0f, &versions).ok());  // 0.5 - 0.5 * 1
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_THAT(tensors->values[v], Each(0.0f)) << kModel[v].name;
  }
  EXPECT_TRUE(client->uses_shared_memory(0));
  EXPECT_TRUE(InSharedRegion(tensors->gradients[0]));
}

TEST_F(PsClientShmTest, AWireTypeChangedAfterPlacingIsRefused) {
  std::unique_ptr<PsClient> client = Connect(PsClient::Transport::kShm);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PsClient::Tensors> tensors = client->AllocateTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  InitOnes(client.get());
  client->set_wire_dtype(BFLOAT16);
  std::vector<int64_t> versions = {0, 0};
  absl::Status status = PushPull(client.get(), *tensors, 1.0f, &versions);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("after AllocateTensors"));
}

TEST_F(PsClientShmTest, OverTcpTheTensorsAreTheClientsOwn) {
  std::unique_ptr<PsClient> client = Connect(PsClient::Transport::kTcp);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PsClient::Tensors> tensors = client->AllocateTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (size_t v = 0; v < kModel.size(); ++v) EXPECT_FALSE(InSharedRegion(tensors->values[v]));
  EXPECT_FALSE(client->uses_shared_memory(0));
  InitOnes(client.get());
  std::vector<int64_t> versions = {0, 0};
  ASSERT_TRUE(PushPull(client.get(), *tensors, 1.0f, &versions).ok());
  for (size_t v = 0; v < kModel.size(); ++v) {
    EXPECT_THAT(tensors->values[v], Each(0.5f)) << kModel[v].name;
  }
}

// A worker that cannot reach the shard's region socket (abstract sockets
// belong to a network namespace; compose's workers share the PS's IPC
// namespace, not its network) offers a named region instead, and its
// tensors move through that.
TEST_F(PsClientShmTest, AWorkerWithoutTheShardsSocketOffersANamedRegion) {
  if (geteuid() != 0) GTEST_SKIP() << "entering a network namespace of its own needs root";
  std::unique_ptr<PsClient> client = Connect(PsClient::Transport::kShm);
  ASSERT_NE(client, nullptr);
  // Registered: its channels are connected, in this namespace.
  absl::StatusOr<PsClient::Tensors> tensors = absl::UnknownError("not run");
  // A namespace is a thread's own: the client's Unix socket, made on the
  // calling thread, is in the new one; its gRPC connections are not.
  std::thread([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      tensors = absl::InternalError(absl::StrCat("unshare: ", std::strerror(errno)));
      return;
    }
    tensors = client->AllocateTensors();
  }).join();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_TRUE(client->uses_shared_memory(0));
  EXPECT_TRUE(InSharedRegion(tensors->values[0]));
  EXPECT_FALSE(InSealedRegion(tensors->values[0]));
  InitOnes(client.get());
  std::vector<int64_t> versions = {0, 0};
  ASSERT_TRUE(PushPull(client.get(), *tensors, 1.0f, &versions).ok());  // 1 - 0.5 * 1
  EXPECT_THAT(tensors->values[0], Each(0.5f));
}

// A shard restarted without shared memory refuses the worker's region: the
// worker goes on over TCP, and its tensors leave the region (same
// addresses, memory of its own), so it never computes in memory another
// process may map.
TEST(PsClientShmFallbackTest, ARefusedReattachMovesTheTensorsOutOfTheRegion) {
  ShardOptions options;
  options.mode = ASYNC;
  options.optimizer.mutable_sgd()->set_learning_rate(0.5f);
  absl::StatusOr<std::unique_ptr<ParameterShard>> first = ParameterShard::Create(options);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<RunningServer> sharing = StartGrpcServer(
      "127.0.0.1:0", first->get(), AdminHooks{}, ClusterSecurity::Plaintext(), RpcLimits{},
      /*shared_memory=*/true);
  ASSERT_TRUE(sharing.ok()) << sharing.status();
  const std::string address = absl::StrCat("127.0.0.1:", sharing->port);
  absl::StatusOr<std::unique_ptr<PsClient>> connected =
      PsClient::Connect({address}, 0, absl::Seconds(10));
  ASSERT_TRUE(connected.ok()) << connected.status();
  PsClient* client = connected->get();
  const std::vector<VariableSpec> model = {{"w", {64, 32}}};
  client->SetVariables(model);
  client->set_transport(PsClient::Transport::kAuto);  // the worker's default: TCP where refused
  ASSERT_TRUE(client->Register().ok());
  absl::StatusOr<PsClient::Tensors> tensors = client->AllocateTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_TRUE(InSharedRegion(tensors->gradients[0]));
  ASSERT_TRUE(client->Init({std::vector<float>(64 * 32, 1.0f)}).ok());
  const auto push_pull = [&](float gradient, std::vector<int64_t>* versions) {
    std::fill(tensors->gradients[0].begin(), tensors->gradients[0].end(), gradient);
    std::vector<PushResponse> responses;
    const std::vector<int64_t> at = *versions;
    return client->Exchange({.computed_at = at,
                             .gradients = {tensors->gradients.begin(), tensors->gradients.end()},
                             .min_versions = at,
                             .timeout = absl::Seconds(10),
                             .values = tensors->values},
                            versions, &responses);
  };
  std::vector<int64_t> versions = {0};
  ASSERT_TRUE(push_pull(1.0f, &versions).ok());  // 1 - 0.5 * 1
  const float* gradient = tensors->gradients[0].data();
  const float* values = tensors->values[0].data();

  ShardCheckpoint state = (*first)->Snapshot();
  (*first)->BeginShutdown();
  sharing->Shutdown();
  absl::StatusOr<std::unique_ptr<ParameterShard>> second = ParameterShard::Create(options);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->Restore(state).ok());
  absl::StatusOr<RunningServer> tcp_only = StartGrpcServer(
      address, second->get(), AdminHooks{}, ClusterSecurity::Plaintext(), RpcLimits{},
      /*shared_memory=*/false);
  ASSERT_TRUE(tcp_only.ok()) << tcp_only.status();

  // The first exchange names a region the new shard never had; the next
  // offers the region again, is refused, and goes over TCP.
  absl::Status status;
  for (int attempt = 0; attempt < 5; ++attempt) {
    status = push_pull(1.0f, &versions);
    if (status.ok()) break;
  }
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_FALSE(client->uses_shared_memory(0));
  EXPECT_EQ(tensors->gradients[0].data(), gradient);
  EXPECT_EQ(tensors->values[0].data(), values);
  EXPECT_EQ(MappingOf(gradient), "") << "the gradient is still in a shared object";
  EXPECT_EQ(MappingOf(values), "") << "the values are still in a shared object";
  EXPECT_THAT(tensors->values[0], Each(0.0f));  // 0.5 - 0.5 * 1, over TCP
  (*second)->BeginShutdown();
  tcp_only->Shutdown();
}

}  // namespace PST_FILE_ID
}  // namespace pst
