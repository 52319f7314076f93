// TensorBoard event files, read back record by record: every length and
// data checksum verified, every Event decoded.
#include "worker/report/event_writer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "event.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::StartsWith;

uint64_t LittleEndian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

// The records of a TFRecord file; fails the test on a bad checksum or a
// truncated record.
std::vector<std::string> ReadRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) {
      ADD_FAILURE() << "truncated header at byte " << at;
      break;
    }
    const uint64_t length = LittleEndian(bytes, at, 8);
    EXPECT_EQ(LittleEndian(bytes, at + 8, 4), MaskCrc(Crc32c(bytes.substr(at, 8))))
        << "length checksum at byte " << at;
    if (bytes.size() - at - 12 < length + 4) {
      ADD_FAILURE() << "truncated record at byte " << at;
      break;
    }
    std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(LittleEndian(bytes, at + 12 + length, 4), MaskCrc(Crc32c(data)))
        << "data checksum at byte " << at;
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

TEST(Crc32cTest, MatchesTheStandardCheckValues) {
  // The CRC-32C check value (RFC 3720, B.4) and its empty-input value.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  // TFRecord's mask: rotate right by 15, add a constant.
  EXPECT_EQ(MaskCrc(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc(0x00008000u), 0xa282ead9u);
}

TEST(EventWriterTest, WritesAFileTensorBoardReads) {
  const std::string logdir = absl::StrCat(::testing::TempDir(), "/event_writer_test.", getpid());
  std::filesystem::remove_all(logdir);
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Open(logdir);
    ASSERT_TRUE(writer.ok()) << writer.status();
    path = (*writer)->path();
    ASSERT_TRUE((*writer)->AddScalar("train/loss", 100, 0.75f).ok());
    ASSERT_TRUE((*writer)->AddScalar("test/accuracy", 468, 0.8125f).ok());
    ASSERT_TRUE((*writer)->AddScalar("train/loss", 200, 0.5f).ok());
  }
  EXPECT_THAT(std::filesystem::path(path).filename().string(),
              StartsWith("events.out.tfevents."));
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(logdir));

  std::vector<std::string> records = ReadRecords(path);
  ASSERT_EQ(records.size(), 4u);
  tensorboard::Event first;
  ASSERT_TRUE(first.ParseFromString(records[0]));
  EXPECT_EQ(first.file_version(), "brain.Event:2");
  EXPECT_GT(first.wall_time(), 1.6e9);

  struct Expected {
    const char* tag;
    int64_t step;
    float value;
  };
  const Expected expected[] = {{"train/loss", 100, 0.75f}, {"test/accuracy", 468, 0.8125f},
                               {"train/loss", 200, 0.5f}};
  for (size_t i = 0; i < 3; ++i) {
    tensorboard::Event event;
    ASSERT_TRUE(event.ParseFromString(records[i + 1]));
    ASSERT_TRUE(event.has_summary());
    ASSERT_EQ(event.summary().value_size(), 1);
    EXPECT_EQ(event.step(), expected[i].step);
    EXPECT_EQ(event.summary().value(0).tag(), expected[i].tag);
    EXPECT_EQ(event.summary().value(0).simple_value(), expected[i].value);
    EXPECT_GE(event.wall_time(), first.wall_time());
  }
  std::filesystem::remove_all(logdir);
}

TEST(EventWriterTest, AnUnwritableLogdirIsAnErrorNamingIt) {
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Open("/proc/no/such/dir");
  ASSERT_FALSE(writer.ok());
  EXPECT_TRUE(absl::StrContains(writer.status().message(), "/proc/no/such/dir"))
      << writer.status();
}

}  // namespace PST_FILE_ID
}  // namespace pst
