// Wire encodings: float32 exact, float16 and bfloat16 within their rounding
// bounds, special values kept.
#include "common/tensor_codec.h"

#include <cmath>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(TensorCodecTest, HalfConversionsMatchKnownValues) {
  struct Case {
    float value;
    uint16_t half;
  };
  for (Case c : {Case{0.0f, 0x0000}, Case{-0.0f, 0x8000}, Case{1.0f, 0x3c00}, Case{-2.0f, 0xc000},
                 Case{65504.0f, 0x7bff}, Case{0x1.0p-24f, 0x0001}, Case{0x1.0p-14f, 0x0400},
                 Case{1.0f + 0x1.0p-11f, 0x3c00},            // tie: rounds to even
                 Case{1.0f + 0x1.8p-11f, 0x3c01},            // above the tie: rounds up
                 Case{70000.0f, 0x7c00},                      // overflow: infinity
                 Case{std::numeric_limits<float>::infinity(), 0x7c00}}) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(FloatToHalf(c.value), c.half);
  }
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x0001), 0x1.0p-24f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
}

TEST(TensorCodecTest, Bfloat16ConversionsMatchKnownValues) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBfloat16(1.0f + 0x1.0p-8f), 0x3f80);  // tie: rounds to even
  EXPECT_EQ(FloatToBfloat16(1.0f + 0x1.8p-8f), 0x3f81);
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bfloat16ToFloat(FloatToBfloat16(std::numeric_limits<float>::infinity()))));
}

// Round trips stay within half a unit in the last place of each format:
// 2^-11 relative for float16 (normal range), 2^-8 for bfloat16.
TEST(TensorCodecTest, RoundTripsStayWithinTheFormatsRoundingBound) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-14, 15);
  std::vector<float> values(100000);
  for (float& v : values) v = std::ldexp(mantissa(rng), exponent(rng));
  struct Case {
    DType dtype;
    double bound;
  };
  for (Case c : {Case{FLOAT32, 0.0}, Case{FLOAT16, 0x1.0p-11}, Case{BFLOAT16, 0x1.0p-8}}) {
    SCOPED_TRACE(DType_Name(c.dtype));
    Tensor tensor;
    std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    EncodeTensor("v", shape, values, &tensor, c.dtype);
    EXPECT_EQ(tensor.data().size(), values.size() * DTypeBytes(c.dtype));
    ASSERT_TRUE(CheckTensorPayload(tensor, values.size()).ok());
    std::vector<float> back(values.size());
    DecodeTensor(tensor, back);
    for (size_t i = 0; i < values.size(); ++i) {
      // Below float16's normal range the absolute spacing 2^-24 rules.
      double allowed = std::max(c.bound * std::abs(values[i]), c.dtype == FLOAT16 ? 0x1.0p-25 : 0.0);
      ASSERT_LE(std::abs(static_cast<double>(back[i]) - values[i]), allowed) << values[i];
    }
  }
}

// Shapes arrive off the wire: huge or negative dimensions are refused, never
// overflowed (shard_fuzzer found 1224979098376339456 * 16 overflowing).
TEST(TensorCodecTest, ShapesThatOverflowAreNoTensor) {
  EXPECT_EQ(NumElements(std::vector<int64_t>{3, 4}), 12);
  EXPECT_EQ(NumElements(std::vector<int64_t>{}), 1);
  EXPECT_EQ(NumElements(std::vector<int64_t>{1224979098376339456, 16}), -1);
  EXPECT_EQ(NumElements(std::vector<int64_t>{-2, -3}), -1);
  Tensor tensor;
  std::vector<float> values = {1};
  EncodeTensor("w", std::vector<int64_t>{1}, values, &tensor);
  EXPECT_EQ(CheckTensorPayload(tensor, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTensorPayload(tensor, int64_t{1} << 62).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, PayloadSizeIsCheckedPerDtype) {
  Tensor tensor;
  std::vector<float> values = {1, 2, 3};
  EncodeTensor("w", std::vector<int64_t>{3}, values, &tensor, BFLOAT16);
  EXPECT_TRUE(CheckTensorPayload(tensor, 3).ok());
  EXPECT_FALSE(CheckTensorPayload(tensor, 4).ok());
  tensor.set_dtype(static_cast<DType>(9));
  EXPECT_THAT(std::string(CheckTensorPayload(tensor, 3).message()), ::testing::HasSubstr("unknown dtype"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
