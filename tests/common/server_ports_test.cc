#include "common/server_ports.h"

#include <set>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(ServerPortsTest, TheCandidatesAreEveryServerPortOutsideTheEphemeralRangeOnce) {
  const auto [low, high] = EphemeralPortRange();
  ASSERT_LE(low, high);
  const std::vector<int> candidates = ServerPortCandidates();
  const std::set<int> distinct(candidates.begin(), candidates.end());
  EXPECT_EQ(distinct.size(), candidates.size());
  int expected = 0;
  for (int port = kFirstServerPort; port <= 65535; ++port) expected += port < low || port > high;
  EXPECT_EQ(static_cast<int>(candidates.size()), expected);
  for (int port : candidates) {
    EXPECT_GE(port, kFirstServerPort);
    EXPECT_LE(port, 65535);
    EXPECT_TRUE(port < low || port > high) << port;
  }
}

TEST(ServerPortsTest, TwoPicksRarelyTryTheSamePortFirst) {
  int same = 0;
  for (int i = 0; i < 20; ++i) {
    const std::vector<int> a = ServerPortCandidates(), b = ServerPortCandidates();
    ASSERT_FALSE(a.empty());
    same += a.front() == b.front();
  }
  EXPECT_LE(same, 2);
}

}  // namespace PST_FILE_ID
}  // namespace pst
