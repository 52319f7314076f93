#include "rpc/worker_session.h"

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"

namespace pst {
namespace {

// Adds the session to the metadata of every call it sees.
class SessionInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SessionInterceptor(const std::string* session) : session_(session) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kSessionMetadataKey, *session_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const session_;
};

class SessionInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SessionInterceptorFactory(uint64_t session) : session_(absl::StrCat(session)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new SessionInterceptor(&session_);
  }

 private:
  const std::string session_;  // as long as the channel: the channel owns the factory
};

}  // namespace

uint64_t ProcessSession() {
  static const uint64_t session = [] {
    std::random_device random;
    uint64_t drawn = 0;
    while (drawn == 0) drawn = (static_cast<uint64_t>(random()) << 32) | random();
    return drawn;
  }();
  return session;
}

std::shared_ptr<grpc::Channel> CreateSessionChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args, uint64_t session) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<SessionInterceptorFactory>(session));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(factories));
}

uint64_t SessionOf(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kSessionMetadataKey);
  if (found == metadata.end()) return 0;
  uint64_t session = 0;
  if (!absl::SimpleAtoi(absl::string_view(found->second.data(), found->second.size()), &session)) {
    return 0;
  }
  return session;
}

}  // namespace pst
