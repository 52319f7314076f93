#!/usr/bin/env bash
# The whole test suite: install what is missing, build everything, run ctest.
# Extra arguments go to cmake (CI passes -DPST_WERROR=ON). Every component
# the suite tests must build: a missing one (the Python module) stops the
# configure with one line, rather than the suite running fewer tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh -DPST_REQUIRE_PYTHON=ON "$@"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j 2
