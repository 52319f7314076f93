// absl::Status <-> grpc::Status: the code and message, and every payload in
// the status details, as google.rpc.Status lays them out.
#include "rpc/grpc_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "common/transient_refusal.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(GrpcStatusTest, CodeMessageAndPayloadsSurviveTheRoundTrip) {
  absl::Status status = absl::ResourceExhaustedError("busy; try again");
  status.SetPayload("type.example/one", absl::Cord("1"));
  status.SetPayload("type.example/two", absl::Cord(std::string("\0\xff", 2)));
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(status));
  EXPECT_EQ(back, status);
}

TEST(GrpcStatusTest, AStatusWithoutPayloadsSendsNoDetails) {
  const grpc::Status converted = ToGrpcStatus(absl::NotFoundError("no such thing"));
  EXPECT_EQ(converted.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(converted.error_message(), "no such thing");
  EXPECT_TRUE(converted.error_details().empty());
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcStatusTest, DetailsThatDoNotParseAreDropped) {
  const grpc::Status garbage(grpc::StatusCode::UNAVAILABLE, "away", "\x1a\xff\xff");
  const absl::Status back = FromGrpcStatus(garbage);
  EXPECT_EQ(back, absl::UnavailableError("away"));
}

TEST(GrpcStatusTest, ATransientMarkCrossesTheWire) {
  for (TransientRefusal why : {TransientRefusal::kOverloaded, TransientRefusal::kRegionLost,
                               TransientRefusal::kRestarting}) {
    SCOPED_TRACE(std::string(TransientRefusalName(why)));
    const absl::Status marked = MarkTransient(absl::ResourceExhaustedError("x"), why);
    EXPECT_EQ(MarkedTransient(FromGrpcStatus(ToGrpcStatus(marked))), why);
  }
  EXPECT_FALSE(MarkedTransient(FromGrpcStatus(ToGrpcStatus(absl::ResourceExhaustedError("x")))));
}

}  // namespace PST_FILE_ID
}  // namespace pst
