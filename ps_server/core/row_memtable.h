// The memtable of the disk tier's RocksDB databases: where a tier's
// writes land before RocksDB flushes them to a sorted file.
//
// A demotion writes rows of ids spread over the whole key range, in the
// shard's update, and a flush then needs them in key order. RocksDB's
// skip list pays for the order on every insert (a search of its levels,
// a cache miss each, under the shard's lock); its hash link list inserts
// into a hash bucket but sorts at the flush by building a skip list of
// every entry, which was a sixth of the machine in the tiered CTR job.
// This memtable inserts as the hash link list does (one bucket, by the
// whole user key) and sorts as a vector: entries ordered by their user
// key's first eight bytes as an integer, the full comparator only where
// those tie (the same id twice, or longer keys).
//
// Contract, as every RocksDB memtable: one writer (the database runs
// with allow_concurrent_memtable_write off) and any number of concurrent
// readers; a point read sees every entry inserted before it; an iterator
// sees the entries inserted before it was made, in the comparator's
// order. It requires RocksDB's default bytewise comparator, which the
// integer order of the first eight bytes agrees with.
#ifndef PST_PS_SERVER_CORE_ROW_MEMTABLE_H_
#define PST_PS_SERVER_CORE_ROW_MEMTABLE_H_

#include <cstddef>
#include <memory>

namespace rocksdb {
class MemTableRepFactory;
}

namespace pst {

// A factory of such memtables, each with `buckets` hash buckets (a power
// of two), 8 bytes each, allocated in the memtable's own arena.
std::shared_ptr<rocksdb::MemTableRepFactory> NewRowMemtableFactory(size_t buckets);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ROW_MEMTABLE_H_
