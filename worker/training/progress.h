// How a worker shows its progress: a single live line redrawn in place when
// stdout is a terminal, plain periodic log lines otherwise (so pslaunch's
// prefixed, interleaved log stays readable).
#ifndef PST_WORKER_TRAINING_PROGRESS_H_
#define PST_WORKER_TRAINING_PROGRESS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace pst {

struct ProgressPoint {
  int epoch = 0;             // 0-based
  int epochs = 1;
  int64_t step = 0;          // steps done in this epoch
  int64_t steps = 1;         // steps per epoch
  double loss = 0.0;         // mean over the steps since the last report
  double samples_per_sec = 0.0;
  int64_t version = 0;
};

class Progress {
 public:
  // `live` draws the bar (pass IsTerminal()); `steps_total` is every step
  // this worker will run, for the ETA; `devices` names where it computes
  // ("cpu:2"), shown in every line.
  Progress(bool live, int64_t steps_total, std::string devices = "cpu");

  // One report; every `log_every` steps in line mode, at most ten times a
  // second in live mode (the caller calls it every step).
  void Report(const ProgressPoint& point, int64_t steps_done);
  // Ends the live line so that the next log line starts clean.
  void Finish();

  bool live() const { return live_; }
  static bool IsTerminal();
  // "1h02m", "3m05s", "42s".
  static std::string FormatEta(absl::Duration eta);

 private:
  std::string Line(const ProgressPoint& point, int64_t steps_done) const;

  const bool live_;
  const int64_t steps_total_;
  const std::string devices_;
  const absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
};

}  // namespace pst

#endif  // PST_WORKER_TRAINING_PROGRESS_H_
