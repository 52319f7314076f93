// The click-data readers: both formats, plain and gzip, split by worker,
// and malformed lines failing with file and line or skipped and counted.
#include "data/ctr_reader.h"

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CtrReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("ctr_reader_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    if (name.ends_with(".gz")) {
      gzFile f = gzopen(path.c_str(), "wb");
      gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
      gzclose(f);
    } else {
      std::ofstream(path) << text;
    }
    return path;
  }

  std::filesystem::path dir_;
};

// A Criteo line: label, 13 integers, 26 hashes; `label` and the first
// integer and hash vary with `i`.
std::string CriteoLine(int i, bool with_missing = false) {
  std::vector<std::string> columns = {std::to_string(i % 2), std::to_string(i)};
  for (int j = 1; j < 13; ++j) columns.push_back(with_missing && j == 3 ? "" : "1");
  columns.push_back(absl::StrCat(absl::Hex(0xa0 + i, absl::kZeroPad8)));
  for (int f = 1; f < 26; ++f) columns.push_back(with_missing && f == 5 ? "" : "0000beef");
  return absl::StrJoin(columns, "\t");
}

std::string CriteoFile(int lines) {
  std::string text;
  for (int i = 0; i < lines; ++i) absl::StrAppend(&text, CriteoLine(i), "\n");
  return text;
}

absl::StatusOr<CtrBatch> ReadAll(const std::string& path, const CtrReaderOptions& options,
                                 int64_t* skipped = nullptr) {
  absl::StatusOr<std::unique_ptr<CtrReader>> reader = CtrReader::Open(path, options);
  if (!reader.ok()) return reader.status();
  CtrBatch batch = EmptyBatchFor(options.format);
  while (true) {
    absl::StatusOr<int> read = (*reader)->Read(3, &batch);
    if (!read.ok()) return read.status();
    if (*read == 0) break;
  }
  if (skipped != nullptr) *skipped = (*reader)->skipped();
  return batch;
}

TEST_F(CtrReaderTest, ReadsCriteoFieldsIdsAndLogScaledIntegers) {
  const std::string path = Write("a.tsv", CriteoLine(7, /*with_missing=*/true) + "\n");
  absl::StatusOr<CtrBatch> batch = ReadAll(path, {});
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 1);
  EXPECT_EQ(batch->labels[0], 1.0f);
  ASSERT_EQ(batch->dense.size(), 13u);
  EXPECT_FLOAT_EQ(batch->dense[0], std::log1p(7.0f));
  EXPECT_FLOAT_EQ(batch->dense[3], 0.0f);  // missing
  ASSERT_EQ(batch->offsets.size(), 27u);
  EXPECT_EQ(batch->ids.size(), 25u);  // field 5 is missing: an empty bag
  EXPECT_EQ(batch->offsets[6] - batch->offsets[5], 0);
  EXPECT_EQ(batch->ids[0], CategoricalId(0, 0xa7));
  EXPECT_EQ(batch->ids[1], CategoricalId(1, 0xbeef));
  EXPECT_NE(CategoricalId(1, 0xbeef), CategoricalId(2, 0xbeef));  // fields do not share rows
}

TEST_F(CtrReaderTest, GzipAndPlainFilesReadTheSame) {
  const std::string text = CriteoFile(1000);
  absl::StatusOr<CtrBatch> plain = ReadAll(Write("p.tsv", text), {});
  absl::StatusOr<CtrBatch> gzip = ReadAll(Write("g.tsv.gz", text), {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(gzip.ok()) << gzip.status();
  EXPECT_EQ(plain->size(), 1000);
  EXPECT_EQ(plain->ids, gzip->ids);
  EXPECT_EQ(plain->dense, gzip->dense);
  EXPECT_EQ(plain->labels, gzip->labels);
}

TEST_F(CtrReaderTest, WorkersSplitTheLinesDisjointlyAndCoverTheFile) {
  const std::string path = Write("s.tsv.gz", CriteoFile(103));
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    std::multiset<float> seen;  // dense[0] is the line number
    std::vector<int64_t> sizes;
    for (int w = 0; w < workers; ++w) {
      absl::StatusOr<CtrBatch> batch = ReadAll(path, {CtrFormat::kCriteo, w, workers});
      ASSERT_TRUE(batch.ok()) << batch.status();
      for (int e = 0; e < batch->size(); ++e) {
        const float line = std::expm1(batch->dense[static_cast<size_t>(e) * 13]);
        EXPECT_EQ(static_cast<int>(std::lround(line)) % workers, w);
        seen.insert(std::round(line));
      }
      sizes.push_back(batch->size());
    }
    EXPECT_EQ(seen.size(), 103u);
    EXPECT_EQ(std::set<float>(seen.begin(), seen.end()).size(), 103u);
    absl::StatusOr<std::vector<int64_t>> counted =
        CountShares(path, {CtrFormat::kCriteo, 0, workers});
    ASSERT_TRUE(counted.ok()) << counted.status();
    EXPECT_EQ(*counted, sizes);
  }
}

TEST_F(CtrReaderTest, ReadingAgainAfterRewindGivesTheSameExamples) {
  const std::string path = Write("r.tsv", CriteoFile(10));
  absl::StatusOr<std::unique_ptr<CtrReader>> reader = CtrReader::Open(path, {});
  ASSERT_TRUE(reader.ok());
  CtrBatch first = EmptyBatchFor(CtrFormat::kCriteo);
  CtrBatch second = EmptyBatchFor(CtrFormat::kCriteo);
  ASSERT_EQ(*(*reader)->Read(100, &first), 10);
  ASSERT_EQ(*(*reader)->Read(100, &first), 0);
  ASSERT_TRUE((*reader)->Rewind().ok());
  ASSERT_EQ(*(*reader)->Read(100, &second), 10);
  EXPECT_EQ(first.ids, second.ids);
}

TEST_F(CtrReaderTest, MalformedLinesNameFileAndLineOrAreSkippedAndCounted) {
  struct Case {
    std::string line;
    std::string reason;
  };
  std::string bad_hash = CriteoLine(1);
  bad_hash.replace(bad_hash.find("0000beef"), 8, "0000xyzw");
  std::string bad_int = CriteoLine(1);
  bad_int.replace(bad_int.find("\t1\t"), 3, "\t1.5\t");
  const Case cases[] = {
      {"1\t2\t3", "3 tab-separated columns, expected 40"},
      {absl::StrCat("2", CriteoLine(1).substr(1)), "label \"2\" is not 0 or 1"},
      {bad_hash, "categorical column 2 holds \"0000xyzw\""},
      {bad_int, "integer column 1 holds \"1.5\""},
      {"", "1 tab-separated columns"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    const std::string path =
        Write("m.tsv", absl::StrCat(CriteoLine(0), "\n", CriteoLine(1), "\n", c.line, "\n",
                                    CriteoLine(3), "\n"));
    absl::StatusOr<CtrBatch> failed = ReadAll(path, {});
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(failed.status().message(), HasSubstr(absl::StrCat(path, ":3: ", c.reason)));
    EXPECT_FALSE(CountShares(path, {}).ok());

    int64_t skipped = 0;
    CtrReaderOptions skip;
    skip.malformed = MalformedLines::kSkip;
    absl::StatusOr<CtrBatch> read = ReadAll(path, skip, &skipped);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->size(), 3);
    EXPECT_EQ(skipped, 1);
    EXPECT_EQ(read->offsets.size(), 3u * 26 + 1);  // no trace of the bad line
    EXPECT_THAT(*CountShares(path, skip), ElementsAre(3));
  }
}

// A malformed line belongs to one worker like any other line: only its
// owner stops (or skips and counts it); the others read their shares whole.
TEST_F(CtrReaderTest, AMalformedLineConcernsOnlyTheWorkerWhoseLineItIs) {
  const std::string path = Write(
      "w.tsv.gz", absl::StrCat(CriteoLine(0), "\n", CriteoLine(1), "\n", "1\t2\n",
                               CriteoLine(3), "\n", CriteoLine(4), "\n"));
  // Line 3 (index 2) is worker 0's of 2.
  absl::StatusOr<CtrBatch> owner = ReadAll(path, {CtrFormat::kCriteo, 0, 2});
  ASSERT_FALSE(owner.ok());
  EXPECT_THAT(owner.status().message(), HasSubstr(absl::StrCat(path, ":3: ")));
  absl::StatusOr<CtrBatch> other = ReadAll(path, {CtrFormat::kCriteo, 1, 2});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->size(), 2);
  int64_t skipped = 0;
  owner = ReadAll(path, {CtrFormat::kCriteo, 0, 2, MalformedLines::kSkip}, &skipped);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(owner->size(), 2);
  EXPECT_EQ(skipped, 1);
  EXPECT_THAT(*CountShares(path, {CtrFormat::kCriteo, 0, 2, MalformedLines::kSkip}),
              ElementsAre(2, 2));
}

// A file without newlines (binary data, a wrong path) does not grow the
// reader's buffer past LineReader::kMaxLineBytes: an error naming the file
// and line, in either mode, since no next line can be found to go on from.
TEST_F(CtrReaderTest, ALineOverTheLimitIsAnErrorNamingFileAndLineInEitherMode) {
  const std::string path =
      Write("long.tsv.gz", absl::StrCat(CriteoLine(0), "\n",
                                        std::string(LineReader::kMaxLineBytes + 10, 'x'), "\n",
                                        CriteoLine(2), "\n"));
  for (MalformedLines mode : {MalformedLines::kFail, MalformedLines::kSkip}) {
    absl::StatusOr<CtrBatch> read = ReadAll(path, {CtrFormat::kCriteo, 0, 1, mode});
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(), HasSubstr(absl::StrCat(path, ":2")));
    EXPECT_THAT(read.status().message(), HasSubstr("longer than"));
  }
}

TEST_F(CtrReaderTest, ATruncatedGzipFileIsAnErrorNamingIt) {
  const std::string path = Write("t.tsv.gz", CriteoFile(2000));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  absl::StatusOr<CtrBatch> read = ReadAll(path, {});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("truncated"));
}

TEST_F(CtrReaderTest, AMissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<CtrReader>> reader =
      CtrReader::Open((dir_ / "absent.tsv").string(), {});
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("absent.tsv"));
}

TEST_F(CtrReaderTest, ReadsLibsvmAsOneMultiValuedField) {
  const std::string path =
      Write("l.svm.gz", "+1 3:0.5 17:2 # a comment\n-1 qid:4 5:1\n0\n1 9:1e-1\r\n");
  CtrReaderOptions options;
  options.format = CtrFormat::kLibsvm;
  absl::StatusOr<CtrBatch> batch = ReadAll(path, options);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->labels, ElementsAre(1.0f, 0.0f, 0.0f, 1.0f));
  EXPECT_THAT(batch->offsets, ElementsAre(0, 2, 3, 3, 4));
  EXPECT_THAT(batch->ids, ElementsAre(3u, 17u, 5u, 9u));
  EXPECT_THAT(batch->values, ElementsAre(0.5f, 2.0f, 1.0f, 0.1f));
  EXPECT_TRUE(batch->dense.empty());
}

TEST_F(CtrReaderTest, MalformedLibsvmLinesAreNamed) {
  CtrReaderOptions options;
  options.format = CtrFormat::kLibsvm;
  for (const char* line : {"1 3:x", "1 3", "yes 3:1", "1 -3:1", "1 3:nan"}) {
    SCOPED_TRACE(line);
    const std::string path = Write("b.svm", absl::StrCat("1 1:1\n", line, "\n"));
    absl::StatusOr<CtrBatch> batch = ReadAll(path, options);
    ASSERT_FALSE(batch.ok());
    EXPECT_THAT(batch.status().message(), HasSubstr(absl::StrCat(path, ":2: ")));
    options.malformed = MalformedLines::kSkip;
    int64_t skipped = 0;
    batch = ReadAll(path, options, &skipped);
    ASSERT_TRUE(batch.ok());
    EXPECT_EQ(skipped, 1);
    EXPECT_THAT(batch->ids, ElementsAre(1u));
    options.malformed = MalformedLines::kFail;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
