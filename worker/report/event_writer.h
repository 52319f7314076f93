// Writes TensorBoard event files: TFRecord framing of tensorflow.Event
// protos (proto/event.proto), so `tensorboard --logdir DIR` shows the
// scalars as curves.
//
// A record is: uint64 length (little-endian), uint32 masked CRC32C of those
// 8 bytes, the serialized Event, uint32 masked CRC32C of it. The first
// record of a file holds file_version "brain.Event:2"; the file is named
// events.out.tfevents.<unix seconds>.<hostname>, as TensorFlow names its own.
#ifndef PST_WORKER_REPORT_EVENT_WRITER_H_
#define PST_WORKER_REPORT_EVENT_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pst {

// CRC32C (Castagnoli), and the masked form TFRecord stores.
uint32_t Crc32c(std::string_view data);
uint32_t MaskCrc(uint32_t crc);

class EventWriter {
 public:
  // Creates `logdir` if needed and opens a new event file in it.
  // Unavailable, naming the path, when it cannot.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Open(const std::string& logdir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One scalar point of the curve `tag` ("train/loss"), flushed at once so
  // TensorBoard sees it while training runs.
  absl::Status AddScalar(const std::string& tag, int64_t step, float value);

  const std::string& path() const { return path_; }

 private:
  EventWriter(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  absl::Status WriteRecord(const std::string& data);

  std::FILE* file_;
  std::string path_;
};

}  // namespace pst

#endif  // PST_WORKER_REPORT_EVENT_WRITER_H_
