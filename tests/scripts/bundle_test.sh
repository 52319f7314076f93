#!/usr/bin/env bash
# The relocatable bundle runs where none of our dependencies are: it is
# unpacked into an empty root holding only a static busybox as /bin/sh, and a
# real (tiny) training job runs there through pslaunch under chroot.
# Needs root (for chroot) and busybox-static, both given in CI.
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$REPO/scripts/make_bundle.sh" "$BUILD_DIR" "$WORK/bundle.tar.gz"
mkdir -p "$WORK/root/bin" "$WORK/root/tmp"
cp /bin/busybox "$WORK/root/bin/sh"
tar -C "$WORK/root" -xzf "$WORK/bundle.tar.gz"
# Nothing from the host's library directories is there.
[ ! -e "$WORK/root/usr/lib" ] && [ ! -e "$WORK/root/lib/x86_64-linux-gnu" ]
# A CUDA build ships its CUDA runtime and cuBLAS, never the driver.
if ldd "$BUILD_DIR/bin/worker" | grep -q libcublas; then
  for lib in libcudart.so libcublas.so libcublasLt.so; do
    ls "$WORK/root/pstrain/lib/$lib".* >/dev/null || { echo "bundle_test: $lib missing from the bundle" >&2; exit 1; }
  done
  if ls "$WORK/root/pstrain/lib/libcuda.so"* >/dev/null 2>&1; then
    echo "bundle_test: the bundle must not carry the driver (libcuda.so)" >&2; exit 1
  fi
  echo "bundle_test: CUDA runtime and cuBLAS bundled"
fi

# A free loopback port for the PS, in a config written for the job.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed "s/127.0.0.1:50061/127.0.0.1:$PORT/" "$REPO/configs/quadratic.textproto" > "$WORK/root/job.textproto"

OUT=$(timeout 120 chroot "$WORK/root" /pstrain/bin/pslaunch --config=/job.textproto --epochs=5)
echo "$OUT" | tail -3
SUMMARY=$(echo "$OUT" | tail -1)
case "$SUMMARY" in
  '{"mode":"sync","workers":2,"epochs":5,'*) echo "bundle_test: ok" ;;
  *) echo "bundle_test: unexpected summary: $SUMMARY" >&2; exit 1 ;;
esac
