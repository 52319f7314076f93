#!/usr/bin/env bash
# The install tree and the Debian package, offline: `cmake --install` into a
# scratch prefix holds the programs, the Python module (where that prefix's
# Python finds it: lib/python3/dist-packages, or a virtual environment's
# site-packages), the examples, configs and docs; `cpack -G DEB` builds a
# .deb whose contents are the same tree under /usr and whose Depends name
# the Debian packages of the libraries the programs load and the module's
# Python and NumPy; the installed ps_server answers --version and checks the
# installed config. A CUDA build is refused by cpack, naming
# scripts/package_deb.sh, whose CPU build (configured here, not built)
# compiles no CUDA and no test.
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

PROGRAMS=(pslaunch ps_server worker psctl psreport ctr_datagen)
PYTHON=/usr/bin/python3
MODULE=lib/python3/dist-packages/pstrain
# Besides the programs, what the docs name: the examples and the figures'
# data (docs/bench).
SHARED=(share/pstrain/configs/local.textproto share/pstrain/deploy/kubeflow/tfjob.yaml
        share/pstrain/deploy/k8s/ps.yaml share/pstrain/docker/Dockerfile
        share/pstrain/examples/pytorch_cnn.py share/pstrain/examples/pytorch_cnn.textproto
        share/doc/pstrain/README.md share/doc/pstrain/docs/architecture.md
        share/doc/pstrain/docs/bench/main_job.json)

# cmake --install: the tree under a prefix.
PREFIX=$SCRATCH/prefix
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >"$SCRATCH/install.log" 2>&1 \
  || fail "cmake --install (run it after a full build): $(tail -n 5 "$SCRATCH/install.log")"
for f in "${PROGRAMS[@]/#/bin/}" "${SHARED[@]}" $MODULE/__init__.py $MODULE/torch.py; do
  [ -e "$PREFIX/$f" ] || fail "cmake --install left out $f"
done
ls "$PREFIX/$MODULE"/_pstrain.*.so >/dev/null 2>&1 || fail "cmake --install left out $MODULE/_pstrain"
# Nothing outside the prefix: the module once went to the interpreter's own site-packages.
grep -v "^$PREFIX/" <(sed -n 's/^-- \(Installing\|Up-to-date\): //p' "$SCRATCH/install.log") &&
  fail "cmake --install wrote outside --prefix $PREFIX (above)"
found=$(cd "$SCRATCH" && PYTHONPATH="$PREFIX/lib/python3/dist-packages" "$PYTHON" -c \
  'import pstrain; print(pstrain.__file__)') || fail "the installed module does not import"
[ "$found" = "$PREFIX/$MODULE/__init__.py" ] || fail "Python imported pstrain from $found"
# A virtual environment as the prefix: its own python finds the module, no PYTHONPATH.
"$PYTHON" -m venv --without-pip --system-site-packages "$SCRATCH/venv" || fail "python3 -m venv failed (install python3-venv)"
cmake --install "$BUILD_DIR" --prefix "$SCRATCH/venv" >"$SCRATCH/venv-install.log" 2>&1 \
  || fail "cmake --install into a virtual environment: $(tail -n 5 "$SCRATCH/venv-install.log")"
found=$(cd "$SCRATCH" && "$SCRATCH/venv/bin/python" -c 'import pstrain; print(pstrain.__file__)') ||
  fail "a virtual environment's python does not find the module cmake --install put there"
grep -q "^$SCRATCH/venv/lib/python3\.[0-9]*/site-packages/pstrain/__init__.py$" <<<"$found" ||
  fail "the virtual environment's python imported pstrain from $found"
for p in "${PROGRAMS[@]}"; do
  [ -x "$PREFIX/bin/$p" ] || fail "bin/$p is not executable"
done
version=$("$PREFIX/bin/ps_server" --version)
grep -q "^ps_server (pstrain) [0-9]" <<<"$version" || fail "ps_server --version printed: $version"
"$PREFIX/bin/ps_server" --config="$PREFIX/share/pstrain/configs/quadratic.textproto" --check_config \
  | grep -q "config OK" || fail "the installed ps_server does not accept the installed quadratic config"
say "cmake --install: ${#PROGRAMS[@]} programs, the module (found by a prefix's and a virtual environment's python), examples, configs, deploy files and docs; $version"

# cpack -G DEB: the package, read back with dpkg-deb; a CUDA build is
# refused, naming scripts/package_deb.sh, whose build is configured here: a
# CPU build of the programs and the module, with no test and no CUDA.
if grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$BUILD_DIR/CPackConfig.cmake"; then
  if (cd "$SCRATCH" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$SCRATCH/pkg" \
      >"$SCRATCH/cpack.log" 2>&1); then
    fail "cpack packed a CUDA build, whose CUDA runtime no Debian package provides"
  fi
  grep -q "links the CUDA runtime.*scripts/package_deb.sh" <(tr -d '\n' <"$SCRATCH/cpack.log") ||
    fail "cpack's refusal does not name scripts/package_deb.sh: $(cat "$SCRATCH/cpack.log")"
  PACKAGE_DEB_CONFIGURE_ONLY=1 BUILD_DIR="$SCRATCH/cpu" "$SOURCE_DIR/scripts/package_deb.sh" \
    >"$SCRATCH/package_deb.log" 2>&1 || fail "scripts/package_deb.sh: $(tail -n 5 "$SCRATCH/package_deb.log")"
  grep -q 'CPACK_PSTRAIN_CUDA "OFF"' "$SCRATCH/cpu/CPackConfig.cmake" ||
    fail "scripts/package_deb.sh configured a CUDA build"
  plan=$(ninja -C "$SCRATCH/cpu" -n pst_packaged)
  steps=$(grep -c "^\[" <<<"$plan")
  grep -q "Linking CXX shared module python/pstrain/_pstrain" <<<"$plan" ||
    fail "scripts/package_deb.sh does not build the module: $(tail -n 3 <<<"$plan")"
  grep -i "tests/\|_test\b\|CUDA object\|nvcc" <<<"$plan" | head -n 3 | grep . &&
    fail "scripts/package_deb.sh's build compiles the above (tests or CUDA)"
  say "SKIP the package's contents: this is a CUDA build, which cpack refuses (as it should), naming scripts/package_deb.sh, whose CPU build of $steps steps has no test and no CUDA"
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
for dep in 'libgrpc++1.51' libprotobuf32 libabsl20220623 libspdlog1.10 libc6 libmicrohttpd12 libopenblas \
           'python3 (>= 3.' python3-numpy; do
  grep -q "$dep" <<<"$depends" || fail "Depends lacks $dep: $depends"
done
# Nothing of the build machine that no package provides (a CUDA runtime, a
# library from /usr/local).
grep -qi "cuda\|cublas" <<<"$depends" && fail "Depends names a CUDA library: $depends"
for f in "${PROGRAMS[@]/#/./usr/bin/}" "${SHARED[@]/#/./usr/}" ./usr/$MODULE/__init__.py \
         ./usr/$MODULE/torch.py; do
  grep -q " $f\$" <<<"$contents" || fail "the .deb lacks $f"
done
grep -q " ./usr/$MODULE/_pstrain\..*\.so\$" <<<"$contents" || fail "the .deb lacks the module's _pstrain"
grep -q " ./usr/local/" <<<"$contents" && fail "the .deb installs under /usr/local"
say "$(basename "$deb"): $(wc -l <<<"$contents") entries; Depends: $depends"

# A clean Debian 12 container, where a Docker engine answers (in CI,
# tests/docker/compose_test.sh runs this part once its dockerd is up).
"$(dirname "$0")/deb_install_test.sh" "$BUILD_DIR" "$deb"
