#include "worker/training/progress.h"

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(ProgressTest, EtaReadsLikeAClock) {
  struct Case {
    absl::Duration eta;
    std::string text;
  };
  for (const Case& c : {Case{absl::Seconds(42), "42s"}, Case{absl::Seconds(185), "3m05s"},
                        Case{absl::Seconds(3725), "1h02m"}, Case{absl::ZeroDuration(), "0s"}}) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(Progress::FormatEta(c.eta), c.text);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
