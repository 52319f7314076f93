#!/usr/bin/env bash
# The Debian package, on any host (one with nvcc too): configures a CPU build
# of its own in build-deb/ (or $BUILD_DIR; -DPS_WITH_CUDA=OFF, no test),
# builds only what the package holds (the programs and the Python module:
# target pst_packaged), runs cpack -G DEB there and prints the .deb's path.
# Extra arguments go to cmake. PACKAGE_DEB_CONFIGURE_ONLY=1 stops after the
# configure (tests/packaging/deb_package_test.sh reads the build's plan).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-deb}
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPS_WITH_CUDA=OFF \
  -DBUILD_TESTING=OFF -DPST_REQUIRE_PYTHON=ON "$@" >"$BUILD_DIR/configure.log" 2>&1 ||
  { tail -n 20 "$BUILD_DIR/configure.log" >&2; echo "package_deb: the configure failed (log: $BUILD_DIR/configure.log)" >&2; exit 1; }
if grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$BUILD_DIR/CPackConfig.cmake"; then
  echo "package_deb: $BUILD_DIR is configured with CUDA (-DPS_WITH_CUDA=ON passed?); use a fresh BUILD_DIR" >&2
  exit 2
fi
[ -z "${PACKAGE_DEB_CONFIGURE_ONLY:-}" ] || exit 0
cmake --build "$BUILD_DIR" -j "$(nproc)" --target pst_packaged
rm -f "$BUILD_DIR"/pstrain_*.deb
(cd "$BUILD_DIR" && cpack -G DEB >cpack.log 2>&1) ||
  { tail -n 20 "$BUILD_DIR/cpack.log" >&2; echo "package_deb: cpack -G DEB failed (log: $BUILD_DIR/cpack.log)" >&2; exit 1; }
(cd "$BUILD_DIR" && ls "$PWD"/pstrain_*.deb)
