#!/usr/bin/env bash
# The whole test suite: install what is missing, build everything, run ctest.
# Extra arguments go to cmake (CI passes -DPST_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh "$@"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j 2
