// One exchange's messages against a served shard: a push alone, a pull alone,
// one message each way, values sent back while the push still arrives, and
// hostile, cut-off or non-finite pushes refused with the model untouched.
#include "ps_server/service/chunk_streams.h"

#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "placement/variable_spec.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/support/thread_count.h"
#include "worker/client/ps_client.h"
#include "tests/ps_server/service/chunk_streams_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace chunk_streams_testing;  // NOLINT(build/namespaces)

// Raw push streams against a shard holding "w" [3, 100] (1200 bytes).
class MalformedPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitRequest init;
    EncodeTensor("w", std::vector<int64_t>{3, 100}, Ramp(300, 1.0f, 1.0f), init.add_variables());
    InitResponse response;
    ASSERT_TRUE(served_.shard()->Init(init, &response).ok());
    stub_ = ParameterServer::NewStub(
        grpc::CreateChannel(served_.address(), grpc::InsecureChannelCredentials()));
    before_ = State();
  }

  // The shard's values and version, as a pull sees them.
  std::pair<int64_t, std::string> State() {
    PullRequest request;
    PullResponse response;
    EXPECT_TRUE(Pull(*served_.shard(), request, absl::Now() + absl::Seconds(5), &response).ok());
    return {response.version(), response.variables(0).data()};
  }

  static ExchangeChunk Header(std::vector<std::pair<std::string, DType>> tensors) {
    ExchangeChunk chunk;
    chunk.mutable_header()->set_worker(0);
    for (auto& [name, dtype] : tensors) {
      Tensor* t = chunk.mutable_header()->add_gradients();
      t->set_name(name);
      t->add_shape(3);
      t->add_shape(100);
      t->set_dtype(dtype);
    }
    return chunk;
  }

  static void AddPiece(ExchangeChunk* chunk, int tensor, int64_t offset, int64_t bytes) {
    TensorPiece* piece = chunk->add_pieces();
    piece->set_tensor(tensor);
    piece->set_offset(offset);
    std::vector<float> values(bytes / 4 + 1, 0.25f);
    piece->set_data(reinterpret_cast<const char*>(values.data()), bytes);
  }

  // An exchange on `context`, which gets a 10 s deadline.
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> OpenExchange(
      grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->Exchange(context);
  }

  // A push and pull's first message: the header and the first 800 bytes of
  // "w" (values 0.25), with a pull that needs no wait.
  ExchangeChunk FirstPushPullChunk() const {
    ExchangeChunk first = Header({{"w", FLOAT32}});
    AddPiece(&first, 0, 0, 800);
    first.mutable_pull()->set_min_version(before_.first);
    return first;
  }

  // A push alone: `chunks`, and no pull.
  grpc::Status Send(const std::vector<ExchangeChunk>& chunks) {
    return CallExchange(stub_.get(), chunks, absl::Seconds(10)).status;
  }

  ServedShard served_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::pair<int64_t, std::string> before_;
};

// A push with no pull is answered with its outcome alone.
TEST_F(MalformedPushTest, AWellFormedPushWithNoPullIsAppliedAndAnsweredWithItsOutcome) {
  ExchangeChunk first = Header({{"w", FLOAT32}});
  AddPiece(&first, 0, 0, 800);
  ExchangeChunk second;
  AddPiece(&second, 0, 800, 400);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {first, second});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  EXPECT_FALSE(outcome.answers[0].has_header());
  EXPECT_EQ(outcome.answers[0].pieces_size(), 0);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(outcome.done()->push().version(), before_.first + 1);
  EXPECT_EQ(State().first, before_.first + 1);
}

// A pull with no push: one message each way for a small model, the values
// at the shard's version, and nothing changed.
TEST_F(MalformedPushTest, APullWithNoPushAnswersTheValuesInOneMessage) {
  PullRequest pull;
  pull.add_names("w");
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {PullOnly(pull)});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_FALSE(outcome.done()->has_push());
  EXPECT_EQ(outcome.done()->version(), before_.first);
  EXPECT_EQ(outcome.answers[0].header().variables(0).name(), "w");
  EXPECT_EQ(AnswerBytes(outcome.answers, 0), before_.second);
  EXPECT_EQ(State(), before_);
}

// A small push and pull is one message each way, as the unary call it
// replaces was: the header, the values and the outcome together.
TEST_F(MalformedPushTest, ASmallPushAndPullIsOneMessageEachWay) {
  ExchangeChunk only = Header({{"w", FLOAT32}});
  AddPiece(&only, 0, 0, 1200);
  only.mutable_pull()->set_min_version(before_.first);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {only});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(outcome.done()->version(), before_.first + 1);
  EXPECT_TRUE(outcome.answers[0].has_header());
  const std::pair<int64_t, std::string> after = State();
  EXPECT_EQ(AnswerBytes(outcome.answers, 0), after.second);
}

// A first message that asks for nothing, or that is not what it claims, is
// refused with INVALID_ARGUMENT before anything is touched.
TEST_F(MalformedPushTest, AHostileFirstMessageIsRefusedAndLeavesTheModelUntouched) {
  struct Case {
    const char* name;
    ExchangeChunk first;
    const char* error;
  };
  ExchangeChunk no_header;
  no_header.mutable_pull()->add_names("w");
  ExchangeChunk both_empty;
  both_empty.mutable_header()->set_worker(0);
  ExchangeChunk pull_with_pieces = PullOnly(PullRequest());
  AddPiece(&pull_with_pieces, 0, 0, 4);
  ExchangeChunk bad_region = Header({{"w", FLOAT32}});
  bad_region.mutable_shm()->set_region(12345);
  ExchangeChunk bad_dtype = PullOnly(PullRequest());
  bad_dtype.mutable_pull()->set_dtype(static_cast<DType>(9));
  const std::vector<Case> cases = {
      {"no header", no_header, "header"},
      {"neither push nor pull", both_empty, "neither"},
      {"a pull carrying pieces", pull_with_pieces, "pieces"},
      {"an unknown wire dtype", bad_dtype, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ExchangeOutcome outcome = CallExchange(stub_.get(), {c.first});
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << outcome.status.error_message();
    EXPECT_THAT(outcome.status.error_message(), HasSubstr(c.error));
    EXPECT_EQ(State(), before_);
  }
  // A region the shard never attached: refused before any byte is read.
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {bad_region});
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::NOT_FOUND)
      << outcome.status.error_message();
  EXPECT_EQ(State(), before_);
}

// On an ASYNC shard a PushPull's answer flows while the push is still
// arriving: the new values of the first chunk come back before the client
// has sent the second (if the shard waited for the whole push, the read
// below would time out).
TEST_F(MalformedPushTest, PushPullSendsValuesBackWhileThePushIsStillArriving) {
  grpc::ClientContext context;
  auto stream = OpenExchange(&context);
  ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
  ExchangeAnswer answer;
  ASSERT_TRUE(stream->Read(&answer)) << "no answer before the push ended";
  ASSERT_EQ(answer.header().variables_size(), 1);
  EXPECT_EQ(answer.header().variables(0).name(), "w");
  ASSERT_EQ(answer.pieces_size(), 1);
  EXPECT_EQ(answer.pieces(0).offset(), 0);
  ASSERT_EQ(answer.pieces(0).data().size(), 800u);
  float value = 0;
  std::memcpy(&value, answer.pieces(0).data().data() + 4 * 199, 4);
  EXPECT_EQ(value, Ramp(300, 1.0f, 1.0f)[199] - 0.25f);
  EXPECT_EQ(State(), before_) << "staged values are not visible to pulls before the commit";

  ExchangeChunk second;
  AddPiece(&second, 0, 800, 400);
  ASSERT_TRUE(stream->Write(second));
  ASSERT_TRUE(stream->WritesDone());
  // The last values come with the outcome.
  ASSERT_TRUE(stream->Read(&answer));
  ASSERT_EQ(answer.pieces_size(), 1);
  EXPECT_EQ(answer.pieces(0).offset(), 800);
  EXPECT_TRUE(answer.has_done());
  EXPECT_EQ(answer.done().push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(answer.done().version(), before_.first + 1);
  EXPECT_FALSE(stream->Read(&answer));
  grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(State().first, before_.first + 1);
}

// A worker that goes away in the middle of a PushPull, while the shard is
// sending values back: nothing of its push is applied, and the shard's next
// update is not held up by it.
TEST_F(MalformedPushTest, APushPullWhoseWorkerGoesAwayMidwayIsDropped) {
  {
    grpc::ClientContext context;
    auto stream = OpenExchange(&context);
    ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
    ExchangeAnswer answer;
    ASSERT_TRUE(stream->Read(&answer));  // the shard is answering
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ExchangeChunk whole = Header({{"w", FLOAT32}});
  AddPiece(&whole, 0, 0, 1200);
  const absl::Time start = absl::Now();
  grpc::Status status = Send({whole});
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "waited for the dropped update";
  EXPECT_EQ(State().first, before_.first + 1) << "the dropped push was applied too";
}

TEST_F(MalformedPushTest, IsRefusedAndLeavesTheModelUntouched) {
  struct Case {
    const char* name;
    std::vector<ExchangeChunk> chunks;
    const char* error;
    bool counted = true;  // in pushes_rejected
  };
  auto with = [](ExchangeChunk chunk, std::vector<std::array<int64_t, 3>> pieces) {
    for (auto [tensor, offset, bytes] : pieces) AddPiece(&chunk, tensor, offset, bytes);
    return chunk;
  };
  const ExchangeChunk header = Header({{"w", FLOAT32}});
  const std::vector<Case> cases = {
      {"out of order", {with(header, {{0, 400, 400}, {0, 0, 400}, {0, 800, 400}})}, "out of order"},
      {"too many bytes", {with(header, {{0, 0, 1200}, {0, 1200, 4}})}, "too many bytes"},
      {"overrunning piece", {with(header, {{0, 0, 1204}})}, "too many bytes"},
      {"missing chunks", {with(header, {{0, 0, 800}})}, "missing chunks"},
      {"no pieces at all", {header}, "missing chunks"},
      {"unknown dtype", {with(Header({{"w", static_cast<DType>(7)}}), {{0, 0, 1200}})},
       "unknown dtype"},
      {"fp16 header, fp32 bytes", {with(Header({{"w", FLOAT16}}), {{0, 0, 1200}})},
       "too many bytes"},
      {"unknown variable", {with(Header({{"v", FLOAT32}}), {{0, 0, 1200}})}, "unknown variable"},
      {"piece naming no tensor", {with(header, {{0, 0, 1200}, {1, 0, 4}})}, "names tensor 1"},
      {"no header", {with(ExchangeChunk(), {{0, 0, 1200}})}, "header"},
      {"second header", {with(header, {{0, 0, 400}}), with(header, {{0, 400, 800}})},
       "second header"},
      // Not a push at all: refused, but not counted as one.
      {"empty exchange", {}, "no header", /*counted=*/false},
  };
  int64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status = Send(c.chunks);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.error));
    EXPECT_EQ(State(), before_);
    StatsResponse stats;
    served_.shard()->Stats(&stats);
    if (c.counted) ++rejected;
    EXPECT_EQ(stats.pushes_rejected(), rejected);
  }
}

// The receiver checks pieces as it copies them in (and Push then skips its
// own pass): a non-finite value anywhere, in any wire dtype, refuses the
// push with the element named, and counts it.
TEST_F(MalformedPushTest, NonFiniteStreamedGradientIsRefused) {
  ExchangeChunk chunk = Header({{"w", FLOAT32}});
  std::vector<float> values(300, 1.0f);
  values[299] = std::numeric_limits<float>::infinity();
  TensorPiece* piece = chunk.add_pieces();
  piece->set_data(reinterpret_cast<const char*>(values.data()), 1200);
  grpc::Status status = Send({chunk});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite value (inf) at element 299"));
  EXPECT_EQ(State(), before_);

  ExchangeChunk first = Header({{"w", BFLOAT16}});
  std::vector<float> half(300, 0.5f);
  half[170] = std::numeric_limits<float>::quiet_NaN();
  std::string encoded;
  EncodeValues(half, BFLOAT16, &encoded);
  first.add_pieces()->set_data(encoded.substr(0, 300));
  ExchangeChunk second;
  second.add_pieces()->set_offset(300);
  second.mutable_pieces(0)->set_data(encoded.substr(300));
  status = Send({first, second});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite value (nan) at element 170"));
  EXPECT_EQ(State(), before_);
  StatsResponse stats;
  served_.shard()->Stats(&stats);
  EXPECT_EQ(stats.pushes_rejected(), 2);
}

}  // namespace PST_FILE_ID
}  // namespace pst
