#!/usr/bin/env bash
# Configures (scripts/configure.sh) and builds into build/ (or $BUILD_DIR):
# every target, or only those named in $BUILD_TARGETS (e.g. "pslaunch
# ps_server worker"). Extra arguments go to cmake (e.g. -DPST_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_DIR=$BUILD_DIR scripts/configure.sh "$@"
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
