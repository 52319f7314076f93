#include "ps_server/core/id_filter.h"

namespace pst {

namespace {

constexpr int kWordsPerBlock = 8;
constexpr int64_t kBitsPerId = 10;

// Odd constants, one a word, that turn an id's hash into its bit in each
// word of its block (the split-block filter of Parquet and Impala).
constexpr std::array<uint32_t, kWordsPerBlock> kSalts = {0x47b6137bU, 0x44974d91U, 0x8824ad5bU,
                                                         0xa2b7289dU, 0x705495c7U, 0x2df1424bU,
                                                         0x9efc4947U, 0x5c6bfb31U};

// Ids arrive hashed or as small integers alike: mix them all (SplitMix64's
// finalizer).
uint64_t Mix(uint64_t id) {
  id ^= id >> 30;
  id *= 0xbf58476d1ce4e5b9ULL;
  id ^= id >> 27;
  id *= 0x94d049bb133111ebULL;
  return id ^ (id >> 31);
}

uint64_t BlockOf(uint64_t hash, uint64_t blocks) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * blocks) >> 64);
}

uint64_t BitInWord(uint64_t hash, int word) {
  return uint64_t{1} << ((static_cast<uint32_t>(hash) * kSalts[word]) >> 26);
}

}  // namespace

IdFilter::Level::Level(int64_t capacity)
    : capacity(capacity),
      blocks(static_cast<uint64_t>((capacity * kBitsPerId + 511) / 512)),
      words(new std::atomic<uint64_t>[blocks * kWordsPerBlock]()) {}

IdFilter::~IdFilter() {
  const int count = level_count_.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) delete levels_[i].load(std::memory_order_relaxed);
}

void IdFilter::Add(uint64_t id) {
  int count = level_count_.load(std::memory_order_relaxed);
  Level* newest = count > 0 ? levels_[count - 1].load(std::memory_order_relaxed) : nullptr;
  if (newest == nullptr || (added_to_newest_ >= newest->capacity && count < kMaxLevels)) {
    newest = new Level(newest == nullptr ? kFirstLevelIds : 2 * newest->capacity);
    levels_[count].store(newest, std::memory_order_release);
    level_count_.store(count + 1, std::memory_order_release);
    added_to_newest_ = 0;
  }
  const uint64_t hash = Mix(id);
  std::atomic<uint64_t>* block = &newest->words[BlockOf(hash, newest->blocks) * kWordsPerBlock];
  for (int w = 0; w < kWordsPerBlock; ++w) {
    block[w].fetch_or(BitInWord(hash, w), std::memory_order_relaxed);
  }
  ++added_to_newest_;
  ++added_;
}

bool IdFilter::MayHold(uint64_t id) const {
  const uint64_t hash = Mix(id);
  const int count = level_count_.load(std::memory_order_acquire);
  // Each level's block is a cache miss once a level outgrows the cache:
  // ask for all of them before testing any, so that the misses overlap.
  std::array<const std::atomic<uint64_t>*, kMaxLevels> blocks;
  for (int i = 0; i < count; ++i) {
    const Level* level = levels_[i].load(std::memory_order_acquire);
    blocks[i] = &level->words[BlockOf(hash, level->blocks) * kWordsPerBlock];
    __builtin_prefetch(blocks[i]);
  }
  for (int i = 0; i < count; ++i) {
    const std::atomic<uint64_t>* block = blocks[i];
    bool all = true;
    for (int w = 0; w < kWordsPerBlock && all; ++w) {
      const uint64_t bit = BitInWord(hash, w);
      all = (block[w].load(std::memory_order_relaxed) & bit) == bit;
    }
    if (all) return true;
  }
  return false;
}

int64_t IdFilter::bytes() const {
  int64_t total = 0;
  const int count = level_count_.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    total += static_cast<int64_t>(levels_[i].load(std::memory_order_acquire)->blocks) *
             kWordsPerBlock * sizeof(uint64_t);
  }
  return total;
}

}  // namespace pst
