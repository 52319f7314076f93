#include "common/npz.h"

#include <zlib.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pst {
namespace {

constexpr uint64_t kZipLimit = std::numeric_limits<uint32_t>::max();

void Put(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint32_t Crc32(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < bytes.size();) {
    const size_t piece = std::min<size_t>(bytes.size() - at, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(piece));
    at += piece;
  }
  return static_cast<uint32_t>(crc);
}

// A zip member's header fields after its signature and versions: flags,
// method (0: stored), time and date (1980-01-01 00:00), crc and sizes.
void PutMemberFields(uint32_t crc, uint64_t size, size_t name_bytes, std::string* out) {
  Put(0, 2, out);       // flags
  Put(0, 2, out);       // stored
  Put(0, 2, out);       // time
  Put(0x21, 2, out);    // date
  Put(crc, 4, out);
  Put(size, 4, out);    // compressed
  Put(size, 4, out);    // uncompressed
  Put(name_bytes, 2, out);
  Put(0, 2, out);       // extra field
}

}  // namespace

NpzArray Float32Array(std::string name, std::vector<int64_t> shape, std::span<const float> values) {
  NpzArray a{std::move(name), NpzArray::DType::kFloat32, std::move(shape), {}};
  a.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return a;
}

NpzArray Int64Array(std::string name, std::vector<int64_t> shape, std::span<const int64_t> values) {
  NpzArray a{std::move(name), NpzArray::DType::kInt64, std::move(shape), {}};
  a.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return a;
}

std::string NpyFile(const NpzArray& array) {
  static_assert(std::endian::native == std::endian::little, "arrays are written as held");
  std::string shape = absl::StrCat("(", absl::StrJoin(array.shape, ", "),
                                   array.shape.size() == 1 ? ",)" : ")");
  std::string header = absl::StrCat(
      "{'descr': '", array.dtype == NpzArray::DType::kFloat32 ? "<f4" : "<i8",
      "', 'fortran_order': False, 'shape': ", shape, ", }");
  // magic (6) + version (2) + header length (2) + header + '\n', to 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  Put(header.size(), 2, &out);
  out += header;
  out += array.data;
  return out;
}

absl::Status WriteNpz(const std::string& path, const std::vector<NpzArray>& arrays) {
  std::set<std::string> names;
  for (const NpzArray& a : arrays) {
    if (!names.insert(a.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("two arrays are named \"", a.name, "\""));
    }
    const size_t element = a.dtype == NpzArray::DType::kFloat32 ? 4 : 8;
    if (a.data.size() != static_cast<size_t>(Elements(a.shape)) * element) {
      return absl::InvalidArgumentError(absl::StrCat("array \"", a.name, "\" holds ",
                                                     a.data.size(), " bytes, not its shape's"));
    }
  }
  const std::string temporary = absl::StrCat(path, ".tmp");
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", temporary));
  std::string directory;
  uint64_t offset = 0;
  for (const NpzArray& a : arrays) {
    const std::string name = absl::StrCat(a.name, ".npy");
    const std::string file = NpyFile(a);
    if (file.size() >= kZipLimit || offset >= kZipLimit) {
      out.close();
      std::remove(temporary.c_str());
      return absl::InvalidArgumentError(absl::StrCat(
          "array \"", a.name, "\" would pass 4 GiB into the .npz, more than a zip without ZIP64 "
          "holds"));
    }
    const uint32_t crc = Crc32(file);
    std::string local;
    Put(0x04034b50, 4, &local);
    Put(20, 2, &local);  // version needed: 2.0
    PutMemberFields(crc, file.size(), name.size(), &local);
    local += name;
    out.write(local.data(), static_cast<std::streamsize>(local.size()));
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    Put(0x02014b50, 4, &directory);
    Put(20, 2, &directory);  // made by
    Put(20, 2, &directory);  // needed
    PutMemberFields(crc, file.size(), name.size(), &directory);
    Put(0, 2, &directory);  // comment
    Put(0, 2, &directory);  // disk
    Put(0, 2, &directory);  // internal attributes
    Put(0, 4, &directory);  // external attributes
    Put(offset, 4, &directory);
    directory += name;
    offset += local.size() + file.size();
  }
  if (offset + directory.size() >= kZipLimit || arrays.size() > 0xffff) {
    out.close();
    std::remove(temporary.c_str());
    return absl::InvalidArgumentError(
        "the model would pass 4 GiB or 65535 arrays, more than a zip without ZIP64 holds");
  }
  std::string end;
  Put(0x06054b50, 4, &end);
  Put(0, 2, &end);
  Put(0, 2, &end);
  Put(arrays.size(), 2, &end);
  Put(arrays.size(), 2, &end);
  Put(directory.size(), 4, &end);
  Put(offset, 4, &end);
  Put(0, 2, &end);
  out.write(directory.data(), static_cast<std::streamsize>(directory.size()));
  out.write(end.data(), static_cast<std::streamsize>(end.size()));
  out.close();
  if (!out) {
    std::remove(temporary.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", temporary, " (disk full?)"));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", temporary, " to ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace pst
