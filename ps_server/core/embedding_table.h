// Every embedding table of one shard as a Table (ps_server/core/table.h): rows
// of `dim` floats addressed by 64-bit ids, each with its own optimizer
// state, trained row by row.
//
// Rows. A table declares no row count. A row exists once an update has
// trained it; until then its value is its initial value, a pure function
// of (seed, table, id, element) (ps_server/core/embedding_init.h), which a pull
// of an unseen id answers without storing anything. So memory grows with
// the rows trained, and a stream of one-off pulls costs none. A row lives
// on the shard its id hashes to (placement/row_placement.h); this shard
// refuses a push or pull of another shard's id.
//
// Bounds. Each table holds at most its row limit in RAM here:
// max_rows_per_shard, or fewer under storage.memory_bytes (a budget over
// the bytes of one row: Embedding::RowLimit). Past it, without a disk tier
// (when_full, proto/config.proto), a new row evicts the least recently
// updated row (sampled LRU, or LFU by the rows' update counts with
// storage.hot_set; counted in rows_evicted; at most
// EvictionsPerUpdate per update, never a row the update trains), or is
// refused (its gradient dropped and counted in rows_refused; the rest of
// the push applies). rows_admitted counts the rows created. All three are
// in Stats and checkpoints; recency is not checkpointed (restored rows
// count as updated at the checkpoint).
//
// Tiers. With storage.disk, RAM is a cache of the table (disk_rows.h
// holds the rest): an update first makes its rows resident (Admit, in
// embedding_tiers.cc), reading a row it trains from disk and promoting it
// whole (values, optimizer state, update count), and demoting as many
// least recently used rows (sampled as the eviction's) as the row limit
// asks, all in one atomic disk write; only then does it stage, so a
// failed write fails the update with nothing lost. Under LFU a new row
// takes no row's place: once RAM is full, Commit writes it to disk
// (StoreNewRows). RAM holds at most the
// row limit, or one update's own rows when they alone are more; no row is
// ever refused or dropped. A pull reads RAM, then the disk. Demotion and
// promotion copy every bit, so a tiered table trains bitwise as the same
// table all in RAM. A promotion that a Discard undoes stays in RAM (the
// table's contents are the same either way). storage.ttl_steps expires
// rows untouched for that many of the table's updates, from both tiers.
// Cold rows are read ahead: a pull's ids are the ids the worker's next
// push trains, so Prefetch (called when an exchange arrives, before it
// waits for its step) reads the cold ones on the table's reader thread,
// and the pull's answer and the promotion then find them read
// (prefetch_hits) or wait for them (disk_waits). Most ids RAM misses are
// new; the disk tier's id filter answers those without a read, ahead or
// in the call (disk_reads_filtered).
//
// Optimizers. Each table has its own rule (its spec's, else the job's),
// applied per row by the dense rules of ps_server/optimizers/optimizer.h on the row's
// values and state, created with the row (Adagrad's accumulator at
// initial_accumulator, everything else at 0). The rules are lazy: only the
// rows an update touches change; a row's momentum and Adam moments do not
// decay while it is not pushed, and Adam's bias correction counts the
// row's own updates. Learning-rate decay counts the table's updates (those
// that carried rows of it).
//
// Updates. ASYNC: CheckPush, then Stage, then Commit or Discard. Stage
// updates the rows RAM holds in place, keeping their records as they
// were, and stages new rows aside; Commit adds the new rows, and Discard
// puts the old records back, leaving the table as it was, counters
// included. Nothing else may come between (Table's contract). In place,
// an update reads and writes each row's cache lines once: staged apart,
// Commit's copy missed every line again. SYNC: each rank's push Lands;
// StageStep stages, per id, 0 + g_0 + g_1 + ... (ranks in order, those
// without the id adding nothing) times 1/N for the N ranks that landed,
// bitwise the same whatever the arrival order (ps_server/core/row_step.h). A
// SYNC push need not carry rows of every table (require_all is for the
// dense table). Each row is staged at most once per update.
//
// Checkpoints. Export writes every table's spec, seed, rows (RAM's, then
// the disk tier's in id order), state and counters (Capture: from a
// copy-on-write view of RAM and a RocksDB snapshot of the disk, taken
// under the shard's lock and read after it); a restored tiered table
// takes the first row-limit rows into RAM and the rest to disk. A delta
// (a checkpoint chain's capture, shard_snapshot.h) writes only the rows
// committed and the ids removed since the chain's previous capture, which
// each table notes from the chain's first capture on (never a row that
// only moved between the tiers: its contents are the same).
// Restore takes them back whole or not at all. A checkpoint restores only
// onto the shard count that wrote it: rows are placed by hash modulo the
// shard count, so with another count most rows would belong to other
// shards, which never see this shard's file. Restore refuses it
// (InvalidArgument naming both counts), as it refuses a row whose id
// hashes to another shard; moving rows between shard counts is an
// offline re-partition of every shard's file, not a restore.
//
// Thread-safety: as Table's. Pull reads (CheckPull, Lookup, AnswerPull,
// EncodeRows) read committed rows and need the same exclusion as Commit:
// the caller holds the shard's lock. The disk tier's writes run there
// too, and so do its reads, except those Prefetch starts, which run on the
// table's reader thread (DiskRows::Get is thread-safe).
#ifndef PST_PS_SERVER_CORE_EMBEDDING_TABLE_H_
#define PST_PS_SERVER_CORE_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config.pb.h"
#include "ps.pb.h"
#include "ps_server/optimizers/optimizer.h"
#include "ps_server/core/disk_rows.h"
#include "ps_server/core/row_step.h"
#include "ps_server/core/row_store.h"
#include "ps_server/core/table.h"

namespace pst {

struct EmbeddingTableOptions {
  // This shard among num_shards (>= 1): the rows it holds.
  int shard = 0;
  int num_shards = 1;
  // The SYNC step's ranks.
  int num_workers = 1;
  // training.seed: the initial rows' seed.
  uint64_t seed = 0;
  // training.optimizer: the rule of a table whose spec names none.
  OptimizerConfig optimizer;
  // For tests: handed to every disk tier (DiskRowsOptions::fail_writes).
  std::shared_ptr<std::atomic<bool>> disk_fail_writes;
  // 65 536 rows: several steps of a CTR job's pulls; at dim 16 with
  // Adagrad, about 13 MiB.
  static constexpr int64_t kDefaultPrefetchRows = int64_t{1} << 16;
  // Rows a tiered table reads ahead at most (row_prefetch.h); 0: none, so
  // every cold row is read by the call that needs it.
  int64_t prefetch_rows = kDefaultPrefetchRows;
  // This process's place in the shard's replica chain (0: the first): a
  // disk tier's directory is <disk>/<table>-shard<i>, with -replica<k>
  // after it for k > 0, so replicas of a shard on one host never share one.
  int replica = 0;
  // Whether the tables note what each update changes for ExportChanges
  // (the shard forwards its updates to backups).
  bool forward_changes = false;
};

class EmbeddingTable final : public Table {
 public:
  explicit EmbeddingTable(EmbeddingTableOptions options);
  ~EmbeddingTable() override;

  bool initialized() const override { return initialized_; }
  // float32 bytes of the rows held (values only).
  int64_t parameter_bytes() const override;
  // Creates the tables `request.embeddings()` declares (none is fine: a
  // model without embeddings). InvalidArgument, and no change, for a spec
  // ResolveEmbeddingTables (common/embedding_config.h) refuses. With a
  // disk tier among them, the tables of an earlier Initialize are dropped
  // first (their directories are the new tiers'); INTERNAL when a tier
  // cannot be opened.
  absl::Status Initialize(const InitRequest& request) override;
  // Checks `push.rows()`: each names a known table, once; ids are 8 bytes
  // each, unique within the part and all of this shard; data holds
  // ids x dim elements of a known dtype; with `check_finite`, every value
  // is finite. InvalidArgument naming the table (and the id) otherwise.
  // plan->indices gets each part's table. `require_all` is ignored.
  absl::Status CheckPush(const PushRequest& push, bool require_all, bool check_finite,
                         TablePush* plan) const override;
  absl::Status Stage(const PushRequest& push, const TablePush& plan,
                     const UpdateSettings& settings) override;
  double SquaredNorm(const PushRequest& push, const TablePush& plan) const override;
  void Land(int rank, const PushRequest& push, const TablePush& plan) override;
  absl::Status StageStep(const UpdateSettings& settings) override;
  double StepSquaredNorm() override;
  // Whether the shard has a table called `name`.
  bool Holds(absl::string_view name) const { return Find(name) >= 0; }
  void Commit() override;
  void Discard() override;
  // Fills checkpoint->embeddings().
  void Export(ShardCheckpoint* checkpoint) const override;
  // Freezes every table's rows (row_store.h) and exports them when the
  // snapshot is finished: the caller's lock is held for a pointer per
  // block of rows, and updates after the capture copy the blocks they
  // write while the snapshot is alive.
  // With snapshot->kind kChainDelta, a table's rows are only those
  // committed since the previous chain capture (read from the frozen
  // view, then from the disk snapshot, outside the lock) and its removed
  // ids; under the lock, the sets of changed and removed ids are swapped
  // out whole.
  void Capture(ShardSnapshot* snapshot) override;
  // Whether there are tables and every one has tracked its changes since
  // the last chain capture: false after Initialize or Restore until one.
  bool TracksChanges() const;
  // Replicas. ExportChanges writes, per table, its header and what the
  // update committed since the last ExportChanges changed (the rows
  // trained or created, as and in the order the update wrote them, and
  // the ids removed, in id order), in a ShardCheckpoint delta's form, and
  // starts noting anew (with forward_changes; else only headers). A
  // commit must be exported before the next update is staged or a row
  // removed: INTERNAL, writing nothing, where it was not. ForgetChanges starts
  // anew without writing (the state went whole), noting from now on only
  // with `forward` (a primary with backups; ApplyChanges stops a backup's
  // noting).
  absl::Status ExportChanges(ShardCheckpoint* checkpoint);
  void ForgetChanges(bool forward);
  // A backup's side. CheckChanges: InvalidArgument unless `delta` fits
  // these tables (the same tables in the same order, sizes that agree with
  // their dims and optimizers, ids of this shard, finite values,
  // non-negative counts). ApplyChanges, for a delta CheckChanges passed:
  // makes the tables hold what `delta` (ExportChanges's, of a primary
  // whose tables were equal to these) says: its rows, with
  // their optimizer state and update counts, marked as updated at the
  // table's update count (as the primary marked them), the removed ids
  // gone from both tiers, and the counters of the contents (updates,
  // rows admitted, refused, evicted, expired; the tier moves are this
  // table's own). A row the backup's RAM has no room for goes to its disk
  // tier. INTERNAL when the disk tier fails, DATA_LOSS when a row does not
  // fit a table without one (these tables were not the primary's); the
  // tables are then part applied, and the caller must take the state whole.
  absl::Status CheckChanges(const ShardCheckpoint& delta) const;
  absl::Status ApplyChanges(const ShardCheckpoint& delta);
  // Replaces every table with checkpoint.embeddings(); InvalidArgument,
  // and no change, for one written for another shard count, a row of
  // another shard, sizes that disagree, a repeated id or table, a
  // non-finite value, or a spec that does not resolve.
  absl::Status Restore(const ShardCheckpoint& checkpoint) override;
  // Adds parameter_bytes and one EmbeddingTableStats per table.
  void AddStats(StatsResponse* response) const override;

  // The row width of `table`; 0 when there is no such table.
  int dim(absl::string_view table) const;
  // The rows `table` holds in RAM at most (Bounds above); 0 when there is
  // no such table.
  int64_t row_limit(absl::string_view table) const;
  // The ids of `ids` that `table` does not hold in RAM: what Prefetch
  // reads from the disk tier ahead (empty for a table without one).
  std::vector<uint64_t> ColdIds(absl::string_view table, std::span<const uint64_t> ids) const;
  // Starts reading the cold rows `pull` names from each tiered table's
  // disk tier, on the table's reader (row_prefetch.h), so that the answer
  // to the pull and the update that trains the rows find them read. Needs
  // no checked pull: unknown tables, malformed ids and other shards' ids
  // are passed over (the pull itself refuses them).
  void Prefetch(const PullRequest& pull) const;
  // Whether any table reads ahead (a disk tier, prefetch_rows > 0).
  bool ReadsAhead() const;

  // Pulls (embedding_pulls.cc).
  // Checks `pull.rows()`: known tables, each once, 8 bytes per id, every
  // id of this shard, a known dtype. InvalidArgument naming the table and
  // id otherwise. An id may repeat (it is answered each time); workers
  // send each once per step.
  absl::Status CheckPull(const PullRequest& pull) const;
  // The values of `table`'s rows `ids` into `out` (ids.size() x dim,
  // row after row): a row's committed values, or its initial value when
  // it has none (nothing is stored). InvalidArgument for an unknown table,
  // an id of another shard or `out` of another size; INTERNAL when the
  // disk tier cannot be read.
  absl::Status Lookup(absl::string_view table, std::span<const uint64_t> ids,
                      std::span<float> out) const;
  // Appends to response->rows() the answer to each of pull.rows(), in
  // order: values as pull.dtype(), no ids. Runs CheckPull first.
  absl::Status AnswerPull(const PullRequest& pull, PullResponse* response) const;
  // Bytes the values of `rows` (checked by CheckPull) take as `dtype`,
  // and the values themselves written to `out`, which has that many: for a
  // caller that lays the answer out itself (e.g. in a shared region).
  // INTERNAL when the disk tier cannot be read. `worker` is the pull's
  // (PullRequest.worker): the rows found are kept for that worker's next
  // SYNC push, which stages them without looking them up again if it names
  // the same ids (-1: kept for no one).
  int64_t AnswerBytes(const EmbeddingRows& rows, DType dtype) const;
  absl::Status EncodeRows(const EmbeddingRows& rows, DType dtype, int worker, char* out) const;
  // Rows SYNC steps have staged where their workers' pulls found them,
  // without looking their ids up again.
  int64_t rows_staged_as_pulled() const { return rows_staged_as_pulled_; }

 private:
  struct Embedding;

  // The table called `name`, or -1.
  int Find(absl::string_view name) const;
  // InvalidArgument unless `id` is this shard's.
  absl::Status CheckShard(const Embedding& table, uint64_t id, absl::string_view what) const;
  // Adds an Init's initial rows of `table` (checked: ids of this shard,
  // each once, finite values, within the row limit). InvalidArgument
  // naming the table otherwise, with `table` then half seeded.
  absl::Status SeedRows(Embedding& table, const EmbeddingRows& part) const;
  // Stages the update of rows `ids` by `gradients` (ids.size() x dim).
  // Rows one update may evict from `table` (when_full: evict).
  int64_t EvictionsPerUpdate(const Embedding& table) const;
  // Whether the staged update may add one more new row to `table`: there
  // is room, or it may evict one more.
  bool HasRoomForANewRow(const Embedding& table) const;
  // Drops `table`'s least recently used row (sampled), never one touched
  // at `tick`; false if none was found.
  static bool EvictOne(Embedding& table, int64_t tick);
  // Opens `table`'s disk tier, if its spec names one, under
  // <disk>/<table>-shard<i>.
  absl::Status OpenDisk(Embedding& table) const;
  // Before an update stages `ids` (embedding_tiers.cc): expires rows past
  // the TTL, then, in a tiered table, promotes the ids the disk holds and
  // demotes rows the update does not train until RAM has room for the
  // promoted rows and (but under LFU) the update's new rows. On failure
  // nothing has changed.
  absl::Status Admit(Embedding& table, std::span<const uint64_t> ids);
  absl::Status Expire(Embedding& table);
  // A new row Commit sends to disk: its id, update count and staged record.
  struct StagedNewRow {
    uint64_t id;
    int64_t updates;
    const float* record;
  };
  // Commit's new rows past RAM's room under LFU, written to the disk tier
  // marked with `tick`; where the write fails they go into RAM past the
  // row limit instead (a commit cannot fail), and the error is logged.
  static void StoreNewRows(Embedding& table, std::span<const StagedNewRow> rows, int64_t tick);
  // Writes the rows of `in` past the table's row limit to its disk tier.
  static absl::Status SpillRestored(Embedding& table, const ShardCheckpoint::Embedding& in);
  // Row `id` from the disk tier into *row: read ahead (taken from the
  // reader when `take`, else left there for a later update) or read now;
  // false if the tier does not hold it. Counts the read.
  absl::StatusOr<bool> ReadDisk(const Embedding& table, uint64_t id, bool take, DiskRow* row) const;
  // Row `id`'s values from the disk tier into `out`; false if not there.
  absl::StatusOr<bool> ReadCold(const Embedding& table, uint64_t id, std::span<float> out) const;
  // Rows of ids in a table's store, found while its layout
  // (RowStore::layout) was `layout`; 0: none known.
  struct KnownRows {
    uint64_t layout = 0;
    std::span<const int64_t> rows;
  };
  // Stages the update of `table`'s rows `ids` by `gradients`, its rows
  // looked up unless `known` still holds after admission.
  absl::Status StageRows(Embedding& table, std::span<const uint64_t> ids,
                         std::span<const float> gradients, const UpdateSettings& settings,
                         KnownRows known);
  // Table t's mean rows of the step, into ids_scratch_, rows_scratch_ and
  // origins_scratch_.
  void StepMean(size_t t);
  // The rows of table t's step mean (ids_scratch_, origins_scratch_) as
  // the ranks' pulls of the same ids found them, if every rank whose ids
  // it holds pushed exactly the ids it pulled last and the table's layout
  // is unchanged since; else none known.
  KnownRows PulledRowsOfStep(size_t t);
  // Copies row `id`'s committed or initial values to `out`.
  absl::Status ReadRow(const Embedding& table, uint64_t id, std::span<float> out) const;
  // The values of row `id`, which RAM does not hold, into `out`: the disk
  // tier's, or the row's initial values.
  absl::Status ReadAbsentRow(const Embedding& table, uint64_t id, std::span<float> out) const;
  // Takes `tables` as the shard's tables and empties the step.
  void Adopt(std::vector<std::unique_ptr<Embedding>> tables);

  const EmbeddingTableOptions options_;
  bool initialized_ = false;
  std::vector<std::unique_ptr<Embedding>> tables_;
  std::map<std::string, int, std::less<>> index_;
  // Each table's dim, by index: what Land reads outside the shard's lock.
  std::vector<int> dims_;
  RowStep step_;
  // The step's mean rows per table, when StepSquaredNorm formed them
  // before StageStep.
  struct StepMeanRows {
    std::vector<uint64_t> ids;
    std::vector<float> rows;
    std::vector<RowStep::Origin> origins;
  };
  std::vector<StepMeanRows> step_means_;
  // Scratch of StageStep and Stage, kept warm between updates.
  std::vector<uint64_t> ids_scratch_;
  std::vector<float> rows_scratch_;
  std::vector<RowStep::Origin> origins_scratch_;
  std::vector<int64_t> found_scratch_;
  std::vector<int64_t> known_scratch_;
  // The rows each worker's last pull found, per table (pulled_[worker][t]),
  // with the ids and the store's layout then. A SYNC worker pushes the
  // gradients of the rows it pulled, in the order it pulled them, so that
  // the step stages them without a second lookup of each id (in a large
  // table a cache miss each). Written by pulls, which run under the
  // shard's lock like the staging that reads it.
  struct PulledRowsOf {
    uint64_t layout = 0;
    std::vector<uint64_t> ids;
    std::vector<int64_t> rows;
  };
  mutable std::vector<std::vector<PulledRowsOf>> pulled_;
  int64_t rows_staged_as_pulled_ = 0;
  // A row read from disk, kept warm between reads.
  mutable DiskRow cold_scratch_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_EMBEDDING_TABLE_H_
