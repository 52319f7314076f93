// pslaunch's check of the ports its tasks will bind, before it starts any.
#include "pslaunch/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// A socket listening on 127.0.0.1 on `port`, or on one the system picks
// (0); closed with the object. bound() says whether it got the port.
class Listener {
 public:
  explicit Listener(int port = 0) : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t length = sizeof(address);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd_, 4) != 0) {
      EXPECT_NE(port, 0) << "the system found no free port";
      return;
    }
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(fd_); }
  bool bound() const { return port_ != 0; }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// The first of `count` consecutive ports free now (the tasks' metrics ports
// are consecutive): other tests bind ports at the same time, so a run is
// taken whole, then let go.
int FreePorts(int count) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    Listener first;
    if (first.port() + count - 1 > 65535) continue;
    std::vector<std::unique_ptr<Listener>> rest;
    for (int i = 1; i < count; ++i) {
      rest.push_back(std::make_unique<Listener>(first.port() + i));
      if (!rest.back()->bound()) break;
    }
    if (rest.empty() || rest.back()->bound()) return first.port();
  }
  ADD_FAILURE() << "no " << count << " consecutive free ports in 100 tries";
  return 0;
}

int FreePort() { return FreePorts(1); }

JobConfig OneShardTwoWorkers(const std::string& ps) {
  JobConfig config;
  config.mutable_cluster()->add_ps(ps);
  config.mutable_cluster()->set_workers(2);
  return config;
}

TEST(CheckTaskPortsTest, FreePortsPass) {
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {}).ok());
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers(absl::StrCat("127.0.0.1:", FreePort())), {}).ok());
  // One metrics port per task: ps:0, worker:0, worker:1.
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {FreePorts(3), "127.0.0.1"}).ok());
}

TEST(CheckTaskPortsTest, APsPortInUseIsNamed) {
  Listener taken;
  const std::string address = absl::StrCat("127.0.0.1:", taken.port());
  absl::Status status = CheckTaskPorts(OneShardTwoWorkers(address), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("cluster.ps[0] ", address,
                                                       ": the port is in use on this host")));
  // Every address the name resolves to is tried, as the PS listens on each.
  status = CheckTaskPorts(OneShardTwoWorkers(absl::StrCat("localhost:", taken.port())), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckTaskPortsTest, AMetricsPortInUseNamesItsTask) {
  // Task order: ps:0, worker:0, worker:1; the taken port falls to the last.
  const int first = FreePorts(3);
  Listener taken(first + 2);
  ASSERT_TRUE(taken.bound());
  absl::Status status = CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {first, "127.0.0.1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("--metrics_port=", first, " gives worker:1 port ",
                                     taken.port(), " on 127.0.0.1: the port is in use")));
}

TEST(CheckTaskPortsTest, MetricsPortsPastTheLastPortAreRefused) {
  absl::Status status =
      CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {65534, "127.0.0.1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("the 3 tasks the ports 65534..65536, past 65535; "
                                          "pick a port of at most 65533"));
}

TEST(CheckTaskPortsTest, AMetricsPortOnAPsPortIsRefused) {
  const int port = FreePorts(3) + 1;  // the metrics ports of ps:0, worker:0 (this one), worker:1
  absl::Status status = CheckTaskPorts(OneShardTwoWorkers(absl::StrCat("127.0.0.1:", port)),
                                       {port - 1, "127.0.0.1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(
                                    "gives worker:0 port ", port, ", which cluster.ps[0] listens on")));
}

TEST(CheckTaskPortsTest, AMetricsAddressMustBeAnIpAddress) {
  absl::Status status =
      CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {FreePort(), "localhost"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--metrics_address=localhost is not an IP address"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
