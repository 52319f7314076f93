// exec_probe: a program for the tests of ExecAgainWith
// (kernels/openblas_core.h). Started without PST_EXEC_AGAIN, it executes
// itself again with PST_EXEC_AGAIN=again, then prints one line: its PID,
// its name (/proc/self/comm), the variable and its arguments after the
// program's name.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/openblas_core.h"

int main(int argc, char** argv) {
  constexpr const char* kVariable = "PST_EXEC_AGAIN";
  if (std::getenv(kVariable) == nullptr) {
    const int error = pst::ExecAgainWith(kVariable, "again");
    std::printf("not executed again: %s\n", std::strerror(error));
    return 1;
  }
  std::string name;
  std::getline(std::ifstream("/proc/self/comm"), name);
  std::printf("pid %d name %s %s=%s args", static_cast<int>(getpid()), name.c_str(), kVariable,
              std::getenv(kVariable));
  for (int i = 1; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");
  return 0;
}
