#include "pslaunch/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "common/durable_file.h"
#include "common/optimizer_config.h"
#include "google/protobuf/util/json_util.h"

namespace pst {
namespace {

// Geometry of a chart, in SVG user units.
constexpr int kPlotWidth = 600;
constexpr int kPlotHeight = 300;
constexpr int kLeft = 70;
constexpr int kTop = 36;
constexpr int kBottom = 50;
constexpr int kLegendWidth = 340;  // "sync, 2 workers, adam lr 0.001, batch 64 · worker:1"
constexpr int kLegendLine = 18;

// One color per run, one dash pattern per worker.
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr const char* kDashes[] = {"", "7 4", "2 3", "10 3 2 3"};

std::string Escape(const std::string& text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string TickLabel(double value) {
  if (value == 0) return "0";
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e5 || magnitude < 1e-3) return absl::StrFormat("%.0e", value);
  return absl::StrFormat("%g", value);
}

struct Range {
  double lo = 0, hi = 1;
};

Range RangeOf(const std::vector<Series>& series, bool x) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series) {
    for (const auto& [px, py] : s.points) {
      const double v = x ? px : py;
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!std::isfinite(lo)) return {0, 1};
  if (hi - lo < 1e-12) return {lo - 0.5, hi + 0.5};
  return {lo, hi};
}

std::string Axes(const Range& x, const Range& y, const std::vector<double>& xt,
                 const std::vector<double>& yt, const std::string& x_label,
                 const std::string& y_label) {
  auto sx = [&](double v) { return kLeft + (v - x.lo) / (x.hi - x.lo) * kPlotWidth; };
  auto sy = [&](double v) { return kTop + kPlotHeight - (v - y.lo) / (y.hi - y.lo) * kPlotHeight; };
  std::string out;
  for (double t : yt) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" class=\"tick\">%s</text>\n",
                          kLeft, sy(t), kLeft + kPlotWidth, sy(t), kLeft - 6, sy(t) + 4,
                          TickLabel(t));
  }
  for (double t : xt) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>"
                          "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" class=\"tick\">%s</text>\n",
                          sx(t), kTop, sx(t), kTop + kPlotHeight, sx(t),
                          kTop + kPlotHeight + 16, TickLabel(t));
  }
  absl::StrAppendFormat(&out,
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                        "stroke=\"#888\"/>\n",
                        kLeft, kTop, kPlotWidth, kPlotHeight);
  absl::StrAppendFormat(&out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" class=\"label\">%s</text>\n",
                        kLeft + kPlotWidth / 2, kTop + kPlotHeight + 38, Escape(x_label));
  absl::StrAppendFormat(&out,
                        "<text transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\" "
                        "class=\"label\">%s</text>\n",
                        kTop + kPlotHeight / 2, Escape(y_label));
  return out;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int count, double min_step) {
  if (!(hi > lo) || count < 1) return {lo};
  const double raw = (hi - lo) / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  step = std::max(step, min_step);
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string LineChart(const std::string& title, const std::string& x_label,
                      const std::string& y_label, const std::vector<Series>& series,
                      bool integer_x, bool fraction_y) {
  Range x = RangeOf(series, true);
  Range y = RangeOf(series, false);
  if (fraction_y) y = {std::max(y.lo, 0.0), std::min(y.hi, 1.0)};
  const std::vector<double> xt = NiceTicks(x.lo, x.hi, 6, integer_x ? 1.0 : 0.0);
  const std::vector<double> yt = NiceTicks(y.lo, y.hi, 5);
  // Widen the ranges to the outer ticks, so the grid frames the data.
  x = {std::min(x.lo, xt.front()), std::max(x.hi, xt.back())};
  y = {std::min(y.lo, yt.front()), std::max(y.hi, yt.back())};
  auto sx = [&](double v) { return kLeft + (v - x.lo) / (x.hi - x.lo) * kPlotWidth; };
  auto sy = [&](double v) { return kTop + kPlotHeight - (v - y.lo) / (y.hi - y.lo) * kPlotHeight; };

  const int width = kLeft + kPlotWidth + 20 + kLegendWidth;
  const int height = std::max(kTop + kPlotHeight + kBottom,
                              kTop + static_cast<int>(series.size()) * kLegendLine + 10);
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
      "<text x=\"%d\" y=\"22\" class=\"title\">%s</text>\n",
      width, height, width, height, kLeft, Escape(title));
  out += Axes(x, y, xt, yt, x_label, y_label);
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    std::string points;
    for (const auto& [px, py] : s.points) {
      if (std::isfinite(px) && std::isfinite(py)) {
        absl::StrAppendFormat(&points, "%.1f,%.1f ", sx(px), sy(py));
      }
    }
    const std::string dash = s.dash.empty() ? "" : absl::StrCat(" stroke-dasharray=\"", s.dash, "\"");
    absl::StrAppendFormat(&out,
                          "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                          points, s.color, dash);
    if (s.points.size() <= 30) {  // few points: mark each one
      for (const auto& [px, py] : s.points) {
        if (!std::isfinite(px) || !std::isfinite(py)) continue;
        absl::StrAppendFormat(&out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                              sx(px), sy(py), s.color);
      }
    }
    const int ly = kTop + 8 + static_cast<int>(i) * kLegendLine;
    const int lx = kLeft + kPlotWidth + 20;
    absl::StrAppendFormat(&out,
                          "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/><text x=\"%d\" y=\"%d\" class=\"legend\">%s</text>\n",
                          lx, ly, lx + 28, ly, s.color, dash, lx + 34, ly + 4, Escape(s.name));
  }
  out += "</svg>\n";
  return out;
}

std::string DescribeTraining(const TrainingConfig& training) {
  absl::StatusOr<OptimizerSettings> optimizer = ResolveOptimizerConfig(training.optimizer());
  if (!optimizer.ok()) return absl::StrCat("batch ", training.batch_size());
  const char* rule = "sgd";
  switch (optimizer->rule) {
    case OptimizerSettings::Rule::kSgd: rule = "sgd"; break;
    case OptimizerSettings::Rule::kMomentum: rule = "momentum"; break;
    case OptimizerSettings::Rule::kNesterov: rule = "nesterov"; break;
    case OptimizerSettings::Rule::kAdam: rule = "adam"; break;
    case OptimizerSettings::Rule::kAdamW: rule = "adamw"; break;
    case OptimizerSettings::Rule::kAdagrad: rule = "adagrad"; break;
    case OptimizerSettings::Rule::kFtrl: rule = "ftrl"; break;
  }
  return absl::StrFormat("%s lr %g, batch %d", rule, optimizer->learning_rate,
                         training.batch_size());
}

std::string DescribeJob(const JobConfig& config) {
  const std::string& command = config.cluster().worker_command();
  if (command.empty()) return DescribeTraining(config.training());
  if (command.size() <= kMaxCommandInLabel) return command;
  return absl::StrCat(command.substr(0, kMaxCommandInLabel - 3), "...");
}

RunRecord MakeRunRecord(const RunSummary& summary, std::vector<WorkerResult> workers,
                        const std::string& training) {
  RunRecord record;
  record.set_label(absl::StrCat(summary.mode(), ", ", summary.workers(),
                                summary.workers() == 1 ? " worker" : " workers",
                                training.empty() ? "" : ", ", training));
  *record.mutable_summary() = summary;
  for (WorkerResult& w : workers) *record.add_workers() = std::move(w);
  return record;
}

namespace {

// Series of `y` against `x` for every worker of every run.
template <typename X, typename Y>
std::vector<Series> WorkerSeries(const std::vector<RunRecord>& runs, X x, Y y) {
  std::vector<Series> series;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (int w = 0; w < runs[r].workers_size(); ++w) {
      const WorkerResult& worker = runs[r].workers(w);
      Series s{absl::StrCat(runs[r].label(), " · ", worker.task()), kColors[r % 8],
               kDashes[w % 4], {}};
      for (const CurvePoint& p : worker.curve()) s.points.emplace_back(x(p), y(p));
      series.push_back(std::move(s));
    }
  }
  return series;
}

std::vector<Series> EvalSeries(const std::vector<RunRecord>& runs, bool accuracy) {
  std::vector<Series> series;
  for (size_t r = 0; r < runs.size(); ++r) {
    Series s{runs[r].label(), kColors[r % 8], "", {}};
    for (const WorkerResult& worker : runs[r].workers()) {
      for (const EvalPoint& p : worker.evals()) {
        s.points.emplace_back(p.epoch(), accuracy ? p.test_accuracy() : p.test_loss());
      }
    }
    series.push_back(std::move(s));
  }
  return series;
}

// `value` in `format`, or "n/a" where the run did not tell it (NaN).
std::string OrNotAvailable(double value, const absl::FormatSpec<double>& format) {
  return std::isfinite(value) ? absl::StrFormat(format, value) : "n/a";
}

std::string SummaryTable(const std::vector<RunRecord>& runs) {
  std::string out =
      "<table><tr><th>run</th><th>steps</th><th>epochs</th><th>test accuracy</th>"
      "<th>final loss*</th><th>samples/s</th><th>wall s</th></tr>\n";
  for (const RunRecord& run : runs) {
    const RunSummary& s = run.summary();
    absl::StrAppendFormat(&out,
                          "<tr><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%.4g</td>"
                          "<td>%s</td><td>%.1f</td></tr>\n",
                          Escape(run.label()), s.steps(),
                          s.epochs() > 0 ? absl::StrCat(s.epochs()) : "n/a",
                          OrNotAvailable(s.test_accuracy(), "%.4f"), s.final_loss(),
                          OrNotAvailable(s.train_samples_per_sec(), "%.0f"), s.wall_seconds());
  }
  return out + "</table>\n<p>* final loss: " + std::string(kFinalLoss) + ".</p>\n";
}

// The names of the 64-bit integer fields of `message` and of the messages in it.
void Int64FieldNames(const google::protobuf::Descriptor* message, std::set<std::string>& names) {
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = message->field(i);
    switch (field->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
        names.insert(field->name());
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE:
        if (field->message_type() != message) Int64FieldNames(field->message_type(), names);
        break;
      default:
        break;
    }
  }
}

// `json` with every "name":"<integer>" written "name":<integer>. A key inside
// a string value is escaped (\"name\":) and so never matches.
std::string UnquoteIntegers(const std::string& json, const std::string& name) {
  const std::string key = absl::StrCat("\"", name, "\":\"");
  std::string out;
  size_t from = 0;
  for (size_t at; (at = json.find(key, from)) != std::string::npos;) {
    const size_t begin = at + key.size();
    const size_t end = json.find('"', begin);
    if (end == std::string::npos) break;
    const std::string value = json.substr(begin, end - begin);
    const bool integer = !value.empty() &&
                         value.find_first_not_of("0123456789", value[0] == '-' ? 1 : 0) ==
                             std::string::npos && value != "-";
    if (integer) {
      absl::StrAppend(&out, json.substr(from, begin - 1 - from), value);
      from = end + 1;
    } else {
      absl::StrAppend(&out, json.substr(from, begin - from));
      from = begin;
    }
  }
  return out + json.substr(from);
}

bool AnyAccuracy(const std::vector<RunRecord>& runs) {
  for (const RunRecord& run : runs) {
    for (const WorkerResult& w : run.workers()) {
      for (const EvalPoint& p : w.evals()) {
        if (p.has_test_accuracy()) return true;
      }
    }
  }
  return false;
}

}  // namespace

std::string RenderReport(const std::vector<RunRecord>& runs) {
  std::string title = "pstrain run";
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StrAppend(&title, i == 0 ? ": " : " vs ", runs[i].label());
  }
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", Escape(title),
      "</title>\n<style>\n"
      "body{font-family:sans-serif;margin:24px;color:#222}\n"
      "table{border-collapse:collapse;margin-bottom:16px}\n"
      "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}\n"
      "td:first-child,th:first-child{text-align:left}\n"
      ".title{font-size:15px;font-weight:bold}.tick{font-size:11px;fill:#555}\n"
      ".label{font-size:12px}.legend{font-size:12px}\n"
      "</style></head><body>\n<h1>", Escape(title), "</h1>\n");
  out += SummaryTable(runs);
  out += "<p>Solid line: worker:0 (the chief); dashed: the other workers. Each point is the "
         "mean over one progress window (training.log_every_steps).</p>\n";
  const bool accuracy = AnyAccuracy(runs);
  out += LineChart(accuracy ? "Test accuracy after each epoch (chief)" : "Test loss after each epoch (chief)",
                   "epoch", accuracy ? "test accuracy" : "test loss", EvalSeries(runs, accuracy),
                   /*integer_x=*/true, /*fraction_y=*/accuracy);
  out += LineChart("Training loss over time", "seconds since the worker started", "training loss",
                   WorkerSeries(runs, [](const CurvePoint& p) { return p.seconds(); },
                                [](const CurvePoint& p) { return p.loss(); }));
  out += LineChart("Training loss per step", "steps of this worker", "training loss",
                   WorkerSeries(runs, [](const CurvePoint& p) { return double(p.step()); },
                                [](const CurvePoint& p) { return p.loss(); }));
  out += LineChart("Throughput", "seconds since the worker started", "samples/s",
                   WorkerSeries(runs, [](const CurvePoint& p) { return p.seconds(); },
                                [](const CurvePoint& p) { return p.samples_per_sec(); }));
  out += LineChart("Staleness of the gradients (shard 0)", "steps of this worker",
                   "mean staleness (versions)",
                   WorkerSeries(runs, [](const CurvePoint& p) { return double(p.step()); },
                                [](const CurvePoint& p) { return p.staleness(); }));
  out += "</body></html>\n";
  return out;
}

std::string RecordPathFor(const std::string& report_path) {
  if (absl::EndsWith(report_path, ".html")) {
    return absl::StrCat(report_path.substr(0, report_path.size() - 5), ".json");
  }
  return absl::StrCat(report_path, ".json");
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  // Whole, and never through a link another user put in the folder.
  return WriteFileDurably(path, text);
}

void MakeLabelsDistinct(std::vector<RunRecord>& runs, const std::vector<std::string>& sources) {
  std::map<std::string, int> count;
  for (const RunRecord& run : runs) ++count[run.label()];
  for (size_t i = 0; i < runs.size() && i < sources.size(); ++i) {
    if (count[runs[i].label()] > 1) {
      runs[i].set_label(absl::StrCat(runs[i].label(), " (",
                                     std::filesystem::path(sources[i]).filename().string(), ")"));
    }
  }
  // Records of one name from different folders: number them.
  count.clear();
  for (const RunRecord& run : runs) ++count[run.label()];
  std::map<std::string, int> seen;
  for (RunRecord& run : runs) {
    if (count[run.label()] > 1) {
      run.set_label(absl::StrCat(run.label(), " #", ++seen[run.label()]));
    }
  }
}

absl::Status WriteRunRecord(const RunRecord& record, const std::string& path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(record, &json, options).ok()) {
    return absl::InternalError("cannot serialize the run record");
  }
  // Proto3's JSON quotes 64-bit integers ("steps":"468"); a record is read
  // by people and scripts, and its counts are far below 2^53: numbers.
  std::set<std::string> int64_fields;
  Int64FieldNames(RunRecord::descriptor(), int64_fields);
  for (const std::string& name : int64_fields) json = UnquoteIntegers(json, name);
  return WriteTextFile(path, json + "\n");
}

absl::StatusOr<RunRecord> ReadRunRecord(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("run record ", path, " does not exist"));
  std::stringstream text;
  text << in.rdbuf();
  RunRecord record;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (auto status = google::protobuf::util::JsonStringToMessage(text.str(), &record, options);
      !status.ok()) {
    std::string reason(status.message().substr(0, status.message().find('\n')));
    return absl::DataLossError(absl::StrCat(
        path, " is not a run record written by pslaunch --report: ", reason));
  }
  return record;
}

}  // namespace pst
