// Fixed-width little-endian integers in byte strings: the framing of
// checkpoint files, of a replica update's parts and of TensorBoard records.
#ifndef PST_COMMON_LITTLE_ENDIAN_H_
#define PST_COMMON_LITTLE_ENDIAN_H_

#include <cstdint>
#include <string>

namespace pst {

// Appends the low `bytes` bytes of `value`, least significant first.
inline void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The `bytes`-byte value at `in`, least significant byte first.
inline uint64_t ReadLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

}  // namespace pst

#endif  // PST_COMMON_LITTLE_ENDIAN_H_
