// One embedding table's rows on one shard: each row's id, values,
// optimizer state and the updates applied to it.
//
// Rows live in blocks of kRowsPerBlock rows that are never moved, so a
// growing table never copies the rows it holds (with millions of rows, a
// reallocation would stall the shard's lock for the copy), and what it
// holds beyond its rows is at most one block. The blocks' records come from
// a RecordArena (record_arena.h): on huge pages where the host grants them,
// and up to a chunk (2 MiB) mapped ahead of the rows. The id index is split into
// kIndexParts maps by the id's hash, so growing the index rehashes one
// small map at a time, never the whole index.
//
// Frozen views. Freeze returns the rows as they are now, for a checkpoint
// to read at leisure on another thread while the store trains on: it
// shares the blocks, and a block a live view shares is copied before its
// first write after the freeze (copy on write), so freezing costs a
// pointer per chunk of kBlocksPerChunk blocks and a write pays at most one
// block's copy and its chunk's. Blocks are small for that reason: a push
// touching n rows copies at most n blocks. The block pointers lie in
// chunks shared the same way: a chunk a view shares is copied before the
// store first replaces, adds or drops a block in it, so a freeze copies
// the chunks' pointers, not the blocks' (at 10^7 rows, 305 pointers
// instead of 156 250: a 1.2 MB copy took 0.1-0.4 ms under the shard's
// lock). The pointers are plain ones: a block or chunk a view may share
// that the store replaces or drops is kept in a list the store and its
// views share (the graveyard), and freed once every view frozen before
// that is gone. (Counting references per block, a freeze touched a line
// of every block's header: 10 ms under the shard's lock for a table of
// 10^7 rows.)
//
// Changes. Every write of a row (Add, Update, BeginUpdate, Restore, and
// Remove's move of the last row into the hole) marks its place with the
// store's change mark, a bit per row beside its block's pointer, and a
// frozen view keeps the marks as they were (ForEachMarked): a delta
// checkpoint visits the places written since the last delta, not every
// row (at 10^7 rows a scan of them all took 0.18 s). A row whose tick is
// above every tick set before the mark began was written, and marked,
// under it already: an update in place reads its row's tick anyway, so
// only a row's first write under a mark reads the marks (reading them on
// every write made a SYNC row step's staging a fifth or more slower in
// alternated runs).
//
// Not thread-safe: the owner serializes access, Freeze included. A frozen
// view is immutable and may be read on any thread and outlive the store.
#ifndef PST_PS_SERVER_CORE_ROW_STORE_H_
#define PST_PS_SERVER_CORE_ROW_STORE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "ps_server/core/record_arena.h"

namespace pst {

class RowStore {
  struct Block;
  struct Chunk;
  class Graveyard;

 public:
  static constexpr int64_t kRowsPerBlock = 64;
  static constexpr int64_t kBlocksPerChunk = 512;  // 4 KiB of pointers
  static constexpr int kIndexParts = 64;

  // Rows of `dim` values and `slots_per_value` * dim floats of optimizer
  // state, slot-major within the row (slot s of value i at s * dim + i).
  RowStore(int dim, int slots_per_value);
  // Frees the blocks no live view shares; a view keeps the rest.
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  int dim() const { return dim_; }
  int64_t size() const { return size_; }
  // Memory the rows take: blocks, index and its control bytes.
  int64_t bytes() const;

  // The index of `id`'s row, or -1.
  int64_t Find(uint64_t id) const;
  // Names the store's id-to-row map as it is now: it changes with every
  // Add and Remove (the only calls that change which row an id has), and
  // no two stores of a process ever share one. Rows found while it stays
  // the same are still the ids' rows, without a lookup.
  uint64_t layout() const { return layout_; }
  // rows[i] = Find(ids[i]) for each i, hinting the index a few ids ahead:
  // in a large table nearly every lookup is a cache miss, and this lets
  // them overlap.
  void FindEach(std::span<const uint64_t> ids, std::span<int64_t> rows) const;
  // Cache hints: `id` will be looked up soon; row `row` will be read soon.
  // Rows of a large table are scattered over memory, so a caller about to
  // visit many of them hints a few ahead, and the misses overlap.
  void PrefetchIndex(uint64_t id) const { index_[IndexPart(id)].prefetch(id); }
  void PrefetchRow(int64_t row) const { PrefetchRecord(record(row), stride()); }
  // Row `row`'s update count and tick alone will be read soon (a sampled
  // eviction compares only them): a line or two, not the whole record.
  void PrefetchCounts(int64_t row) const {
    const char* counts = reinterpret_cast<const char*>(record(row) + width());
    __builtin_prefetch(counts);
    __builtin_prefetch(counts + 2 * kCountFloats * sizeof(float) - 1);
  }
  // Adds a row for `id`, which has none, with the given contents (dim
  // values, slots_per_value * dim slots); returns its index.
  int64_t Add(uint64_t id, std::span<const float> values, std::span<const float> slots,
              int64_t updates);
  // Replaces row `row`'s contents.
  void Update(int64_t row, std::span<const float> values, std::span<const float> slots,
              int64_t updates);
  // An update in place, for an owner that can undo it: BeginUpdate saves
  // row `row`'s whole record (values, slots, update count and tick:
  // saved_floats() floats) to `saved`, makes its block writable, and
  // returns its values (dim) followed by its slots, for the caller to
  // overwrite; EndUpdate then sets its update count and marks it with the
  // tick (keeping has_copy), as Update would. Restore puts back what
  // BeginUpdate saved, wherever the row has moved since. The row's cache
  // lines are read and written once, where Update writes a record staged
  // elsewhere.
  size_t saved_floats() const { return stride(); }
  float* BeginUpdate(int64_t row, float* saved);
  void EndUpdate(int64_t row, int64_t updates);
  void Restore(int64_t row, const float* saved);
  // Drops row `row`: the last row moves into its place (its index changes
  // to `row`; every other index stays), and the store shrinks by one.
  void Remove(int64_t row);

  // Recency, for an owner that evicts: Add and Update mark their row with
  // the tick set last (0 until set), in the row's record beside its update
  // count, so that marking costs no cache miss of its own. Not one of the
  // row's contents a view or a checkpoint reads.
  void set_tick(int64_t tick) {
    tick_ = tick;
    highest_tick_ = std::max(highest_tick_, tick);
  }
  int64_t tick() const { return tick_; }
  int64_t touched(int64_t row) const {
    return CountIn(record(row), width() + kCountFloats) & ~kCopyBit;
  }

  // Whether the owner keeps a copy of row `row` elsewhere too (a tiered
  // table: its disk tier still holds the row as it was promoted). In the
  // tick's highest bit, so the mark costs no byte; Add clears it, Update
  // keeps it, and it moves with the row.
  bool has_copy(int64_t row) const {
    return (CountIn(record(row), width() + kCountFloats) & kCopyBit) != 0;
  }
  void set_has_copy(int64_t row, bool copy);

  uint64_t id(int64_t row) const { return block(row).ids[row % kRowsPerBlock]; }
  std::span<const float> values(int64_t row) const { return {record(row), size_t(dim_)}; }
  std::span<const float> slots(int64_t row) const { return {record(row) + dim_, slot_floats()}; }
  int64_t updates(int64_t row) const { return CountIn(record(row), width()); }

  // The rows as they were at Freeze, read as the store's.
  class Frozen {
   public:
    Frozen(Frozen&&) = default;
    Frozen& operator=(Frozen&&) = delete;
    ~Frozen();

    int64_t size() const { return size_; }
    uint64_t id(int64_t row) const { return block(row).ids[row % kRowsPerBlock]; }
    std::span<const float> values(int64_t row) const { return {record(row), size_t(dim_)}; }
    std::span<const float> slots(int64_t row) const {
      return {record(row) + dim_, width_ - dim_};
    }
    int64_t updates(int64_t row) const { return CountIn(record(row), width_); }
    // Row `row` will be read soon (RowStore::PrefetchRow); its id will.
    void PrefetchRow(int64_t row) const { PrefetchRecord(record(row), width_ + 2 * kCountFloats); }
    void PrefetchId(int64_t row) const { __builtin_prefetch(&block(row).ids[row % kRowsPerBlock]); }
    bool has_copy(int64_t row) const {
      return (CountIn(record(row), width_ + kCountFloats) & kCopyBit) != 0;
    }
    // Calls visit(row) for each row of the view, in order, whose place
    // was written while the store's change mark was `mark`, the mark
    // current at the freeze (which EndChanges ends next): every row written
    // under it, wherever Remove has moved it since, and a few that were not
    // (moved, or written back as they were). A block keeps the marks of
    // its latest writes only: an older mark lists the rows of the blocks
    // not written since.
    template <typename Visit>
    void ForEachMarked(int64_t mark, Visit visit) const {
      const int64_t blocks = (size_ + kRowsPerBlock - 1) / kRowsPerBlock;
      for (int64_t b = 0; b < blocks; ++b) {
        const RowMarks& marks = chunks_[b / kBlocksPerChunk]->marks[b % kBlocksPerChunk];
        if (marks.mark != mark) continue;
        for (uint64_t rows = marks.rows; rows != 0; rows &= rows - 1) {
          const int64_t row = b * kRowsPerBlock + std::countr_zero(rows);
          if (row < size_) visit(row);
        }
      }
    }

   private:
    friend class RowStore;
    Frozen(const RowStore& store);
    const Block& block(int64_t row) const { return *BlockOf(chunks_, row / kRowsPerBlock); }
    const float* record(int64_t row) const {
      return block(row).records + (row % kRowsPerBlock) * (width_ + 2 * kCountFloats);
    }

    const int dim_;
    const size_t width_;
    const int64_t size_;
    const int64_t epoch_;  // the store's, at the freeze
    std::vector<const Chunk*> chunks_;
    // Null once moved from.
    std::shared_ptr<Graveyard> graveyard_;
  };
  Frozen Freeze();

  // Ends the change mark that writes have set since the last call and
  // returns it; writes from now on set the next. Writes mark nothing
  // before the first call (which ends mark 0): a store no delta reads
  // does not pay for the marks.
  int64_t EndChanges() {
    tracks_changes_ = true;
    ticks_before_mark_ = highest_tick_;
    return change_mark_++;
  }

 private:
  // A row's record is its values, then its slots, then its update count
  // and its tick (the bytes of an int64_t in kCountFloats floats each): all
  // a row's update reads and writes lies together, in a large table a line
  // or two of one page. `epoch`: the store's epoch when the block was made;
  // a view frozen since shares it.
  static constexpr size_t kCountFloats = sizeof(int64_t) / sizeof(float);
  // has_copy's bit of the tick (ticks count updates: far below it).
  static constexpr int64_t kCopyBit = int64_t{1} << 62;
  // Blocks the store no longer holds that views may still share.
  class Graveyard {
   public:
    // A view frozen at `epoch` is alive / gone; gone, it frees the blocks
    // no live view may share.
    void AddView(int64_t epoch);
    void DropView(int64_t epoch);
    // Keeps `block` (`chunk`), which the store stops holding at `epoch`
    // (views frozen until then may share it), while such a view lives;
    // frees it now if none does.
    void Retire(const Block* block, int64_t epoch);
    void Retire(const Chunk* chunk, int64_t epoch);
    // Views alive (read with acquire: a view's reads of a block happen
    // before the store writes it in place again).
    int live() const { return live_.load(std::memory_order_acquire); }

   private:
    // Pieces retired, each with the epoch it was retired at.
    template <typename Piece>
    using Retired = std::vector<std::pair<int64_t, const Piece*>>;
    template <typename Piece>
    void RetireTo(Retired<Piece> Graveyard::*retired, const Piece* piece, int64_t epoch);

    absl::Mutex mu_;
    // Live views by the epoch they were frozen at (a few at a time).
    std::vector<int64_t> views_ ABSL_GUARDED_BY(mu_);
    Retired<Block> retired_ ABSL_GUARDED_BY(mu_);
    Retired<Chunk> retired_chunks_ ABSL_GUARDED_BY(mu_);
    std::atomic<int> live_{0};
  };

  struct Block {
    // A block whose records are a piece of `arena`, made at `epoch`.
    Block(std::shared_ptr<RecordArena> arena, int64_t epoch);
    // A copy of `other`'s rows, made at `epoch`.
    Block(const Block& other, int64_t epoch);
    ~Block();
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

    const std::shared_ptr<RecordArena> arena;
    const int64_t epoch;
    float* const records;  // kRowsPerBlock records, a piece of `arena`
    std::array<uint64_t, kRowsPerBlock> ids;
  };
  // Which of a block's places were written under change mark `mark` (a
  // bit per place); none under any other.
  struct RowMarks {
    int64_t mark = -1;
    uint64_t rows = 0;
  };
  // Pointers to kBlocksPerChunk consecutive blocks (those past the store's
  // last are stale) and their change marks, made at `epoch`; owns none of
  // the blocks. The marks lie here rather than in the blocks' headers: the
  // chunk's lines are few and warm, a block's header is a cache miss of
  // its own.
  struct Chunk {
    explicit Chunk(int64_t epoch) : epoch(epoch) {}
    Chunk(const Chunk& other, int64_t epoch)
        : epoch(epoch), blocks(other.blocks), marks(other.marks) {}

    const int64_t epoch;
    std::array<Block*, kBlocksPerChunk> blocks{};
    std::array<RowMarks, kBlocksPerChunk> marks{};
  };
  template <typename ChunkPtr>
  static Block* BlockOf(const std::vector<ChunkPtr>& chunks, int64_t block) {
    return chunks[block / kBlocksPerChunk]->blocks[block % kBlocksPerChunk];
  }
  static void PrefetchRecord(const float* record, size_t floats) {
    const char* at = reinterpret_cast<const char*>(record);
    for (size_t line = 0; line < floats * sizeof(float); line += 64) __builtin_prefetch(at + line);
    // The record's last bytes, where it crosses into another line.
    __builtin_prefetch(at + floats * sizeof(float) - 1);
  }
  static int64_t CountIn(const float* record, size_t width) {
    int64_t count;
    std::memcpy(&count, record + width, sizeof(count));
    return count;
  }
  using Index = absl::flat_hash_map<uint64_t, uint32_t>;

  size_t slot_floats() const { return static_cast<size_t>(slots_per_value_) * dim_; }
  size_t width() const { return static_cast<size_t>(dim_) + slot_floats(); }
  size_t stride() const { return width() + 2 * kCountFloats; }
  const Block& block(int64_t row) const { return *BlockOf(chunks_, row / kRowsPerBlock); }
  // Row `row`'s block, to write after MakeWritable(row).
  Block& mutable_block(int64_t row) { return *BlockOf(chunks_, row / kRowsPerBlock); }
  // Block `block`'s chunk, copied first if a live view may share it.
  Chunk& WritableChunk(int64_t block);
  // Block `block`'s place in its chunk, written as WritableChunk.
  Block*& WritableSlot(int64_t block) {
    return WritableChunk(block).blocks[block % kBlocksPerChunk];
  }
  const RowMarks& marks_of(int64_t block) const {
    return chunks_[block / kBlocksPerChunk]->marks[block % kBlocksPerChunk];
  }
  // Marks row `row`'s place as written under the current change mark;
  // MarkWritten, unless its tick before the write (`tick`, with its
  // has_copy bit) says that it is marked already.
  void MarkChanged(int64_t row);
  void MarkWritten(int64_t row, int64_t tick) {
    if ((tick & ~kCopyBit) <= ticks_before_mark_) MarkChanged(row);
  }
  const float* record(int64_t row) const {
    return records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride();
  }
  // Copies row `row`'s block first if a live view may share it.
  void MakeWritable(int64_t row);
  // Sets the update count of `record` and marks it with the tick;
  // `keep_copy` keeps its has_copy mark (else cleared).
  void Mark(float* record, int64_t updates, bool keep_copy) const;
  // Writes row `row`'s contents, its block writable; `keep_copy` keeps
  // its has_copy mark (else cleared).
  void Write(int64_t row, std::span<const float> values, std::span<const float> slots,
             int64_t updates, bool keep_copy);
  static size_t IndexPart(uint64_t id);

  const int dim_;
  const int slots_per_value_;
  int64_t size_ = 0;
  // Where the blocks' records are taken: shared with the blocks, which a
  // frozen view may keep after the store is gone.
  const std::shared_ptr<RecordArena> arena_;
  // The blocks, in chunks. Owned, blocks and chunks: each is freed by the
  // store, or retired to the graveyard.
  std::vector<Chunk*> chunks_;
  int64_t blocks_ = 0;
  // Each block's records: a row is one load away, not two, and reaching it
  // never reads its block's header (a cache line of its own, which a large
  // table's rows would each miss).
  std::vector<float*> records_;
  std::array<Index, kIndexParts> index_;
  // What Add and Update mark their row with.
  int64_t tick_ = 0;
  // Freezes so far: a block with an older epoch may be in a view.
  int64_t epoch_ = 0;
  // The highest tick set yet.
  int64_t highest_tick_ = 0;
  // What writes mark their row's place with, once EndChanges was called,
  // and the highest tick set before that mark began.
  bool tracks_changes_ = false;
  int64_t change_mark_ = 0;
  int64_t ticks_before_mark_ = 0;
  const std::shared_ptr<Graveyard> graveyard_ = std::make_shared<Graveyard>();
  // See layout(): the store's stamp in the high bits, a count of Adds and
  // Removes in the low ones.
  uint64_t layout_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ROW_STORE_H_
