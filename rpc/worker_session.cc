#include "rpc/worker_session.h"

#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pst {
uint64_t ProcessSession() {
  static const uint64_t session = [] {
    std::random_device random;
    uint64_t drawn = 0;
    while (drawn == 0) drawn = (static_cast<uint64_t>(random()) << 32) | random();
    return drawn;
  }();
  return session;
}

void AddProcessSession(grpc::ClientContext* context) {
  static const std::string session = absl::StrCat(ProcessSession());
  context->AddMetadata(kSessionMetadataKey, session);
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
