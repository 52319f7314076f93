#include "ps_server/core/row_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "placement/row_placement.h"

namespace pst {

RowStore::Block::Block(std::shared_ptr<RecordArena> arena, int64_t epoch)
    : arena(std::move(arena)), epoch(epoch), records(static_cast<float*>(this->arena->Take())) {}

RowStore::Block::Block(const Block& other, int64_t epoch) : Block(other.arena, epoch) {
  std::memcpy(records, other.records, arena->piece_bytes());
  ids = other.ids;
}

RowStore::Block::~Block() { arena->Give(records); }

namespace {

// 2^40 Adds and Removes per store before its count could reach the next
// store's stamp: beyond any table's life.
constexpr int kLayoutCountBits = 40;

uint64_t NextStoreStamp() {
  static std::atomic<uint64_t> stores{0};
  return (stores.fetch_add(1, std::memory_order_relaxed) + 1) << kLayoutCountBits;
}

}  // namespace

RowStore::RowStore(int dim, int slots_per_value)
    : dim_(dim),
      slots_per_value_(slots_per_value),
      arena_(std::make_shared<RecordArena>(kRowsPerBlock * stride() * sizeof(float))),
      layout_(NextStoreStamp()) {}

RowStore::~RowStore() {
  for (int64_t b = 0; b < blocks_; ++b) graveyard_->Retire(BlockOf(chunks_, b), epoch_);
  for (const Chunk* chunk : chunks_) graveyard_->Retire(chunk, epoch_);
}

void RowStore::Graveyard::AddView(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  views_.push_back(epoch);
  live_.fetch_add(1, std::memory_order_relaxed);
}

void RowStore::Graveyard::DropView(int64_t epoch) {
  std::vector<const Block*> freed;
  std::vector<const Chunk*> freed_chunks;
  {
    absl::MutexLock lock(&mu_);
    views_.erase(std::find(views_.begin(), views_.end(), epoch));
    live_.fetch_sub(1, std::memory_order_release);
    // A block or chunk retired at epoch e may be shared by views frozen at
    // e or before; those left were frozen at `oldest` or later.
    const int64_t oldest = views_.empty() ? std::numeric_limits<int64_t>::max()
                                          : *std::min_element(views_.begin(), views_.end());
    const auto take_freed = [oldest](auto& retired, auto& out) {
      auto kept = std::partition(retired.begin(), retired.end(),
                                 [oldest](const auto& r) { return r.first >= oldest; });
      for (auto it = kept; it != retired.end(); ++it) out.push_back(it->second);
      retired.erase(kept, retired.end());
    };
    take_freed(retired_, freed);
    take_freed(retired_chunks_, freed_chunks);
  }
  // Outside the lock.
  for (const Block* block : freed) delete block;
  for (const Chunk* chunk : freed_chunks) delete chunk;
}

template <typename Piece>
void RowStore::Graveyard::RetireTo(Retired<Piece> Graveyard::*retired, const Piece* piece,
                                   int64_t epoch) {
  {
    absl::MutexLock lock(&mu_);
    if (std::any_of(views_.begin(), views_.end(), [epoch](int64_t v) { return v <= epoch; })) {
      (this->*retired).emplace_back(epoch, piece);
      return;
    }
  }
  delete piece;
}

void RowStore::Graveyard::Retire(const Block* block, int64_t epoch) {
  RetireTo(&Graveyard::retired_, block, epoch);
}

void RowStore::Graveyard::Retire(const Chunk* chunk, int64_t epoch) {
  RetireTo(&Graveyard::retired_chunks_, chunk, epoch);
}

size_t RowStore::IndexPart(uint64_t id) {
  // The hash's top bits: its low bits chose the shard (ShardOfRow), so on
  // one shard of a power-of-two count they are the same for every row.
  return static_cast<size_t>(RowHash(id) >> 58) % kIndexParts;
}

int64_t RowStore::bytes() const {
  // A block's pointer lies in its chunk.
  const int64_t per_block = sizeof(Block) + sizeof(float*) +
                            kRowsPerBlock * static_cast<int64_t>(stride() * sizeof(float));
  int64_t bytes = blocks_ * per_block + static_cast<int64_t>(chunks_.size() * sizeof(Chunk));
  for (const Index& part : index_) {
    // A slot per entry plus a control byte per slot (Abseil's Swiss table).
    bytes += static_cast<int64_t>(part.capacity() * (sizeof(Index::value_type) + 1));
  }
  return bytes;
}

int64_t RowStore::Find(uint64_t id) const {
  const Index& part = index_[IndexPart(id)];
  auto it = part.find(id);
  return it == part.end() ? -1 : static_cast<int64_t>(it->second);
}

void RowStore::FindEach(std::span<const uint64_t> ids, std::span<int64_t> rows) const {
  constexpr size_t kAhead = 8;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) PrefetchIndex(ids[i + kAhead]);
    rows[i] = Find(ids[i]);
  }
}

void RowStore::MakeWritable(int64_t row) {
  // A block made before the last freeze may be in a view while any is
  // alive; the views never see a write, so it is copied first. The count
  // of views first: it is nearly always 0, and the block's epoch lies in
  // its header.
  if (graveyard_->live() == 0) return;
  const Block* block = BlockOf(chunks_, row / kRowsPerBlock);
  if (block->epoch >= epoch_) return;
  Block* copy = new Block(*block, epoch_);
  graveyard_->Retire(block, epoch_);
  records_[row / kRowsPerBlock] = copy->records;
  WritableSlot(row / kRowsPerBlock) = copy;
}

RowStore::Chunk& RowStore::WritableChunk(int64_t block) {
  Chunk*& chunk = chunks_[block / kBlocksPerChunk];
  if (graveyard_->live() > 0 && chunk->epoch < epoch_) {
    Chunk* copy = new Chunk(*chunk, epoch_);
    graveyard_->Retire(chunk, epoch_);
    chunk = copy;
  }
  return *chunk;
}

void RowStore::MarkChanged(int64_t row) {
  if (!tracks_changes_) return;
  const int64_t block = row / kRowsPerBlock;
  const uint64_t bit = uint64_t{1} << (row % kRowsPerBlock);
  // Read first: a row trained again is marked already, and its chunk then
  // need not be made writable.
  const RowMarks& now = marks_of(block);
  if (now.mark == change_mark_ && (now.rows & bit) != 0) return;
  RowMarks& marks = WritableChunk(block).marks[block % kBlocksPerChunk];
  if (marks.mark != change_mark_) marks = {.mark = change_mark_, .rows = 0};
  marks.rows |= bit;
}

int64_t RowStore::Add(uint64_t id, std::span<const float> values, std::span<const float> slots,
                      int64_t updates) {
  const int64_t row = size_;
  if (row % kRowsPerBlock == 0) {
    if (blocks_ % kBlocksPerChunk == 0) chunks_.push_back(new Chunk(epoch_));
    Block* block = new Block(arena_, epoch_);
    WritableSlot(blocks_++) = block;
    records_.push_back(block->records);
  }
  ++size_;
  MakeWritable(row);
  mutable_block(row).ids[row % kRowsPerBlock] = id;
  Write(row, values, slots, updates, /*keep_copy=*/false);
  MarkChanged(row);
  index_[IndexPart(id)].emplace(id, static_cast<uint32_t>(row));
  ++layout_;
  return row;
}

void RowStore::Update(int64_t row, std::span<const float> values, std::span<const float> slots,
                      int64_t updates) {
  MakeWritable(row);
  if (tracks_changes_) MarkWritten(row, CountIn(record(row), width() + kCountFloats));
  Write(row, values, slots, updates, /*keep_copy=*/true);
}

float* RowStore::BeginUpdate(int64_t row, float* saved) {
  MakeWritable(row);
  float* record = records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride();
  std::memcpy(saved, record, stride() * sizeof(float));
  if (tracks_changes_) MarkWritten(row, CountIn(saved, width() + kCountFloats));
  return record;
}

void RowStore::EndUpdate(int64_t row, int64_t updates) {
  Mark(records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride(), updates,
       /*keep_copy=*/true);
}

void RowStore::Mark(float* record, int64_t updates, bool keep_copy) const {
  int64_t tick = tick_;
  if (keep_copy) tick |= CountIn(record, width() + kCountFloats) & kCopyBit;
  std::memcpy(record + width(), &updates, sizeof(updates));
  std::memcpy(record + width() + kCountFloats, &tick, sizeof(tick));
}

void RowStore::Restore(int64_t row, const float* saved) {
  MakeWritable(row);
  std::memcpy(records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride(), saved,
              stride() * sizeof(float));
  MarkChanged(row);
}

void RowStore::set_has_copy(int64_t row, bool copy) {
  MakeWritable(row);
  float* at =
      records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride() + width() + kCountFloats;
  int64_t tick;
  std::memcpy(&tick, at, sizeof(tick));
  tick = copy ? (tick | kCopyBit) : (tick & ~kCopyBit);
  std::memcpy(at, &tick, sizeof(tick));
}

void RowStore::Remove(int64_t row) {
  const int64_t last = size_ - 1;
  const uint64_t gone = id(row);
  index_[IndexPart(gone)].erase(gone);
  ++layout_;
  if (row != last) {
    // The last row fills the hole, so that rows stay dense and a block is
    // freed once its last row goes.
    MakeWritable(row);
    const uint64_t moved = id(last);
    float* to = records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride();
    std::memcpy(to, record(last), stride() * sizeof(float));
    mutable_block(row).ids[row % kRowsPerBlock] = moved;
    MarkChanged(row);
    index_[IndexPart(moved)][moved] = static_cast<uint32_t>(row);
  }
  --size_;
  if (size_ % kRowsPerBlock == 0) {
    // A view that shares the block (or its chunk) keeps it. The chunk's
    // slot is left as it is: past the last block, no one reads it.
    graveyard_->Retire(BlockOf(chunks_, --blocks_), epoch_);
    records_.pop_back();
    if (blocks_ % kBlocksPerChunk == 0) {
      graveyard_->Retire(chunks_.back(), epoch_);
      chunks_.pop_back();
    }
  }
}

void RowStore::Write(int64_t row, std::span<const float> values, std::span<const float> slots,
                     int64_t updates, bool keep_copy) {
  float* record = records_[row / kRowsPerBlock] + (row % kRowsPerBlock) * stride();
  Mark(record, updates, keep_copy);
  std::copy(values.begin(), values.end(), record);
  std::copy(slots.begin(), slots.end(), record + dim_);
}

RowStore::Frozen RowStore::Freeze() {
  ++epoch_;
  return Frozen(*this);
}

RowStore::Frozen::Frozen(const RowStore& store)
    : dim_(store.dim_),
      width_(store.width()),
      size_(store.size_),
      epoch_(store.epoch_),
      chunks_(store.chunks_.begin(), store.chunks_.end()),
      graveyard_(store.graveyard_) {
  graveyard_->AddView(epoch_);
}

RowStore::Frozen::~Frozen() {
  // A moved-from view holds nothing.
  if (graveyard_ != nullptr) graveyard_->DropView(epoch_);
}

}  // namespace pst
