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

// Polls primary `address` until every backup of its shard is in the chain
// (ReplicationStats.Backup.in_chain: it may take over) or `timeout`
// passes; whether they all are. A test that kills a primary to see its
// backup take over waits for this first: a backup still catching up may
// not take the office.
bool AwaitBackupsInChain(const std::string& address, absl::Duration timeout);

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_SHARD_STATS_H_
