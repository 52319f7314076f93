// The shard's answer to a region handoff, as the worker reads it.
#include "common/region_handoff.h"

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(RegionHandoffTest, AHandleAndARefusalRoundTrip) {
  absl::StatusOr<uint64_t> handle = DecodeHandoffReply(EncodeHandoffReply(0x1234567890abcdefu));
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(*handle, 0x1234567890abcdefu);
  absl::StatusOr<uint64_t> refused =
      DecodeHandoffReply(EncodeHandoffReply(absl::PermissionDeniedError("not yours")));
  EXPECT_EQ(refused.status(), absl::PermissionDeniedError("not yours"));
}

TEST(RegionHandoffTest, AMalformedAnswerIsUnavailableNotTrusted) {
  EXPECT_EQ(DecodeHandoffReply("").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(DecodeHandoffReply(std::string(4, '\0')).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(DecodeHandoffReply(std::string(9 + 257, '\0')).status().code(),
            absl::StatusCode::kUnavailable);
  // A code no status has is not taken for success.
  std::string reply(9, '\0');
  reply[0] = static_cast<char>(200);
  EXPECT_EQ(DecodeHandoffReply(reply).status().code(), absl::StatusCode::kUnknown);
}

TEST(RegionHandoffTest, NoncesAreRandom) {
  EXPECT_EQ(RandomBytes(kHandoffNonceBytes).size(), kHandoffNonceBytes);
  EXPECT_NE(RandomBytes(kHandoffNonceBytes), RandomBytes(kHandoffNonceBytes));
}

}  // namespace PST_FILE_ID
}  // namespace pst
