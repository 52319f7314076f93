// The curves page: axis ticks, one line per worker and run, the run record
// kept beside the page.
#include "pslaunch/report.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(NiceTicksTest, RoundStepsCoverTheRange) {
  struct Case {
    double lo, hi;
    int count;
    std::vector<double> ticks;
    double min_step = 0;
  };
  const Case cases[] = {
      {0, 10, 5, {0, 2, 4, 6, 8, 10}},
      {0.31, 0.89, 5, {0.4, 0.6, 0.8}},
      {0.31, 0.89, 8, {0.4, 0.5, 0.6, 0.7, 0.8}},
      {0, 7020, 6, {0, 2000, 4000, 6000}},
      {1, 15, 6, {5, 10, 15}},
      {1, 3, 6, {1, 2, 3}, 1.0},  // epochs: whole numbers only
  };
  for (const Case& c : cases) {
    std::vector<double> ticks = NiceTicks(c.lo, c.hi, c.count, c.min_step);
    ASSERT_EQ(ticks.size(), c.ticks.size()) << c.lo << ".." << c.hi;
    for (size_t i = 0; i < ticks.size(); ++i) EXPECT_NEAR(ticks[i], c.ticks[i], 1e-9);
  }
}

RunRecord FakeRun(const std::string& mode, double accuracy) {
  RunSummary summary;
  summary.set_mode(mode);
  summary.set_workers(2);
  summary.set_epochs(2);
  summary.set_steps(200);
  summary.set_test_accuracy(accuracy);
  std::vector<WorkerResult> workers(2);
  for (int w = 0; w < 2; ++w) {
    workers[w].set_task(absl::StrCat("worker:", w));
    for (int i = 1; i <= 4; ++i) {
      CurvePoint* p = workers[w].add_curve();
      p->set_step(50 * i);
      p->set_seconds(i);
      p->set_loss(1.0 / i);
      p->set_samples_per_sec(1000);
    }
  }
  for (int epoch = 1; epoch <= 2; ++epoch) {
    EvalPoint* e = workers[0].add_evals();
    e->set_epoch(epoch);
    e->set_has_test_accuracy(true);
    e->set_test_accuracy(accuracy - 0.1 / epoch);
  }
  return MakeRunRecord(summary, workers);
}

TEST(ReportTest, OnePageDrawsEveryWorkerOfEveryRun) {
  const std::string page = RenderReport({FakeRun("sync", 0.85), FakeRun("async", 0.83)});
  EXPECT_THAT(page, HasSubstr("<title>pstrain run: sync, 2 workers vs async, 2 workers</title>"));
  for (const char* name : {"sync, 2 workers · worker:0", "sync, 2 workers · worker:1",
                           "async, 2 workers · worker:0", "async, 2 workers · worker:1"}) {
    EXPECT_THAT(page, HasSubstr(name));
  }
  EXPECT_THAT(page, HasSubstr("Test accuracy after each epoch"));
  EXPECT_THAT(page, HasSubstr("<td>0.8500</td>"));
  // Self-contained: no script, nothing fetched.
  EXPECT_THAT(page, Not(HasSubstr("<script")));
  EXPECT_THAT(page, Not(HasSubstr("src=")));
  // Four curve charts with 4 lines each, and one accuracy chart with 2.
  size_t polylines = 0;
  for (size_t at = 0; (at = page.find("<polyline", at)) != std::string::npos; ++at) ++polylines;
  EXPECT_EQ(polylines, 4u * 4u + 2u);
}

TEST(ReportTest, LabelsAndTextAreEscaped) {
  RunRecord run = FakeRun("sync", 0.8);
  run.set_label("<b>&");
  EXPECT_THAT(RenderReport({run}), HasSubstr("&lt;b&gt;&amp;"));
  EXPECT_THAT(RenderReport({run}), Not(HasSubstr("<b>&")));
}

TEST(ReportTest, RecordRoundTripsThroughJsonBesideThePage) {
  EXPECT_EQ(RecordPathFor("out/run.html"), "out/run.json");
  EXPECT_EQ(RecordPathFor("report"), "report.json");
  const std::string path = absl::StrCat(::testing::TempDir(), "/report_test.", getpid(), ".json");
  RunRecord run = FakeRun("async", 0.81);
  ASSERT_TRUE(WriteRunRecord(run, path).ok());
  absl::StatusOr<RunRecord> back = ReadRunRecord(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->label(), "async, 2 workers");
  EXPECT_EQ(back->workers_size(), 2);
  EXPECT_EQ(back->workers(1).curve_size(), 4);
  EXPECT_DOUBLE_EQ(back->workers(0).evals(1).test_accuracy(), 0.81 - 0.05);
  std::filesystem::remove(path);
}

TEST(ReportTest, TheRecordWritesCountsAsJsonNumbers) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/report_test_numbers.", getpid());
  RunRecord run = FakeRun("sync", 0.8);
  run.mutable_summary()->set_steps(468);
  run.mutable_workers(0)->set_final_version(-3);
  run.set_label("a label with \"steps\":\"12\" in it");
  ASSERT_TRUE(WriteRunRecord(run, path).ok());
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(json, HasSubstr("\"steps\":468"));
  EXPECT_THAT(json, HasSubstr("\"step\":50"));
  EXPECT_THAT(json, HasSubstr("\"final_version\":-3"));
  EXPECT_THAT(json, Not(HasSubstr("\"steps\":\"")));
  absl::StatusOr<RunRecord> back = ReadRunRecord(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->summary().steps(), 468);
  EXPECT_EQ(back->label(), run.label());  // a string value is left as it was
  std::filesystem::remove(path);
}

TEST(ReportTest, TheAccuracyAxisEndsAtOne) {
  // One epoch: one point, which alone used to spread the axis over 0.2..1.2.
  const std::vector<Series> one_epoch = {{"sync", "#000", "", {{1, 0.7}}}};
  EXPECT_THAT(LineChart("accuracy", "epoch", "test accuracy", one_epoch, true, false),
              HasSubstr(">1.2<"));
  const std::string chart = LineChart("accuracy", "epoch", "test accuracy", one_epoch, true, true);
  EXPECT_THAT(chart, Not(HasSubstr(">1.2<")));
  EXPECT_THAT(chart, Not(HasSubstr(">1.1<")));
  EXPECT_THAT(chart, HasSubstr(">1<"));
  RunRecord run = FakeRun("sync", 0.7);
  run.mutable_workers(0)->mutable_evals()->DeleteSubrange(1, 1);
  EXPECT_THAT(RenderReport({run}), Not(HasSubstr(">1.2<")));
}

TEST(ReportTest, ThePageShowsTheTrainingSettingsAndDefinesTheFinalLoss) {
  TrainingConfig training;
  training.mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
  training.set_batch_size(64);
  EXPECT_EQ(DescribeTraining(training), "adam lr 0.001, batch 64");
  RunSummary summary;
  summary.set_mode("sync");
  summary.set_workers(2);
  const RunRecord run = MakeRunRecord(summary, {}, DescribeTraining(training));
  EXPECT_EQ(run.label(), "sync, 2 workers, adam lr 0.001, batch 64");
  const std::string page = RenderReport({run});
  EXPECT_THAT(page, HasSubstr("<td>sync, 2 workers, adam lr 0.001, batch 64</td>"));
  EXPECT_THAT(page, HasSubstr("final loss*"));
  EXPECT_THAT(page, HasSubstr(kFinalLoss));
}

TEST(ReportTest, AScriptsRunIsLabelledByItsCommandNotTheConfigsOptimizer) {
  JobConfig config;
  config.mutable_training()->mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
  config.mutable_training()->set_batch_size(64);
  EXPECT_EQ(DescribeJob(config), "adam lr 0.001, batch 64");
  config.mutable_cluster()->set_worker_command("python3 train.py --lr=0.1");
  EXPECT_EQ(DescribeJob(config), "python3 train.py --lr=0.1");
  config.mutable_cluster()->set_worker_command("python3 " + std::string(100, 'x') + ".py");
  const std::string cut = DescribeJob(config);
  EXPECT_EQ(cut.size(), kMaxCommandInLabel);
  EXPECT_EQ(cut.substr(0, 10), "python3 xx");
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
}

TEST(ReportTest, ASpeedNoWorkerCountedIsNotAvailableNotZero) {
  RunSummary summary;
  summary.set_mode("sync");
  summary.set_workers(1);
  summary.set_steps(5);
  summary.set_train_samples_per_sec(std::numeric_limits<double>::quiet_NaN());
  const std::string page = RenderReport({MakeRunRecord(summary, {})});
  EXPECT_THAT(page, HasSubstr("<td>5</td><td>n/a</td><td>0.0000</td><td>0</td><td>n/a</td>"));
}

TEST(ReportTest, TwoRunsOfOneLabelAreToldApart) {
  std::vector<RunRecord> runs = {FakeRun("sync", 0.8), FakeRun("sync", 0.7), FakeRun("async", 0.7)};
  MakeLabelsDistinct(runs, {"lr1/run.json", "lr2/other.json", "async.json"});
  EXPECT_EQ(runs[0].label(), "sync, 2 workers (run.json)");
  EXPECT_EQ(runs[1].label(), "sync, 2 workers (other.json)");
  EXPECT_EQ(runs[2].label(), "async, 2 workers");  // already its own
  runs = {FakeRun("sync", 0.8), FakeRun("sync", 0.7)};
  MakeLabelsDistinct(runs, {"a/run.json", "b/run.json"});
  EXPECT_EQ(runs[0].label(), "sync, 2 workers (run.json) #1");
  EXPECT_EQ(runs[1].label(), "sync, 2 workers (run.json) #2");
}

TEST(ReportTest, AMissingOrForeignRecordIsNamed) {
  EXPECT_EQ(ReadRunRecord("/no/such/run.json").status().code(), absl::StatusCode::kNotFound);
  const std::string path = absl::StrCat(::testing::TempDir(), "/report_test_bad.", getpid());
  ASSERT_TRUE(WriteTextFile(path, "{\"summary\": 12}").ok());
  absl::StatusOr<RunRecord> bad = ReadRunRecord(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(path));
  std::filesystem::remove(path);
}

}  // namespace PST_FILE_ID
}  // namespace pst
