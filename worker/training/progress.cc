#include "worker/training/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

constexpr int kBarWidth = 24;
constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);

}  // namespace

Progress::Progress(bool live, int64_t steps_total, std::string devices)
    : live_(live), steps_total_(steps_total), devices_(std::move(devices)), start_(absl::Now()) {}

bool Progress::IsTerminal() { return isatty(STDOUT_FILENO) == 1; }

std::string Progress::FormatEta(absl::Duration eta) {
  int64_t seconds = absl::ToInt64Seconds(eta);
  if (seconds >= 3600) return absl::StrFormat("%dh%02dm", seconds / 3600, seconds % 3600 / 60);
  if (seconds >= 60) return absl::StrFormat("%dm%02ds", seconds / 60, seconds % 60);
  return absl::StrFormat("%ds", seconds);
}

std::string Progress::Line(const ProgressPoint& p, int64_t steps_done) const {
  std::string eta = "?";
  if (steps_done > 0) {
    const absl::Duration per_step = (absl::Now() - start_) / static_cast<double>(steps_done);
    eta = FormatEta(per_step * static_cast<double>(steps_total_ - steps_done));
  }
  return absl::StrFormat(
      "epoch %d/%d step %d/%d loss %.4f samples/s %.0f on %s version %d eta %s", p.epoch + 1,
      p.epochs, p.step, p.steps, p.loss, p.samples_per_sec, devices_, p.version, eta);
}

void Progress::Report(const ProgressPoint& point, int64_t steps_done) {
  if (!live_) {
    spdlog::info("{}", Line(point, steps_done));
    return;
  }
  const absl::Time now = absl::Now();
  if (now - last_draw_ < kRedrawInterval && steps_done < steps_total_) return;
  last_draw_ = now;
  const int filled = static_cast<int>(kBarWidth * steps_done / std::max<int64_t>(1, steps_total_));
  std::string bar(filled, '=');
  if (filled < kBarWidth) bar += '>';
  bar.resize(kBarWidth, ' ');
  // \r and clear-to-end-of-line: redraw in place.
  std::printf("\r[%s] %s\x1b[K", bar.c_str(), Line(point, steps_done).c_str());
  std::fflush(stdout);
}

void Progress::Finish() {
  if (live_ && last_draw_ != absl::InfinitePast()) {
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace pst
