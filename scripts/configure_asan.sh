#!/usr/bin/env bash
# Configures DIR (default build-asan/) as the one ASan + UBSan build that
# scripts/sanitize.sh (the unit and concurrency tests) and scripts/fuzz.sh
# (the libFuzzer targets) share: clang, -O1 -g1, PST_FUZZ=ON (ASan, UBSan
# and libFuzzer's coverage hooks on every target). Both configure through
# here, so the instrumented libraries are compiled once for both; the hooks
# cost the tests nothing measurable (138 s against 142 s of ctest on 2
# cores). clang's UBSan also checks pointer arithmetic on null, which GCC's
# does not. A directory configured with another compiler is made anew.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-asan}
if [ -f "$dir/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' "$dir/CMakeCache.txt"; then
  rm -rf "$dir"
fi
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DPS_WITH_CUDA=OFF -DPST_FUZZ=ON >/dev/null
