// WorkerSessions: one process at a time acts as a worker; a second one is
// refused while the first one's lease is live, and takes over after.
#include "ps_server/service/worker_sessions.h"

#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(WorkerSessionsTest, OneSessionPerLiveWorkerAndATakeoverOnceItsLeaseRunsOut) {
  std::vector<bool> live = {true, true};
  WorkerSessions sessions(2, [&live](int worker) { return live[worker]; });
  struct Step {
    const char* what;
    int worker;
    uint64_t session;
    bool worker_live;
    bool admitted;
  };
  const Step steps[] = {
      {"the first session holds worker 0", 0, 7, true, true},
      {"and calls again", 0, 7, true, true},
      {"another session is refused while 0 is live", 0, 8, true, false},
      {"so are calls with no session", 0, 0, true, false},
      {"worker 1 is held apart", 1, 8, true, true},
      {"the holder's lease runs out: a newcomer takes 0 over", 0, 8, false, true},
      {"and the former holder is now the newcomer", 0, 7, true, false},
      {"a worker outside the job is the shard's to refuse", 5, 9, true, true},
  };
  int64_t refused = 0;
  for (const Step& step : steps) {
    SCOPED_TRACE(step.what);
    if (step.worker < 2) live[step.worker] = step.worker_live;
    const absl::Status status = sessions.Admit(step.worker, step.session);
    EXPECT_EQ(status.ok(), step.admitted) << status;
    if (!step.admitted) {
      ++refused;
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    }
  }
  EXPECT_EQ(sessions.refused(), refused);
}

}  // namespace PST_FILE_ID
}  // namespace pst
