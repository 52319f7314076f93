#include "common/server_ports.h"

#include <algorithm>
#include <fstream>
#include <random>

namespace pst {

std::pair<int, int> EphemeralPortRange() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (file >> low >> high && 0 < low && low <= high && high <= 65535) return {low, high};
  return {32768, 60999};
}

std::vector<int> ServerPortCandidates() {
  const auto [low, high] = EphemeralPortRange();
  std::vector<int> ports;
  for (int port = kFirstServerPort; port <= 65535; ++port) {
    if (port < low || port > high) ports.push_back(port);
  }
  std::shuffle(ports.begin(), ports.end(), std::mt19937_64(std::random_device{}()));
  return ports;
}

}  // namespace pst
