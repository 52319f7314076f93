#!/usr/bin/env bash
# Configures build/ (or $BUILD_DIR) for Ninja; extra arguments go to cmake
# (e.g. -DPST_WERROR=ON). Cheap to run again, and run before every build:
# CMake keeps in its cache what it found and searches again for what it did
# not, so a package installed since the last configure (pybind11-dev after
# scripts/quickstart.sh, say) is found now. A component that cannot be
# built says so in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B "${BUILD_DIR:-build}" -G Ninja "$@" > /dev/null
