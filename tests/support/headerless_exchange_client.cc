// A hostile client that holds CALLS Exchange calls open at ADDRESS without
// ever sending a message (so the server never learns their worker), spread
// over one channel (a connection of its own) per 30 calls, and opens a new
// one as soon as the server ends one; for SECONDS, then exits 0. A process
// of its own, as an attacker is.
//   headerless_exchange_client ADDRESS CALLS SECONDS
// Prints "holding" once every call has been opened, and at the end how many
// calls the server ended meanwhile.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"

namespace {

constexpr int kCallsPerChannel = 30;

struct Call {
  int channel = 0;
  grpc::ClientContext context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  grpc::Status status;
  bool finishing = false;
};

}  // namespace

int main(int argc, char** argv) {
  int calls = 0;
  int seconds = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[2], &calls) || !absl::SimpleAtoi(argv[3], &seconds) ||
      calls < 1 || seconds < 1) {
    std::fprintf(stderr, "usage: headerless_exchange_client ADDRESS CALLS SECONDS\n");
    return 2;
  }
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int c = 0; c * kCallsPerChannel < calls; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    args.SetInt("pst.channel", c);                       // never shared with another channel
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(argv[1], grpc::InsecureChannelCredentials(), args)));
  }
  grpc::CompletionQueue queue;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  auto open = [&](int channel) {
    auto* call = new Call;
    call->channel = channel;
    call->context.set_deadline(absl::ToChronoTime(end + absl::Seconds(5)));
    call->stream = stubs[channel]->PrepareCall(&call->context, "/pst.ParameterServer/Exchange",
                                               &queue);
    call->stream->StartCall(call);
  };
  for (int i = 0; i < calls; ++i) open(i / kCallsPerChannel);
  std::printf("holding\n");
  std::fflush(stdout);
  int ended = 0;
  while (true) {
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        queue.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    if (absl::Now() >= end) break;
    if (next == grpc::CompletionQueue::TIMEOUT) continue;
    auto* call = static_cast<Call*>(tag);
    if (!call->finishing) {
      // Started (or failed to): wait for the server to end it.
      call->finishing = true;
      call->stream->Finish(&call->status, call);
      continue;
    }
    ++ended;
    const int channel = call->channel;
    delete call;
    open(channel);
  }
  std::printf("the server ended %d calls\n", ended);
  std::fflush(stdout);
  // The calls still open end with the process.
  std::_Exit(0);
}
