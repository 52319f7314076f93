// Files written whole (from one string or streamed in parts) and never
// through a link: a folder another user can write to (a shared --logdir or
// --result_dir) cannot redirect a write.
#include "common/durable_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  std::string dir = FreshScratchDir(name);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(DurableFileTest, WritesWholeAndReplacesTheOldContents) {
  const std::string dir = FreshDir("durable_whole");
  ASSERT_TRUE(WriteFileDurably(dir + "/report.json", "first").ok());
  ASSERT_TRUE(WriteFileDurably(dir + "/report.json", "second").ok());
  EXPECT_EQ(Contents(dir + "/report.json"), "second");
  EXPECT_FALSE(std::filesystem::exists(dir + "/report.json.tmp"));
}

// Streamed: appended in parts, a header written in at the end; a writer
// that fails leaves neither the file nor its temporary one.
TEST(DurableFileTest, StreamedContentsLandWholeOrNotAtAll) {
  const std::string dir = FreshDir("durable_stream");
  const std::string path = dir + "/ckpt.bin";
  ASSERT_TRUE(WriteFileDurably(path, [](DurableFileWriter& file) -> absl::Status {
                if (absl::Status s = file.Append("count=?;"); !s.ok()) return s;
                for (const char* part : {"one;", "two;"}) {
                  if (absl::Status s = file.Append(part); !s.ok()) return s;
                }
                return file.WriteAt(6, "2");
              }).ok());
  EXPECT_EQ(Contents(path), "count=2;one;two;");

  const absl::Status failed = WriteFileDurably(dir + "/other.bin", [](DurableFileWriter& file) {
    file.Append("half of it").IgnoreError();
    return absl::InternalError("cannot serialize");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_FALSE(std::filesystem::exists(dir + "/other.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/other.bin.tmp"));
  EXPECT_EQ(Contents(path), "count=2;one;two;");
}

// Second hostile pass: another user's link named like the report (or like
// its temporary file) made pslaunch overwrite the link's target.
TEST(DurableFileTest, ALinkInTheFilesPlaceIsReplacedNotFollowed) {
  const std::string dir = FreshDir("durable_link");
  const std::string precious = dir + "/precious";
  std::ofstream(precious) << "keep me";
  std::filesystem::create_symlink(precious, dir + "/report.html");
  ASSERT_TRUE(WriteFileDurably(dir + "/report.html", "report").ok());
  EXPECT_EQ(Contents(precious), "keep me");
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/report.html"));
  EXPECT_EQ(Contents(dir + "/report.html"), "report");

  // A link, or a hard link, where the temporary file goes is removed, not
  // written through.
  std::filesystem::create_symlink(precious, dir + "/cluster.textproto.tmp");
  ASSERT_TRUE(WriteFileDurably(dir + "/cluster.textproto", "config").ok());
  std::filesystem::create_hard_link(precious, dir + "/cluster.textproto.tmp");
  ASSERT_TRUE(WriteFileDurably(dir + "/cluster.textproto", "config").ok());
  EXPECT_EQ(Contents(precious), "keep me");
  EXPECT_EQ(Contents(dir + "/cluster.textproto"), "config");
}

TEST(DurableFileTest, AppendingRefusesALinkAndAppendsToItsOwnFile) {
  const std::string dir = FreshDir("durable_append");
  const std::string precious = dir + "/precious";
  std::ofstream(precious) << "keep me";
  const std::string events = dir + "/events.out.tfevents.1.host";
  std::filesystem::create_symlink(precious, events);
  absl::StatusOr<int> refused = OpenForAppend(events);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(events));
  EXPECT_EQ(Contents(precious), "keep me");

  std::filesystem::remove(events);
  for (const char* text : {"a", "b"}) {
    absl::StatusOr<int> fd = OpenForAppend(events);
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_EQ(write(*fd, text, 1), 1);
    close(*fd);
  }
  EXPECT_EQ(Contents(events), "ab");
}

}  // namespace PST_FILE_ID
}  // namespace pst
