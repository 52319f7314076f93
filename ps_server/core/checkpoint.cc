#include "ps_server/core/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/durable_file.h"
#include "common/little_endian.h"
#include "common/proto_fields.h"
#include "common/status_macros.h"
#include "ps_server/core/checkpoint_delta.h"

namespace pst {

static_assert(kCrc32PieceBytes <= std::numeric_limits<uInt>::max(),
              "a piece's length must fit zlib's 32-bit uInt");

uint32_t PayloadCrc32(std::string_view payload, size_t max_piece_bytes) {
  const size_t piece_bytes =
      std::clamp<size_t>(max_piece_bytes, 1, std::numeric_limits<uInt>::max());
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!payload.empty()) {
    const size_t piece = std::min(payload.size(), piece_bytes);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(piece));
    payload.remove_prefix(piece);
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// The former form: one payload.
constexpr char kMagic[8] = {'P', 'S', 'T', 'C', 'K', 'P', 'T', '1'};
constexpr size_t kHeaderBytes = sizeof(kMagic) + 8 + 4;
// Pieces: the count after the magic, then a length and a CRC-32 before each.
constexpr char kPiecesMagic[8] = {'P', 'S', 'T', 'C', 'K', 'P', 'T', '2'};
constexpr size_t kPiecesHeaderBytes = sizeof(kPiecesMagic) + 8;
constexpr size_t kPieceHeaderBytes = 8 + 4;
// protobuf parses no message of 2 GiB or more.
constexpr uint64_t kMaxMessageBytes = std::numeric_limits<int32_t>::max();

// A field of a table's rows (or its removed ids) and its bytes per unit:
// per row, or the field whole where it does not divide into rows.
struct RowFields {
  const std::string* field;
  size_t row_bytes;
};
constexpr size_t kIdBytes = sizeof(uint64_t);
// An embedding table's fields that hold its rows and removed ids, and a
// checkpoint's that holds its tables.
constexpr std::array<std::string_view, 5> kRowFields = {"ids", "values", "slots", "row_updates",
                                                        "removed_ids"};
constexpr std::array<std::string_view, 1> kTablesField = {"embeddings"};

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status ForEachCheckpointPiece(const ShardCheckpoint& checkpoint, size_t max_piece_bytes,
                                    absl::FunctionRef<absl::Status(const ShardCheckpoint&)> write) {
  max_piece_bytes = std::max<size_t>(max_piece_bytes, 1);
  {
    // Copied field by field: a copy whole, then cleared, would hold every
    // row twice for a moment.
    ShardCheckpoint first;
    CopyAllFieldsBut(checkpoint, kTablesField, &first);
    for (const ShardCheckpoint::Embedding& table : checkpoint.embeddings()) {
      CopyAllFieldsBut(table, kRowFields, first.add_embeddings());
    }
    PST_RETURN_IF_ERROR(write(first));
  }
  ShardCheckpoint piece;
  size_t piece_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (piece.embeddings_size() == 0) return absl::OkStatus();
    absl::Status status = write(piece);
    piece.Clear();
    piece_bytes = 0;
    return status;
  };
  // Table t of the piece, with empty ones before it.
  auto table_in_piece = [&](int t) {
    while (piece.embeddings_size() <= t) piece.add_embeddings();
    return piece.mutable_embeddings(t);
  };
  // Appends rows [from, from + count) of `fields` to the piece's table t.
  auto take = [&](int t, const std::vector<RowFields>& fields,
                  const std::vector<std::string* (*)(ShardCheckpoint::Embedding*)>& into,
                  size_t from, size_t count) {
    ShardCheckpoint::Embedding* table = table_in_piece(t);
    for (size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].row_bytes == 0) continue;
      into[f](table)->append(*fields[f].field, from * fields[f].row_bytes,
                             count * fields[f].row_bytes);
    }
  };
  // Runs of rows: each fills the piece up to max_piece_bytes.
  auto split = [&](int t, const std::vector<RowFields>& fields,
                   const std::vector<std::string* (*)(ShardCheckpoint::Embedding*)>& into,
                   size_t rows) -> absl::Status {
    size_t row_bytes = 0;
    for (const RowFields& f : fields) row_bytes += f.row_bytes;
    for (size_t done = 0; done < rows;) {
      if (piece_bytes >= max_piece_bytes) PST_RETURN_IF_ERROR(flush());
      const size_t room = std::max<size_t>((max_piece_bytes - piece_bytes) / row_bytes, 1);
      const size_t count = std::min(rows - done, room);
      take(t, fields, into, done, count);
      piece_bytes += count * row_bytes;
      done += count;
    }
    return absl::OkStatus();
  };
  const std::vector<std::string* (*)(ShardCheckpoint::Embedding*)> row_fields = {
      [](ShardCheckpoint::Embedding* e) { return e->mutable_ids(); },
      [](ShardCheckpoint::Embedding* e) { return e->mutable_values(); },
      [](ShardCheckpoint::Embedding* e) { return e->mutable_slots(); },
      [](ShardCheckpoint::Embedding* e) { return e->mutable_row_updates(); }};
  const std::vector<std::string* (*)(ShardCheckpoint::Embedding*)> removed_field = {
      [](ShardCheckpoint::Embedding* e) { return e->mutable_removed_ids(); }};
  // A table's fields (or its removed ids) in `units` runs of equal bytes:
  // its rows, or one unit where they do not divide into rows as a shard
  // writes them (whole, for Restore to refuse).
  auto split_fields = [&](int t, const std::vector<const std::string*>& fields,
                          const std::vector<std::string* (*)(ShardCheckpoint::Embedding*)>& into,
                          size_t rows, bool divides) -> absl::Status {
    const size_t units = divides ? rows : 1;
    if (units == 0) return absl::OkStatus();
    std::vector<RowFields> per_unit;
    for (const std::string* field : fields) per_unit.push_back({field, field->size() / units});
    return split(t, per_unit, into, units);
  };
  for (int t = 0; t < checkpoint.embeddings_size(); ++t) {
    const ShardCheckpoint::Embedding& table = checkpoint.embeddings(t);
    const size_t rows = table.ids().size() / kIdBytes;
    const std::vector<const std::string*> fields = {&table.ids(), &table.values(), &table.slots(),
                                                    &table.row_updates()};
    bool divides = table.ids().size() % kIdBytes == 0;
    for (const std::string* field : fields) {
      divides = divides && (rows == 0 ? field->empty() : field->size() % rows == 0);
    }
    PST_RETURN_IF_ERROR(split_fields(t, fields, row_fields, rows, divides));
    const std::string& removed = table.removed_ids();
    PST_RETURN_IF_ERROR(split_fields(t, {&removed}, removed_field, removed.size() / kIdBytes,
                                     removed.size() % kIdBytes == 0));
  }
  return flush();
}

absl::Status MergeCheckpointPiece(ShardCheckpoint* whole, const ShardCheckpoint& piece) {
  if (piece.embeddings_size() > whole->embeddings_size()) {
    return absl::InvalidArgumentError(absl::StrCat("a piece holds rows of ",
                                                   piece.embeddings_size(), " tables; there are ",
                                                   whole->embeddings_size()));
  }
  for (int t = 0; t < piece.embeddings_size(); ++t) {
    ShardCheckpoint::Embedding rest;
    CopyAllFieldsBut(piece.embeddings(t), kRowFields, &rest);
    if (rest.ByteSizeLong() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("a piece holds more than rows of table ", t));
    }
    const ShardCheckpoint::Embedding& from = piece.embeddings(t);
    ShardCheckpoint::Embedding* to = whole->mutable_embeddings(t);
    to->mutable_ids()->append(from.ids());
    to->mutable_values()->append(from.values());
    to->mutable_slots()->append(from.slots());
    to->mutable_row_updates()->append(from.row_updates());
    to->mutable_removed_ids()->append(from.removed_ids());
  }
  ShardCheckpoint rest;
  CopyAllFieldsBut(piece, kTablesField, &rest);
  if (rest.ByteSizeLong() != 0) {
    return absl::InvalidArgumentError("a piece holds more than embedding rows");
  }
  return absl::OkStatus();
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    // Anything named like a checkpoint is listed, whatever its type, so
    // that ReadCheckpoint can name a FIFO or a directory in its place
    // instead of the PS starting over silently.
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 9 &&
        name.compare(name.size() - 4, 4, ".bin") == 0) {
      files.push_back(entry.path().string());
    }
  }
  // Versions are zero-padded, so the names sort like the versions.
  std::sort(files.rbegin(), files.rend());
  return files;
}

int RemoveTemporaryFiles(const std::string& dir) {
  int removed = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        std::filesystem::remove(entry.path(), error)) {
      ++removed;
    }
  }
  return removed;
}

std::optional<CheckpointName> ParseCheckpointName(std::string_view file_name) {
  absl::string_view name(file_name.data(), file_name.size());
  CheckpointName parsed;
  if (!absl::ConsumePrefix(&name, "ckpt-") || !absl::ConsumeSuffix(&name, ".bin")) {
    return std::nullopt;
  }
  const size_t dot = name.find('.');
  if (!absl::SimpleAtoi(name.substr(0, dot), &parsed.version) || parsed.version < 0) {
    return std::nullopt;
  }
  if (dot == absl::string_view::npos) return parsed;
  absl::string_view parent = name.substr(dot);
  if (!absl::ConsumePrefix(&parent, ".delta-") ||
      !absl::SimpleAtoi(parent, &parsed.parent_version) || parsed.parent_version < 0 ||
      parsed.parent_version >= parsed.version) {
    return std::nullopt;
  }
  parsed.delta = true;
  return parsed;
}

namespace {

std::string CheckpointPath(const std::string& dir, const ShardCheckpoint& checkpoint) {
  if (!checkpoint.delta()) return absl::StrFormat("%s/ckpt-%015d.bin", dir, checkpoint.version());
  return absl::StrFormat("%s/ckpt-%015d.delta-%015d.bin", dir, checkpoint.version(),
                         checkpoint.parent_version());
}

std::string FileName(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// After `written` landed: removes the other file of its version, then
// every file but the newest `keep`, `written`, and the links their chains
// go back through.
void PruneCheckpoints(const std::string& dir, const std::string& written, int64_t version,
                      int keep) {
  std::error_code error;
  for (const std::string& file : ListCheckpoints(dir)) {
    const std::optional<CheckpointName> name = ParseCheckpointName(FileName(file));
    if (file != written && name && name->version == version) std::filesystem::remove(file, error);
  }
  const std::vector<std::string> files = ListCheckpoints(dir);
  std::map<int64_t, std::vector<std::string>> by_version;
  for (const std::string& file : files) {
    if (auto name = ParseCheckpointName(FileName(file))) by_version[name->version].push_back(file);
  }
  std::set<std::string> kept = {written};
  for (size_t i = 0; i < files.size() && i < static_cast<size_t>(std::max(keep, 1)); ++i) {
    kept.insert(files[i]);
  }
  std::vector<std::string> to_follow(kept.begin(), kept.end());
  while (!to_follow.empty()) {
    const std::optional<CheckpointName> name = ParseCheckpointName(FileName(to_follow.back()));
    to_follow.pop_back();
    if (!name || !name->delta) continue;
    for (const std::string& parent : by_version[name->parent_version]) {
      if (kept.insert(parent).second) to_follow.push_back(parent);
    }
  }
  for (const std::string& file : files) {
    if (!kept.contains(file)) std::filesystem::remove(file, error);
  }
}

}  // namespace

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const ShardCheckpoint& checkpoint, int keep,
                                            size_t max_piece_bytes) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create checkpoint directory ", dir, ": ", error.message()));
  }
  const std::string path = CheckpointPath(dir, checkpoint);
  // Streamed into the file a piece at a time: the file's bytes are never
  // in memory whole beside the state.
  std::string buffer;
  // The model is the job's, not every local user's: owner-only, whatever
  // the umask lets a new file be.
  PST_RETURN_IF_ERROR(WriteFileDurably(
      path,
      [&](DurableFileWriter& file) -> absl::Status {
        std::string header(kPiecesMagic, sizeof(kPiecesMagic));
        header.append(8, '\0');  // the count, written in at the end
        PST_RETURN_IF_ERROR(file.Append(header));
        uint64_t pieces = 0;
        PST_RETURN_IF_ERROR(ForEachCheckpointPiece(
            checkpoint, max_piece_bytes, [&](const ShardCheckpoint& piece) -> absl::Status {
              // Serialized straight behind its header, whose length and
              // checksum are filled in after.
              buffer.assign(kPieceHeaderBytes, '\0');
              if (!piece.AppendToString(&buffer)) {
                return absl::InternalError(
                    absl::StrCat("cannot serialize piece ", pieces, " of the shard checkpoint (",
                                 piece.ByteSizeLong(), " bytes; protobuf's limit is 2 GiB)"));
              }
              const std::string_view bytes = std::string_view(buffer).substr(kPieceHeaderBytes);
              std::string piece_header;
              AppendLittleEndian(bytes.size(), 8, &piece_header);
              AppendLittleEndian(PayloadCrc32(bytes), 4, &piece_header);
              std::memcpy(buffer.data(), piece_header.data(), kPieceHeaderBytes);
              ++pieces;
              return file.Append(buffer);
            }));
        std::string count;
        AppendLittleEndian(pieces, 8, &count);
        return file.WriteAt(sizeof(kPiecesMagic), count);
      },
      0600));
  PruneCheckpoints(dir, path, checkpoint.version(), keep);
  return path;
}

namespace {

// Reads exactly `bytes` at `offset`; false on a short read (a file that
// shrank) or an error (errno set).
bool ReadAt(int fd, uint64_t offset, size_t bytes, char* into) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd, into + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A file of pieces, `size` bytes long, its magic checked. Every length is
// checked against what the file holds before anything is allocated for
// it, so a forged length costs nothing.
// `head_only`: piece 0 alone (the checkpoint without its rows), the
// rest of the file neither read nor verified.
absl::StatusOr<ShardCheckpoint> ReadPieces(int fd, uint64_t size, const std::string& path,
                                           bool head_only) {
  char header[kPiecesHeaderBytes];
  if (size < kPiecesHeaderBytes || !ReadAt(fd, 0, kPiecesHeaderBytes, header)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is torn: no piece count"));
  }
  const uint64_t count = ReadLittleEndian(header + sizeof(kPiecesMagic), 8);
  if (count == 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " holds no piece"));
  }
  ShardCheckpoint checkpoint;
  std::string bytes;
  uint64_t at = kPiecesHeaderBytes;
  for (uint64_t i = 0; i < count; ++i) {
    char piece_header[kPieceHeaderBytes];
    if (size - at < kPieceHeaderBytes || !ReadAt(fd, at, kPieceHeaderBytes, piece_header)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " is torn: piece ", i, " of ", count, " is missing"));
    }
    at += kPieceHeaderBytes;
    const uint64_t length = ReadLittleEndian(piece_header, 8);
    const uint32_t crc = static_cast<uint32_t>(ReadLittleEndian(piece_header + 8, 4));
    if (length > kMaxMessageBytes) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, ": piece ", i, " claims ",
                                              length, " bytes, more than a checkpoint holds"));
    }
    if (length > size - at) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " is torn: piece ", i, " of ",
                                              count, " has ", size - at, " of ", length, " bytes"));
    }
    bytes.resize(length);
    errno = 0;
    if (!ReadAt(fd, at, length, bytes.data())) {
      if (errno != 0) return Errno("cannot read checkpoint", path);
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " is torn: it shrank"));
    }
    at += length;
    if (PayloadCrc32(bytes) != crc) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " fails its checksum (piece ", i, ")"));
    }
    ShardCheckpoint piece;
    if (!(i == 0 ? checkpoint : piece).ParseFromString(bytes)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " does not parse (piece ", i, ")"));
    }
    if (i == 0 && head_only) return checkpoint;
    if (i == 0) continue;
    if (absl::Status merged = MergeCheckpointPiece(&checkpoint, piece); !merged.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", merged.message()));
    }
  }
  if (at != size) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " has ", size - at, " bytes past its last piece"));
  }
  return checkpoint;
}

absl::StatusOr<ShardCheckpoint> ReadCheckpointFile(const std::string& path, bool head_only) {
  // O_NONBLOCK: opening a FIFO put in a checkpoint's place must not wait
  // for a writer; the type check below refuses it. It changes nothing for
  // a regular file.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path, ": ",
                                                      std::strerror(errno)));
  absl::Cleanup close_fd = [fd] { close(fd); };
  struct stat status;
  if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is not a regular file"));
  }
  char magic[sizeof(kPiecesMagic)];
  if (static_cast<size_t>(status.st_size) >= sizeof(magic) &&
      pread(fd, magic, sizeof(magic), 0) == static_cast<ssize_t>(sizeof(magic)) &&
      std::memcmp(magic, kPiecesMagic, sizeof(magic)) == 0) {
    return ReadPieces(fd, static_cast<uint64_t>(status.st_size), path, head_only);
  }
  // The former form. The header first: a file whose header is not a checkpoint's, or that
  // claims more than a checkpoint can hold (protobuf parses at most 2 GiB),
  // is refused before its size is allocated (a sparse file of any size
  // costs nothing to make).
  char header[kHeaderBytes];
  if (static_cast<size_t>(status.st_size) < kHeaderBytes ||
      pread(fd, header, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes) ||
      std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " has no valid header"));
  }
  const uint64_t claimed = ReadLittleEndian(header + sizeof(kMagic), 8);
  if (claimed > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " claims ", claimed,
                                            " payload bytes, more than a checkpoint holds"));
  }
  if (static_cast<uint64_t>(status.st_size) > kHeaderBytes + claimed) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " has ",
                                            status.st_size - kHeaderBytes - claimed,
                                            " bytes past its payload"));
  }
  std::string contents(static_cast<size_t>(status.st_size), '\0');
  size_t read_bytes = 0;
  while (read_bytes < contents.size()) {
    const ssize_t n = pread(fd, contents.data() + read_bytes, contents.size() - read_bytes,
                            static_cast<off_t>(read_bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read checkpoint", path);
    if (n == 0) break;  // shrank meanwhile: found torn below
    read_bytes += static_cast<size_t>(n);
  }
  contents.resize(read_bytes);
  if (contents.size() < kHeaderBytes || std::memcmp(contents.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " has no valid header"));
  }
  const uint64_t length = ReadLittleEndian(contents.data() + sizeof(kMagic), 8);
  const uint32_t crc =
      static_cast<uint32_t>(ReadLittleEndian(contents.data() + sizeof(kMagic) + 8, 4));
  if (contents.size() - kHeaderBytes != length) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is torn: ",
                                            contents.size() - kHeaderBytes, " of ", length,
                                            " payload bytes"));
  }
  const std::string payload = contents.substr(kHeaderBytes);
  if (PayloadCrc32(payload) != crc) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " fails its checksum"));
  }
  ShardCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(payload)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " does not parse"));
  }
  return checkpoint;
}

}  // namespace

absl::StatusOr<ShardCheckpoint> ReadCheckpoint(const std::string& path) {
  return ReadCheckpointFile(path, /*head_only=*/false);
}

absl::StatusOr<ShardCheckpoint> ReadCheckpointHead(const std::string& path) {
  return ReadCheckpointFile(path, /*head_only=*/true);
}

namespace {

// `path`'s checkpoint with its chain applied. DataLoss naming the link
// that does not verify, is missing or does not fit.
absl::StatusOr<ShardCheckpoint> ReadChain(const std::string& dir, const std::string& path,
                                          const std::vector<std::string>& files) {
  std::vector<ShardCheckpoint> deltas;  // newest first
  std::string link = path;
  while (true) {
    absl::StatusOr<ShardCheckpoint> checkpoint = ReadCheckpoint(link);
    if (!checkpoint.ok()) return checkpoint.status();
    const std::optional<CheckpointName> name = ParseCheckpointName(FileName(link));
    const bool named_delta = name && name->delta;
    if (checkpoint->delta() != named_delta) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", link, " holds a ", checkpoint->delta() ? "delta" : "full checkpoint",
          " under the name of a ", named_delta ? "delta" : "full checkpoint"));
    }
    if (!deltas.empty()) {
      const ShardCheckpoint& child = deltas.back();
      if (checkpoint->version() != child.parent_version() ||
          checkpoint->run_id() != child.run_id() ||
          checkpoint->config_hash() != child.config_hash()) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", link, " (version ", checkpoint->version(), ", run \"",
                         checkpoint->run_id(), "\") is not the parent its delta at version ",
                         child.version(), " names"));
      }
    }
    if (!checkpoint->delta()) {
      ShardCheckpoint state = *std::move(checkpoint);
      for (auto delta = deltas.rbegin(); delta != deltas.rend(); ++delta) {
        absl::StatusOr<ShardCheckpoint> next = ApplyDelta(std::move(state), std::move(*delta));
        if (!next.ok()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", path, ": ", next.status().message()));
        }
        state = *std::move(next);
      }
      return state;
    }
    if (checkpoint->version() != name->version ||
        checkpoint->parent_version() != name->parent_version ||
        checkpoint->base_version() > checkpoint->parent_version()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", link, " holds the delta at version ", checkpoint->version(),
                       " over ", checkpoint->parent_version(), ", not the one its name says"));
    }
    // The parent: the full checkpoint at the chain's base, else the
    // delta at its version.
    const int64_t parent = checkpoint->parent_version();
    const bool parent_is_full = parent == checkpoint->base_version();
    deltas.push_back(*std::move(checkpoint));
    link.clear();
    for (const std::string& file : files) {
      const std::optional<CheckpointName> candidate = ParseCheckpointName(FileName(file));
      if (candidate && candidate->version == parent && candidate->delta != parent_is_full) {
        link = file;
      }
    }
    if (link.empty()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " is a delta whose chain needs the ",
                       parent_is_full ? "full checkpoint" : "delta", " at version ", parent,
                       ", which ", dir, " does not hold"));
    }
  }
}

}  // namespace

absl::StatusOr<ShardCheckpoint> ReadNewestValidCheckpoint(const std::string& dir,
                                                          std::vector<std::string>* rejected) {
  const std::vector<std::string> files = ListCheckpoints(dir);
  for (const std::string& path : files) {
    absl::StatusOr<ShardCheckpoint> checkpoint = ReadChain(dir, path, files);
    if (checkpoint.ok()) return checkpoint;
    std::string reason(checkpoint.status().message());
    if (reason.find(path) == std::string::npos) {
      reason =
          absl::StrCat("checkpoint ", path, " is a delta whose chain does not restore: ", reason);
    }
    rejected->push_back(std::move(reason));
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint in ", dir));
}

}  // namespace pst
