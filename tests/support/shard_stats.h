// A running shard's version, read from its Stats (another process: Stats is
// where its version shows), for tests that act once training got somewhere.
#ifndef PST_TESTS_SUPPORT_SHARD_STATS_H_
#define PST_TESTS_SUPPORT_SHARD_STATS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace pst {

// Shard `address`'s version (plaintext channel), -1 while it does not answer.
int64_t VersionAt(const std::string& address);

// Polls shard `address` until its version reaches `version` or `timeout`
// passes; the version it reached.
int64_t AwaitVersion(const std::string& address, int64_t version, absl::Duration timeout);

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_SHARD_STATS_H_
