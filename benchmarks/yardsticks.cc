#include "benchmarks/yardsticks.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "benchmarks/byte_sizes.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace pst {

double MemcpyGbps(int64_t bytes) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::memcpy(to.data(), from.data(), bytes);
  int64_t copies = 0;
  const absl::Time start = absl::Now();
  absl::Duration elapsed;
  do {
    from[copies % bytes] = static_cast<char>(copies);  // the copy cannot be hoisted
    std::memcpy(to.data(), from.data(), bytes);
    ++copies;
    elapsed = absl::Now() - start;
  } while (elapsed < absl::Milliseconds(300));
  return copies * static_cast<double>(bytes) / absl::ToDoubleSeconds(elapsed) / 1e9;
}

absl::StatusOr<std::vector<PeerRow>> ReadPeerRows(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_json: cannot read ", path));
  }
  std::vector<PeerRow> rows;
  int line_number = 0;
  for (std::string line; std::getline(file, line);) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    google::protobuf::Struct object;
    const auto where = [&] { return absl::StrCat("--peer_json: ", path, ":", line_number, ": "); };
    if (!google::protobuf::util::JsonStringToMessage(line, &object).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "not a JSON object"));
    }
    const auto& fields = object.fields();
    auto number = [&](const char* name) -> std::optional<double> {
      auto it = fields.find(name);
      if (it == fields.end() || !it->second.has_number_value()) return std::nullopt;
      return it->second.number_value();
    };
    PeerRow row;
    if (std::optional<double> size = number("size_bytes")) {
      row.size_bytes = static_cast<int64_t>(*size);
    } else if (auto it = fields.find("size"); it != fields.end() && it->second.has_string_value()) {
      absl::StatusOr<int64_t> size = ParseByteSize(it->second.string_value());
      if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat(where(), size.status().message()));
      row.size_bytes = *size;
    }
    const std::optional<double> workers = number("workers"), gbps = number("push_pull_gbps");
    if (row.size_bytes <= 0 || !workers || !gbps) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "a row needs size_bytes (or size), workers and push_pull_gbps"));
    }
    row.workers = static_cast<int>(*workers);
    row.gbps = *gbps;
    row.cpu_us_per_round_trip = number("cpu_us_per_round_trip");
    row.p50_us = number("p50_us");
    rows.push_back(row);
  }
  return rows;
}

std::optional<PeerRow> FindPeer(const std::vector<PeerRow>& peers, int64_t size, int workers) {
  for (const PeerRow& peer : peers) {
    if (peer.size_bytes == size && peer.workers == workers) return peer;
  }
  return std::nullopt;
}

std::string Ratio(std::optional<double> ours, std::optional<double> theirs) {
  if (!ours || !theirs || *theirs <= 0) return "null";
  return absl::StrFormat("%.3f", *ours / *theirs);
}

std::optional<double> IperfGbps() {
  if (std::system("command -v iperf3 >/dev/null 2>&1") != 0) {
    return std::nullopt;
  }
  const std::string command =
      "iperf3 -s -1 -p 5299 >/dev/null 2>&1 & sleep 0.5; "
      "iperf3 -c 127.0.0.1 -p 5299 -l 1M -t 3 -f g 2>/dev/null | awk '/receiver/ {print $(NF-2)}'";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  char buffer[128] = {0};
  std::string out = fgets(buffer, sizeof(buffer), pipe) ? buffer : "";
  pclose(pipe);
  double gbits = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(out), &gbits)) return std::nullopt;
  return gbits / 8.0;  // GB/s
}

}  // namespace pst
