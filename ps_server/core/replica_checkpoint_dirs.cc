#include "ps_server/core/replica_checkpoint_dirs.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pst {

std::string ReplicaCheckpointRoot(const std::string& root, int replica) {
  if (replica == 0) return root;
  return (std::filesystem::path(root) / absl::StrCat("replica-", replica)).string();
}

std::vector<std::string> BackupCheckpointRoots(const std::string& root) {
  std::vector<std::pair<int, std::string>> backups;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    absl::string_view number = name;
    int replica = 0;
    if (!absl::ConsumePrefix(&number, "replica-") || !absl::SimpleAtoi(number, &replica) ||
        replica < 1 || ReplicaCheckpointRoot(root, replica) != entry.path().string() ||
        !entry.is_directory(error)) {
      continue;
    }
    backups.emplace_back(replica, entry.path().string());
  }
  std::sort(backups.begin(), backups.end());
  std::vector<std::string> roots;
  for (auto& [replica, path] : backups) roots.push_back(std::move(path));
  return roots;
}

std::vector<std::string> ReplicaCheckpointDirs(const std::string& root, int shard) {
  const std::string shard_folder = absl::StrCat("shard-", shard);
  std::vector<std::string> dirs = {(std::filesystem::path(root) / shard_folder).string()};
  std::error_code error;
  for (const std::string& backup : BackupCheckpointRoots(root)) {
    const std::filesystem::path folder = std::filesystem::path(backup) / shard_folder;
    if (std::filesystem::is_directory(folder, error)) dirs.push_back(folder.string());
  }
  return dirs;
}

}  // namespace pst
