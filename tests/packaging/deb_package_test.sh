#!/usr/bin/env bash
# The install tree and the Debian package, offline: `cmake --install` into a
# scratch prefix holds the programs, configs and docs; `cpack -G DEB` builds
# a .deb whose contents are the same tree under /usr and whose Depends name
# the Debian packages of the libraries the programs load (a CUDA build is
# refused instead); the installed ps_server answers --version and checks the
# installed config.
#
# Then, only where a Docker engine answers and has the debian:bookworm image,
# deb_install_test.sh installs the package in a clean container and runs
# ps_server --version and a loopback job; otherwise that part is skipped,
# saying why. In CI, tests/docker/compose_test.sh runs it once its dockerd
# is up (ctest runs before that).
#
# Usage: deb_package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

SOURCE_DIR=$1
BUILD_DIR=$(cd "$2" && pwd)
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

say() { echo "deb_package_test: $*"; }
fail() { echo "deb_package_test: FAIL: $*" >&2; exit 1; }

PROGRAMS=(pslaunch ps_server worker psctl psreport)

# cmake --install: the tree under a prefix.
PREFIX=$SCRATCH/prefix
# The default component: the Python module's goes to the interpreter's
# site-packages, outside any prefix.
cmake --install "$BUILD_DIR" --prefix "$PREFIX" --component Unspecified >"$SCRATCH/install.log" 2>&1 \
  || fail "cmake --install (run it after a full build): $(tail -n 5 "$SCRATCH/install.log")"
for f in "${PROGRAMS[@]/#/bin/}" share/pstrain/configs/local.textproto \
         share/pstrain/deploy/kubeflow/tfjob.yaml share/pstrain/deploy/k8s/ps.yaml \
         share/pstrain/docker/Dockerfile share/doc/pstrain/README.md \
         share/doc/pstrain/docs/architecture.md; do
  [ -e "$PREFIX/$f" ] || fail "cmake --install left out $f"
done
for p in "${PROGRAMS[@]}"; do
  [ -x "$PREFIX/bin/$p" ] || fail "bin/$p is not executable"
done
version=$("$PREFIX/bin/ps_server" --version)
grep -q "^ps_server (pstrain) [0-9]" <<<"$version" || fail "ps_server --version printed: $version"
"$PREFIX/bin/ps_server" --config="$PREFIX/share/pstrain/configs/quadratic.textproto" --check_config \
  | grep -q "config OK" || fail "the installed ps_server does not accept the installed quadratic config"
say "cmake --install: ${#PROGRAMS[@]} programs, configs, deploy files and docs; $version"

# cpack -G DEB: the package, read back with dpkg-deb; a CUDA build is refused.
if grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$BUILD_DIR/CPackConfig.cmake"; then
  if (cd "$SCRATCH" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$SCRATCH/pkg" \
      >"$SCRATCH/cpack.log" 2>&1); then
    fail "cpack packed a CUDA build, whose CUDA runtime no Debian package provides"
  fi
  grep -q "links the CUDA runtime" "$SCRATCH/cpack.log" || fail "cpack's refusal: $(cat "$SCRATCH/cpack.log")"
  say "SKIP the package's contents: this is a CUDA build, which cpack refuses (as it should); a CPU build (-DPS_WITH_CUDA=OFF) checks them"
  exit 0
fi
(cd "$SCRATCH" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$SCRATCH/pkg" \
  >"$SCRATCH/cpack.log" 2>&1) || fail "cpack -G DEB failed: $(tail -n 20 "$SCRATCH/cpack.log")"
deb=$(ls "$SCRATCH"/pkg/*.deb)
[ "$(wc -l <<<"$deb")" -eq 1 ] || fail "expected one .deb, found: $deb"
info=$(dpkg-deb -I "$deb")
contents=$(dpkg-deb -c "$deb")
grep -q "^ Package: pstrain$" <<<"$info" || fail "package name: $info"
depends=$(sed -n 's/^ Depends: //p' <<<"$info")
[ -n "$depends" ] || fail "no Depends in: $info"
# The libraries every program links: gRPC, protobuf, Abseil, spdlog, glibc,
# libmicrohttpd (metrics), OpenBLAS (the worker's kernels).
for dep in 'libgrpc++1.51' libprotobuf32 libabsl20220623 libspdlog1.10 libc6 libmicrohttpd12 libopenblas; do
  grep -q "$dep" <<<"$depends" || fail "Depends lacks $dep: $depends"
done
# Nothing of the build machine that no package provides (a CUDA runtime, a
# library from /usr/local).
grep -qi "cuda\|cublas" <<<"$depends" && fail "Depends names a CUDA library: $depends"
for f in "${PROGRAMS[@]/#/./usr/bin/}" ./usr/share/pstrain/configs/local.textproto \
         ./usr/share/doc/pstrain/README.md ./usr/share/pstrain/deploy/kubeflow/tfjob.yaml; do
  grep -q " $f\$" <<<"$contents" || fail "the .deb lacks $f"
done
grep -q " ./usr/local/" <<<"$contents" && fail "the .deb installs under /usr/local"
say "$(basename "$deb"): $(wc -l <<<"$contents") entries; Depends: $depends"

# A clean Debian 12 container, where a Docker engine answers (in CI,
# tests/docker/compose_test.sh runs this part once its dockerd is up).
"$(dirname "$0")/deb_install_test.sh" "$BUILD_DIR" "$deb"
