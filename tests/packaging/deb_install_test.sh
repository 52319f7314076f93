#!/usr/bin/env bash
# The Debian package installed in a clean Debian 12 container: `dpkg -i`,
# then apt-get fetches the Depends dpkg names (so the container needs the
# Debian mirror), then the installed ps_server answers --version and
# pslaunch runs a loopback job (configs/quadratic.textproto) to its summary
# line.
#
# Needs a Docker engine with the debian:bookworm image, which
# tests/docker/compose_test.sh starts and makes (and then runs this); skips
# (exit 0), saying why, without them. DEB is the package to install; without
# it, `cpack -G DEB` makes one from BUILD_DIR (a CUDA build, which cpack
# refuses, and a directory without a build are skipped, saying why).
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
chmod 644 "$SCRATCH/pstrain.deb"

# dpkg -i stops at the Depends a clean system lacks; apt-get -f installs
# them and finishes the configuration. The host's network: the mirror is
# reached without a bridge, and the job binds loopback ports the system picks.
"$DOCKER" run --rm --network host -v "$SCRATCH/pstrain.deb:/tmp/pstrain.deb:ro" "$IMAGE" sh -ec '
  apt-get update -qq
  dpkg -i /tmp/pstrain.deb >/dev/null 2>&1 || echo "dpkg -i: Depends missing, as on any clean system"
  DEBIAN_FRONTEND=noninteractive apt-get install -f -y -qq --no-install-recommends >/dev/null
  dpkg-query -W -f="installed: \${Package} \${Version} \${Status}\n" pstrain
  ps_server --version
  cd /tmp
  pslaunch --config=/usr/share/pstrain/configs/quadratic.textproto --epochs=1 | tail -n 1
' >"$SCRATCH/container.log" 2>&1 || fail "install in a clean container: $(tail -n 20 "$SCRATCH/container.log")"
grep -q "^installed: pstrain .* install ok installed$" "$SCRATCH/container.log" ||
  fail "dpkg does not list pstrain as installed: $(cat "$SCRATCH/container.log")"
grep -q "^ps_server (pstrain) [0-9]" "$SCRATCH/container.log" ||
  fail "no ps_server --version line: $(cat "$SCRATCH/container.log")"
grep -q '^{"mode":' "$SCRATCH/container.log" || fail "no job summary: $(cat "$SCRATCH/container.log")"
say "$(basename "$DEB") in a clean $IMAGE container: dpkg -i, ps_server --version and a loopback job ran"
say "$(grep '^{"mode":' "$SCRATCH/container.log")"
