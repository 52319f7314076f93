#!/usr/bin/env bash
# Configures and builds into build/ (or $BUILD_DIR): every target, or only
# those named in $BUILD_TARGETS (e.g. "pslaunch ps_server worker"). Extra
# arguments go to cmake (e.g. -DPST_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
fi
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
