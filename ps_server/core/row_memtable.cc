#include "ps_server/core/row_memtable.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/memtablerep.h"
#include "rocksdb/slice.h"

namespace pst {
namespace {

using rocksdb::KeyHandle;
using rocksdb::MemTableRep;
using rocksdb::Slice;
using KeyComparator = MemTableRep::KeyComparator;

// An entry in the arena: the next entry of its bucket, then the entry
// RocksDB encodes (the length-prefixed internal key, then the value).
struct Node {
  std::atomic<Node*> next;
  char* entry() { return reinterpret_cast<char*>(this + 1); }
};

template <typename T>
T* AlignedIn(char* raw) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  return reinterpret_cast<T*>((at + alignof(T) - 1) & ~uintptr_t{alignof(T) - 1});
}

// An internal key is the user key and 8 bytes of sequence number and type.
Slice UserKeyOf(const Slice& internal_key) {
  return Slice(internal_key.data(), internal_key.size() - 8);
}

Slice UserKeyOfEntry(const char* entry) {
  return UserKeyOf(rocksdb::GetLengthPrefixedSlice(entry));
}

// The first eight bytes of a user key (zeros past a shorter one) as a
// big-endian integer: ordered as the bytewise comparator orders the keys,
// except where two keys share them.
uint64_t HeadOf(const Slice& user_key) {
  unsigned char bytes[8] = {};
  std::memcpy(bytes, user_key.data(), std::min<size_t>(sizeof(bytes), user_key.size()));
  uint64_t head;
  std::memcpy(&head, bytes, sizeof(head));
  return __builtin_bswap64(head);
}

struct SortedEntry {
  uint64_t head;
  const char* entry;
};

using SortedEntries = std::vector<SortedEntry>;

class OrderedIterator;

// Storage for an iterator RocksDB makes in its arena: it destroys such an
// iterator without freeing it (the arena's memory goes with the arena),
// and the arena's API is not public, so those iterators live in shells of
// ours. A destroyed iterator's shell goes to its thread's spares, and only
// that thread reuses or frees it, after the destructor has returned.
struct Shell;
std::unique_ptr<Shell> SpareShell();
void Spare(Shell* shell);

// Every entry of the memtable, in the comparator's order.
class OrderedIterator : public MemTableRep::Iterator {
 public:
  OrderedIterator(std::shared_ptr<const SortedEntries> entries, const KeyComparator& compare,
                  Shell* shell)
      : entries_(std::move(entries)), compare_(compare), shell_(shell), at_(entries_->size()) {}
  ~OrderedIterator() override {
    if (shell_ != nullptr) Spare(shell_);
  }

  bool Valid() const override { return at_ < entries_->size(); }
  const char* key() const override { return (*entries_)[at_].entry; }
  void Next() override { ++at_; }
  void Prev() override { at_ = at_ == 0 ? entries_->size() : at_ - 1; }
  void Seek(const Slice& internal_key, const char* memtable_key) override {
    at_ = std::partition_point(entries_->begin(), entries_->end(),
                               [&](const SortedEntry& e) {
                                 return Compare(e.entry, internal_key, memtable_key) < 0;
                               }) -
          entries_->begin();
  }
  void SeekForPrev(const Slice& internal_key, const char* memtable_key) override {
    const size_t after =
        std::partition_point(entries_->begin(), entries_->end(),
                             [&](const SortedEntry& e) {
                               return Compare(e.entry, internal_key, memtable_key) <= 0;
                             }) -
        entries_->begin();
    at_ = after == 0 ? entries_->size() : after - 1;
  }
  void SeekToFirst() override { at_ = 0; }
  void SeekToLast() override { at_ = entries_->empty() ? 0 : entries_->size() - 1; }

 private:
  int Compare(const char* entry, const Slice& internal_key, const char* memtable_key) const {
    return memtable_key != nullptr ? compare_(entry, memtable_key) : compare_(entry, internal_key);
  }

  const std::shared_ptr<const SortedEntries> entries_;
  const KeyComparator& compare_;
  Shell* const shell_;  // null where made with new
  size_t at_;
};

struct Shell {
  alignas(OrderedIterator) std::byte bytes[sizeof(OrderedIterator)];
};

// A thread keeps a few: flushes and scans make and destroy their
// iterators on one thread, one or two at a time.
constexpr size_t kSpareShells = 8;
thread_local std::vector<std::unique_ptr<Shell>> spare_shells;

std::unique_ptr<Shell> SpareShell() {
  if (spare_shells.empty()) return std::make_unique<Shell>();
  std::unique_ptr<Shell> shell = std::move(spare_shells.back());
  spare_shells.pop_back();
  return shell;
}

void Spare(Shell* shell) {
  // The oldest spare's destructor returned before this one began.
  if (spare_shells.size() >= kSpareShells) spare_shells.erase(spare_shells.begin());
  spare_shells.emplace_back(shell);
}

class RowMemtable;

// The entries of one user key, found in its bucket at the seek: what a
// point read walks.
class KeyIterator : public MemTableRep::Iterator {
 public:
  explicit KeyIterator(const RowMemtable& table) : table_(table) {}

  bool Valid() const override { return at_ < entries_.size(); }
  const char* key() const override { return entries_[at_]; }
  void Next() override { ++at_; }
  void Prev() override { at_ = at_ == 0 ? entries_.size() : at_ - 1; }
  void Seek(const Slice& internal_key, const char* memtable_key) override;
  void SeekForPrev(const Slice& internal_key, const char* memtable_key) override;
  void SeekToFirst() override { at_ = 0; }
  void SeekToLast() override { at_ = entries_.empty() ? 0 : entries_.size() - 1; }

 private:
  void Collect(const Slice& internal_key);

  const RowMemtable& table_;
  absl::InlinedVector<const char*, 4> entries_;
  size_t at_ = 0;
};

// The point read RowMemtable::Get hands to RocksDB's MemTableRep::Get,
// which asks GetDynamicPrefixIterator for it on the same thread.
thread_local MemTableRep::Iterator* point_read = nullptr;

class RowMemtable : public MemTableRep {
 public:
  RowMemtable(const KeyComparator& compare, rocksdb::Allocator* allocator, size_t buckets)
      : MemTableRep(allocator), compare_(compare), mask_(buckets - 1) {
    char* raw = nullptr;
    MemTableRep::Allocate(buckets * sizeof(std::atomic<Node*>) + alignof(std::atomic<Node*>), &raw);
    buckets_ = AlignedIn<std::atomic<Node*>>(raw);
    for (size_t i = 0; i < buckets; ++i) new (&buckets_[i]) std::atomic<Node*>(nullptr);
  }

  KeyHandle Allocate(const size_t len, char** buf) override {
    char* raw = nullptr;
    MemTableRep::Allocate(sizeof(Node) + alignof(Node) - 1 + len, &raw);
    Node* node = new (AlignedIn<Node>(raw)) Node{nullptr};
    *buf = node->entry();
    return node;
  }

  // One writer: a new entry goes first in its bucket, so that a key's
  // entries there run newest first.
  void Insert(KeyHandle handle) override {
    Node* node = static_cast<Node*>(handle);
    std::atomic<Node*>& head = BucketOf(UserKeyOfEntry(node->entry()));
    node->next.store(head.load(std::memory_order_relaxed), std::memory_order_relaxed);
    head.store(node, std::memory_order_release);
    entries_.fetch_add(1, std::memory_order_relaxed);
  }

  bool Contains(const char* key) const override {
    const Slice internal_key = rocksdb::GetLengthPrefixedSlice(key);
    bool found = false;
    ForEachOfKey(UserKeyOf(internal_key),
                 [&](const char* entry) { found = found || compare_(entry, internal_key) == 0; });
    return found;
  }

  void Get(const rocksdb::LookupKey& key, void* arg,
           bool (*callback)(void* arg, const char* entry)) override {
    // RocksDB's own Get seeks the iterator GetDynamicPrefixIterator gives
    // to the lookup key and walks it, but never frees it, and a LookupKey's
    // fields are not public API. So that walk runs over an iterator on
    // this stack, handed over through the thread's point_read.
    KeyIterator lookup(*this);
    point_read = &lookup;
    MemTableRep::Get(key, arg, callback);
    point_read = nullptr;
  }

  void MarkReadOnly() override { read_only_.store(true, std::memory_order_release); }

  // The buckets and entries are in the arena, which RocksDB counts. The
  // sorted copy of a read-only memtable (16 bytes an entry, while it is
  // flushed) is not: RocksDB requires a memtable's usage to stay what it
  // was when it became read-only.
  size_t ApproximateMemoryUsage() override { return 0; }

  Iterator* GetIterator(rocksdb::Arena* arena) override {
    std::shared_ptr<const SortedEntries> sorted = Sorted();
    if (arena == nullptr) return new OrderedIterator(std::move(sorted), compare_, nullptr);
    Shell* shell = SpareShell().release();
    return new (shell->bytes) OrderedIterator(std::move(sorted), compare_, shell);
  }

  Iterator* GetDynamicPrefixIterator(rocksdb::Arena* arena) override {
    if (arena == nullptr && point_read != nullptr) return std::exchange(point_read, nullptr);
    // Every key in order serves a seek within a prefix too.
    return GetIterator(arena);
  }

  // Calls visit(entry) for each entry of user_key, newest first.
  template <typename Visit>
  void ForEachOfKey(const Slice& user_key, Visit visit) const {
    for (Node* node = BucketOf(user_key).load(std::memory_order_acquire); node != nullptr;
         node = node->next.load(std::memory_order_acquire)) {
      if (UserKeyOfEntry(node->entry()) == user_key) visit(node->entry());
    }
  }

  const KeyComparator& compare() const { return compare_; }

 private:
  std::atomic<Node*>& BucketOf(const Slice& user_key) const {
    return buckets_[absl::Hash<absl::string_view>{}(
                        absl::string_view(user_key.data(), user_key.size())) &
                    mask_];
  }

  // A read-only memtable sorts once, for its flush and any reads after;
  // a live one sorts for each iterator (a scan of the tier, rare).
  std::shared_ptr<const SortedEntries> Sorted() {
    if (!read_only_.load(std::memory_order_acquire)) return Sort();
    absl::MutexLock lock(&mu_);
    if (sorted_ == nullptr) sorted_ = Sort();
    return sorted_;
  }

  std::shared_ptr<const SortedEntries> Sort() const {
    auto sorted = std::make_shared<SortedEntries>();
    sorted->reserve(entries_.load(std::memory_order_relaxed));
    for (size_t b = 0; b <= mask_; ++b) {
      for (Node* node = buckets_[b].load(std::memory_order_acquire); node != nullptr;
           node = node->next.load(std::memory_order_acquire)) {
        sorted->push_back({HeadOf(UserKeyOfEntry(node->entry())), node->entry()});
      }
    }
    std::sort(sorted->begin(), sorted->end(), [&](const SortedEntry& a, const SortedEntry& b) {
      if (a.head != b.head) return a.head < b.head;
      return compare_(a.entry, b.entry) < 0;
    });
    return sorted;
  }

  const KeyComparator& compare_;
  const size_t mask_;
  std::atomic<Node*>* buckets_ = nullptr;
  std::atomic<size_t> entries_{0};
  std::atomic<bool> read_only_{false};
  absl::Mutex mu_;
  std::shared_ptr<const SortedEntries> sorted_ ABSL_GUARDED_BY(mu_);
};

void KeyIterator::Collect(const Slice& internal_key) {
  entries_.clear();
  table_.ForEachOfKey(UserKeyOf(internal_key),
                      [&](const char* entry) { entries_.push_back(entry); });
  // Newest first is already the comparator's order (the sequence number
  // descending); sorting the one or two entries of a key keeps the order
  // from resting on that.
  std::sort(entries_.begin(), entries_.end(),
            [&](const char* a, const char* b) { return table_.compare()(a, b) < 0; });
}

void KeyIterator::Seek(const Slice& internal_key, const char* /*memtable_key*/) {
  Collect(internal_key);
  at_ = 0;
  while (at_ < entries_.size() && table_.compare()(entries_[at_], internal_key) < 0) ++at_;
}

void KeyIterator::SeekForPrev(const Slice& internal_key, const char* /*memtable_key*/) {
  Collect(internal_key);
  size_t after = 0;
  while (after < entries_.size() && table_.compare()(entries_[after], internal_key) <= 0) ++after;
  at_ = after == 0 ? entries_.size() : after - 1;
}

class RowMemtableFactory : public rocksdb::MemTableRepFactory {
 public:
  explicit RowMemtableFactory(size_t buckets) : buckets_(buckets) {}

  using MemTableRepFactory::CreateMemTableRep;
  MemTableRep* CreateMemTableRep(const KeyComparator& compare, rocksdb::Allocator* allocator,
                                 const rocksdb::SliceTransform* /*prefix*/,
                                 rocksdb::Logger* /*logger*/) override {
    return new RowMemtable(compare, allocator, buckets_);
  }
  const char* Name() const override { return "PstRowMemtable"; }
  bool IsInsertConcurrentlySupported() const override { return false; }

 private:
  const size_t buckets_;
};

}  // namespace

std::shared_ptr<rocksdb::MemTableRepFactory> NewRowMemtableFactory(size_t buckets) {
  return std::make_shared<RowMemtableFactory>(buckets);
}

}  // namespace pst
