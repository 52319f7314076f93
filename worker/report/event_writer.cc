#include "worker/report/event_writer.h"

#include <unistd.h>

#include <array>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "event.pb.h"

namespace pst {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78;
constexpr uint32_t kMaskDelta = 0xa282ead8;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kCastagnoliReflected : 0);
    table[i] = crc;
  }
  return table;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t crc = 0xFFFFFFFF;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFF;
}

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Open(const std::string& logdir) {
  std::error_code error;
  std::filesystem::create_directories(logdir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create --logdir ", logdir, ": ", error.message()));
  }
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  std::string path = absl::StrCat(logdir, "/events.out.tfevents.",
                                  static_cast<int64_t>(now), ".", HostName());
  // Never through a link another user put in --logdir under this name.
  absl::StatusOr<int> fd = OpenForAppend(path);
  std::FILE* file = fd.ok() ? fdopen(*fd, "ab") : nullptr;
  if (file == nullptr) {
    if (fd.ok()) close(*fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot write the event file ", path, fd.ok() ? "" : absl::StrCat(": ", fd.status().message())));
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(file, path));
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  PST_RETURN_IF_ERROR(writer->WriteRecord(version.SerializeAsString()));
  return writer;
}

EventWriter::~EventWriter() { std::fclose(file_); }

absl::Status EventWriter::AddScalar(const std::string& tag, int64_t step, float value) {
  tensorboard::Event event;
  event.set_wall_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  event.set_step(step);
  tensorboard::Summary::Value* point = event.mutable_summary()->add_value();
  point->set_tag(tag);
  point->set_simple_value(value);
  return WriteRecord(event.SerializeAsString());
}

absl::Status EventWriter::WriteRecord(const std::string& data) {
  std::string record;
  AppendLittleEndian(data.size(), 8, &record);
  AppendLittleEndian(MaskCrc(Crc32c(record)), 4, &record);
  record += data;
  AppendLittleEndian(MaskCrc(Crc32c(data)), 4, &record);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write the event file ", path_));
  }
  return absl::OkStatus();
}

}  // namespace pst
