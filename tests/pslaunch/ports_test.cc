// pslaunch's check of the ports its tasks will bind, before it starts any.
#include "pslaunch/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

// A socket listening on 127.0.0.1 on a port the system picks; closed with
// the object.
class Listener {
 public:
  Listener() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// A port free now: one the system picked and let go.
int FreePort() { return Listener().port(); }

JobConfig OneShardTwoWorkers(const std::string& ps) {
  JobConfig config;
  config.mutable_cluster()->add_ps(ps);
  config.mutable_cluster()->set_workers(2);
  return config;
}

TEST(CheckTaskPortsTest, FreePortsPass) {
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {}).ok());
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers(absl::StrCat("127.0.0.1:", FreePort())), {}).ok());
  EXPECT_TRUE(CheckTaskPorts(OneShardTwoWorkers("127.0.0.1:0"), {FreePort(), "127.0.0.1"}).ok());
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
  Listener taken;
  // Task order: ps:0, worker:0, worker:1; the taken port falls to the last.
  const int first = taken.port() - 2;
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
  const int port = FreePort();
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

}  // namespace
}  // namespace pst
