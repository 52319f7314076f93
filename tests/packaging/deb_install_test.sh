#!/usr/bin/env bash
# The Debian package installed in a clean Debian 12 container: `dpkg -i`,
# then apt-get fetches the Depends dpkg names (so the container needs the
# Debian mirror), then the installed ps_server answers --version, pslaunch
# runs a loopback job (configs/quadratic.textproto) to its summary line, and
# two Python workers of Debian's python3, outside any checkout, import the
# installed module and train through it (tests/packaging/numpy_train.py).
#
# Needs a Docker engine with the debian:bookworm image, which
# tests/docker/compose_test.sh starts and makes (and then runs this); skips
# (exit 0), saying why, without them. DEB is the package to install; without
# it, `cpack -G DEB` makes one from BUILD_DIR (a CUDA build, which cpack
# refuses, and a directory without a build are skipped, saying why;
# scripts/package_deb.sh makes a package on any host).
#
# Usage: deb_install_test.sh BUILD_DIR [DEB]
set -euo pipefail

BUILD_DIR=$(cd "$1" 2>/dev/null && pwd || echo "$1")
DEB=${2:-}
DOCKER=${DOCKER:-/usr/bin/docker}  # Debian's docker.io; another docker may come first on PATH
IMAGE=debian:bookworm

say() { echo "deb_install_test: $*"; }
fail() { echo "deb_install_test: FAIL: $*" >&2; exit 1; }
skip() { say "SKIP clean-container install: $*"; exit 0; }

[ -x "$DOCKER" ] || skip "no $DOCKER (Debian's docker.io)"
"$DOCKER" info >/dev/null 2>&1 ||
  skip "no Docker engine answers (tests/docker/compose_test.sh starts one and runs this test)"
"$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1 ||
  skip "no $IMAGE image (tests/docker/compose_test.sh makes one and runs this test)"

SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
if [ -z "$DEB" ]; then
  [ -f "$BUILD_DIR/CPackConfig.cmake" ] || skip "no build in $BUILD_DIR to package (scripts/build.sh makes one)"
  grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$BUILD_DIR/CPackConfig.cmake" &&
    skip "$BUILD_DIR is a CUDA build, which cpack refuses; a CPU build (-DPS_WITH_CUDA=OFF) is packaged"
  (cd "$SCRATCH" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$SCRATCH/pkg" \
    >"$SCRATCH/cpack.log" 2>&1) || fail "cpack -G DEB failed: $(tail -n 20 "$SCRATCH/cpack.log")"
  DEB=$(ls "$SCRATCH"/pkg/*.deb)
fi
cp "$DEB" "$SCRATCH/pstrain.deb"
cp "$(dirname "$0")/numpy_train.py" "$SCRATCH/numpy_train.py"
chmod 644 "$SCRATCH/pstrain.deb" "$SCRATCH/numpy_train.py"

# dpkg -i stops at the Depends a clean system lacks; apt-get -f installs
# them and finishes the configuration. The host's network: the mirror is
# reached without a bridge, and the job binds loopback ports the system picks.
"$DOCKER" run --rm --network host -v "$SCRATCH/pstrain.deb:/tmp/pstrain.deb:ro" \
  -v "$SCRATCH/numpy_train.py:/tmp/numpy_train.py:ro" "$IMAGE" sh -ec '
  apt-get update -qq
  dpkg -i /tmp/pstrain.deb >/dev/null 2>&1 || echo "dpkg -i: Depends missing, as on any clean system"
  DEBIAN_FRONTEND=noninteractive apt-get install -f -y -qq --no-install-recommends >/dev/null
  dpkg-query -W -f="installed: \${Package} \${Version} \${Status}\n" pstrain
  ps_server --version
  cd /tmp
  pslaunch --config=/usr/share/pstrain/configs/quadratic.textproto --epochs=1 | tail -n 1
  mkdir /tmp/python-job && cd /tmp/python-job
  pslaunch --ps=1 --workers=2 --learning_rate=0.1 -- python3 /tmp/numpy_train.py
' >"$SCRATCH/container.log" 2>&1 || fail "install in a clean container: $(tail -n 20 "$SCRATCH/container.log")"
grep -q "^installed: pstrain .* install ok installed$" "$SCRATCH/container.log" ||
  fail "dpkg does not list pstrain as installed: $(cat "$SCRATCH/container.log")"
grep -q "^ps_server (pstrain) [0-9]" "$SCRATCH/container.log" ||
  fail "no ps_server --version line: $(cat "$SCRATCH/container.log")"
grep -q '^{"mode":' "$SCRATCH/container.log" || fail "no job summary: $(cat "$SCRATCH/container.log")"
# Both Python workers imported the packaged module and brought the error down.
trained=$(grep -c "module /usr/lib/python3/dist-packages/pstrain/__init__.py error" "$SCRATCH/container.log" || true)
[ "$trained" -eq 2 ] || fail "$trained of 2 Python workers imported the installed module: $(tail -n 20 "$SCRATCH/container.log")"
sed -n 's/.*error \([0-9.]*\) -> \([0-9.]*\)$/\1 \2/p' "$SCRATCH/container.log" |
  awk '{ if ($2 >= $1 / 2) bad = 1 } END { exit bad }' ||
  fail "the Python workers did not train: $(grep ' error ' "$SCRATCH/container.log")"
say "$(basename "$DEB") in a clean $IMAGE container: dpkg -i, ps_server --version, a loopback job and 2 Python workers ran"
say "$(grep '^{"mode":' "$SCRATCH/container.log" | head -n 1)"
say "$(grep ' error ' "$SCRATCH/container.log" | head -n 1)"
