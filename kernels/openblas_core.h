// Which kernels OpenBLAS computes with, and a correction where it guesses.
//
// OpenBLAS picks its kernels when it loads, by the CPU's model number, and
// Debian 12's (0.3.21) takes a model it does not know for a Prescott: on an
// Intel Xeon of family 6 model 207, AVX-512 with BF16, it chose its SSE3
// kernels, whose matrix products there run at a fourth of the speed of its
// Cooperlake kernels. Later OpenBLAS releases fall back by the CPU's
// features instead; this does the same through the one switch OpenBLAS
// has, the OPENBLAS_CORETYPE environment variable, which it reads only as
// it loads.
#ifndef PST_KERNELS_OPENBLAS_CORE_H_
#define PST_KERNELS_OPENBLAS_CORE_H_

#include <string>
#include <string_view>

namespace pst {

// The instruction sets OpenBLAS's x86-64 kernels are built for, as the CPU
// and the kernel's saved state allow them.
struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;         // with FMA
  bool avx512 = false;       // F, BW, DQ and VL
  bool avx512_bf16 = false;  // with the above
};

CpuFeatures ThisCpuFeatures();

// OpenBLAS's name for the kernels this process computes with ("Prescott",
// "Haswell", "SkylakeX", "Cooperlake", ...).
std::string OpenBlasCore();

// The OPENBLAS_CORETYPE for a CPU with `cpu` where OpenBLAS chose `chosen`
// for it, or empty where its choice stands: it knew the CPU, or the CPU has
// nothing past SSE3.
std::string BetterOpenBlasCore(std::string_view chosen, const CpuFeatures& cpu);

// Executes this program again as the kernel started it (the file
// /proc/self/exe names, with /proc/self/cmdline's arguments: under an
// explicit loader, the loader and its arguments too), the same process,
// with `name`=`value` in its environment. Returns only where it fails: the
// errno, the variable unset again.
int ExecAgainWith(const char* name, const std::string& value);

// Early in main() of a program that computes with OpenBLAS, before any
// thread starts: where OPENBLAS_CORETYPE is unset and BetterOpenBlasCore
// names kernels, executes the program again with OPENBLAS_CORETYPE set to
// them (ExecAgainWith), so that OpenBLAS loads with them. Returns where
// nothing is to change, or where the execution fails (logged; OpenBLAS
// keeps its choice).
void ExecAgainWithBetterOpenBlasKernels();

}  // namespace pst

#endif  // PST_KERNELS_OPENBLAS_CORE_H_
