#include "rpc/grpc_experiments.h"

#include <cstdlib>

namespace pst {

const char* TransportExperiments() { return PST_GRPC_EXPERIMENTS; }

void EnableTransportExperiments() {
  setenv("GRPC_EXPERIMENTS", TransportExperiments(), /*overwrite=*/0);
}

}  // namespace pst
