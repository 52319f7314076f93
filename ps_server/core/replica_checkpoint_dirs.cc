#include "ps_server/core/replica_checkpoint_dirs.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pst {
namespace {

constexpr absl::string_view kReplicaPrefix = "replica-";
constexpr absl::string_view kShardPrefix = "shard-";

// The number n of a folder named <prefix><n>, n >= 0 written as StrCat
// writes it; -1 for any other name.
int NumberAfter(absl::string_view prefix, const std::string& name) {
  absl::string_view number = name;
  int n = -1;
  if (!absl::ConsumePrefix(&number, prefix) || !absl::SimpleAtoi(number, &n) || n < 0 ||
      absl::StrCat(prefix, n) != name) {
    return -1;
  }
  return n;
}

}  // namespace

std::string ReplicaCheckpointRoot(const std::string& root, int replica) {
  if (replica == 0) return root;
  return (std::filesystem::path(root) / absl::StrCat(kReplicaPrefix, replica)).string();
}

std::vector<std::string> BackupCheckpointRoots(const std::string& root) {
  std::vector<std::pair<int, std::string>> backups;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const int replica = NumberAfter(kReplicaPrefix, entry.path().filename().string());
    if (replica < 1 || !entry.is_directory(error)) continue;
    backups.emplace_back(replica, entry.path().string());
  }
  std::sort(backups.begin(), backups.end());
  std::vector<std::string> roots;
  for (auto& [replica, path] : backups) roots.push_back(std::move(path));
  return roots;
}

int ShardOfCheckpointFolder(const std::string& name) { return NumberAfter(kShardPrefix, name); }

std::vector<std::string> ReplicaCheckpointDirs(const std::string& root, int shard) {
  const std::string shard_folder = absl::StrCat(kShardPrefix, shard);
  std::vector<std::string> dirs = {(std::filesystem::path(root) / shard_folder).string()};
  std::error_code error;
  for (const std::string& backup : BackupCheckpointRoots(root)) {
    const std::filesystem::path folder = std::filesystem::path(backup) / shard_folder;
    if (std::filesystem::is_directory(folder, error)) dirs.push_back(folder.string());
  }
  return dirs;
}

bool HoldsMoreOfTheRun(const ShardCheckpoint& a, const ShardCheckpoint& b) {
  return a.version() != b.version() ? a.version() < b.version() : a.epoch() < b.epoch();
}

}  // namespace pst
