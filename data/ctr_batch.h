// A batch of click-through-rate examples as the readers produce them and
// the CTR model consumes them: a 0/1 label, dense features, and for every
// categorical field a bag of (id, value) pairs (one id for Criteo's
// single-valued fields, any number for a multi-valued one).
#ifndef PST_DATA_CTR_BATCH_H_
#define PST_DATA_CTR_BATCH_H_

#include <cstdint>
#include <vector>

namespace pst {

struct CtrBatch {
  int num_fields = 0;  // categorical fields (bags) per example
  int dense_dim = 0;   // dense features per example
  std::vector<float> labels;  // [size], 0 or 1
  std::vector<float> dense;   // [size, dense_dim]
  // Bag b = example * num_fields + field holds ids[offsets[b], offsets[b+1])
  // with their values; an empty bag is a missing field.
  std::vector<int32_t> offsets = {0};  // [size * num_fields + 1]
  std::vector<uint64_t> ids;
  std::vector<float> values;

  CtrBatch() = default;
  CtrBatch(int fields, int dense_features) : num_fields(fields), dense_dim(dense_features) {}

  int size() const { return static_cast<int>(labels.size()); }
  // Empties the batch, keeping its shape and its memory.
  void Clear() {
    labels.clear();
    dense.clear();
    offsets.assign(1, 0);
    ids.clear();
    values.clear();
  }
  // Takes back an example appended in part (a line that failed to parse).
  void Truncate(int examples) {
    labels.resize(examples);
    dense.resize(static_cast<size_t>(examples) * dense_dim);
    offsets.resize(static_cast<size_t>(examples) * num_fields + 1);
    ids.resize(offsets.back());
    values.resize(offsets.back());
  }
};

// The 64-bit id of categorical `value` in `field`: a SplitMix64 finalizer
// of both, so equal values of different fields are different rows of one
// table, and the ids spread evenly whatever the values look like.
inline uint64_t CategoricalId(int field, uint64_t value) {
  uint64_t z = value + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(field + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace pst

#endif  // PST_DATA_CTR_BATCH_H_
