// ApplyDelta: a delta over its parent gives the state at the delta's
// version, and a delta that does not fit its parent is refused.
#include "ps_server/core/checkpoint_delta.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}

// Table "t" (dim 2, one slot per value) holding `rows` (id -> first value;
// the second value, the slots and the update count follow from it).
ShardCheckpoint::Embedding Table(const std::vector<std::pair<uint64_t, float>>& rows,
                                 const std::vector<uint64_t>& removed = {}) {
  ShardCheckpoint::Embedding e;
  e.mutable_config()->set_name("t");
  e.mutable_config()->set_dim(2);
  for (const auto& [id, v] : rows) {
    const float values[2] = {v, -v};
    const float slots[2] = {v * 10, v * 100};
    const int64_t updates = static_cast<int64_t>(v);
    e.mutable_ids()->append(Bytes(&id, 8));
    e.mutable_values()->append(Bytes(values, 8));
    e.mutable_slots()->append(Bytes(slots, 8));
    e.mutable_row_updates()->append(Bytes(&updates, 8));
  }
  for (uint64_t id : removed) e.mutable_removed_ids()->append(Bytes(&id, 8));
  return e;
}

ShardCheckpoint Full(int64_t version, const ShardCheckpoint::Embedding& table) {
  ShardCheckpoint c;
  c.set_version(version);
  *c.add_embeddings() = table;
  return c;
}

ShardCheckpoint Delta(int64_t version, int64_t parent, const ShardCheckpoint::Embedding& table) {
  ShardCheckpoint c = Full(version, table);
  c.set_delta(true);
  c.set_parent_version(parent);
  c.set_base_version(parent);
  return c;
}

TEST(CheckpointDeltaTest, RemovesReplacesAndAddsRowsAndTakesTheDeltasOwnState) {
  ShardCheckpoint parent = Full(10, Table({{1, 1}, {2, 2}, {3, 3}}));
  parent.add_worker_clocks(4);
  ShardCheckpoint::Embedding changes = Table({{3, 30}, {4, 4}}, /*removed=*/{2, 9});
  changes.set_updates(12);
  changes.set_rows_evicted(1);
  ShardCheckpoint delta = Delta(12, 10, changes);
  delta.add_worker_clocks(6);
  delta.set_finished(true);

  absl::StatusOr<ShardCheckpoint> state = ApplyDelta(parent, delta);
  ASSERT_TRUE(state.ok()) << state.status();
  ShardCheckpoint::Embedding expected = Table({{1, 1}, {3, 30}, {4, 4}});
  expected.set_updates(12);
  expected.set_rows_evicted(1);
  ShardCheckpoint want = Full(12, expected);
  want.add_worker_clocks(6);
  want.set_finished(true);
  EXPECT_EQ(state->SerializeAsString(), want.SerializeAsString()) << state->DebugString();
}

TEST(CheckpointDeltaTest, ADeltaThatDoesNotFitItsParentIsRefused) {
  struct Case {
    const char* name;
    void (*edit)(ShardCheckpoint* parent, ShardCheckpoint* delta);
    const char* message;
  };
  const Case cases[] = {
      {"another parent version",
       [](ShardCheckpoint*, ShardCheckpoint* d) { d->set_parent_version(9); }, "is over version 9"},
      {"a delta as parent", [](ShardCheckpoint* p, ShardCheckpoint*) { p->set_delta(true); },
       "a delta at version"},
      {"another shard", [](ShardCheckpoint* p, ShardCheckpoint*) { p->set_shard(1); },
       "shard 0's, its parent shard 1's"},
      {"a table the parent lacks",
       [](ShardCheckpoint*, ShardCheckpoint* d) {
         d->mutable_embeddings(0)->mutable_config()->set_name("u");
       },
       "\"u\" is not in its parent"},
      {"another dim",
       [](ShardCheckpoint*, ShardCheckpoint* d) {
         d->mutable_embeddings(0)->mutable_config()->set_dim(3);
       },
       "has dim 3"},
      {"values cut short",
       [](ShardCheckpoint*, ShardCheckpoint* d) {
         d->mutable_embeddings(0)->mutable_values()->pop_back();
       },
       "different row counts"},
      {"slots of no whole rows",
       [](ShardCheckpoint*, ShardCheckpoint* d) {
         d->mutable_embeddings(0)->mutable_slots()->pop_back();
       },
       "no whole rows"},
      {"a parent's slots of another width",
       [](ShardCheckpoint* p, ShardCheckpoint*) {
         p->mutable_embeddings(0)->mutable_slots()->append(std::string(8 * 2, '\0'));
       },
       "different row counts"},
      {"removed ids of other than 8 bytes",
       [](ShardCheckpoint*, ShardCheckpoint* d) {
         d->mutable_embeddings(0)->mutable_removed_ids()->push_back('x');
       },
       "other than 8 bytes"},
      {"an id twice in the parent",
       [](ShardCheckpoint* p, ShardCheckpoint*) {
         *p->mutable_embeddings(0) = Table({{1, 1}, {1, 2}});
       },
       "id 1 twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ShardCheckpoint parent = Full(10, Table({{1, 1}, {2, 2}}));
    ShardCheckpoint delta = Delta(12, 10, Table({{2, 20}, {5, 5}}, {1}));
    c.edit(&parent, &delta);
    absl::StatusOr<ShardCheckpoint> state = ApplyDelta(parent, delta);
    EXPECT_EQ(state.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(state.status().message(), HasSubstr(c.message));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
