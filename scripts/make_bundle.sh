#!/usr/bin/env bash
# Makes a self-contained tarball of the executables for Linux x86-64 machines
# that have none of our dependencies (no gRPC, protobuf, Abseil, spdlog, not
# even the same glibc): only a kernel, /bin/sh and, for GPU workers, the
# NVIDIA driver.
#
#   scripts/make_bundle.sh [BUILD_DIR] [OUTPUT.tar.gz]
#
# Layout of the tarball (pstrain/):
#   bin/<tool>      small sh launchers: run libexec/<tool> with the bundled
#                   dynamic loader and libraries
#   libexec/<tool>  the executables (RPATH $ORIGIN/../lib)
#   lib/            every shared library they load, glibc and the CUDA
#                   runtime/cuBLAS included; the driver (libcuda.so.1) is the
#                   one thing taken from the host
#   configs/        the example configs
#   gpu_check.sh    the GPU checks (scripts/gpu_check.sh), for a bundle
#                   made with the CUDA tests
#
# Environment:
#   PST_BUNDLE_TESTS="cuda_kernels_test ..."  also bundle these test
#                        executables ("all": every *_test), to run them on
#                        the target machine
#   PST_BUNDLE_CUDA=host leave the CUDA runtime and cuBLAS out (cuBLASLt
#                        alone is over 500 MB) and take them from the
#                        target's toolkit, $CUDA_HOME (default
#                        /usr/local/cuda): lib64/, lib/ or
#                        targets/x86_64-linux/lib/
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
OUTPUT=${2:-pstrain-bundle-$(uname -m).tar.gz}
[ -x "$BUILD_DIR/bin/worker" ] || { echo "make_bundle: build first (scripts/build.sh); no $BUILD_DIR/bin/worker" >&2; exit 2; }

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/pstrain
mkdir -p "$ROOT/bin" "$ROOT/libexec" "$ROOT/lib" "$ROOT/configs"

# Executables: everything in bin/ that is an ELF file, tests excepted.
TOOLS=()
for f in "$BUILD_DIR"/bin/*; do
  name=$(basename "$f")
  case "$name" in
    *_test) [ "${PST_BUNDLE_TESTS:-}" = all ] || [[ " ${PST_BUNDLE_TESTS:-} " == *" $name "* ]] || continue ;;
  esac
  head -c 4 "$f" | grep -q ELF || continue
  cp "$f" "$ROOT/libexec/$name"
  TOOLS+=("$name")
done

# Libraries: the transitive closure ldd reports, minus the GPU driver, which
# must match the host's kernel module.
for tool in "${TOOLS[@]}"; do
  ldd "$ROOT/libexec/$tool" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libcuda.so*|libnvidia*) continue ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*) [ "${PST_BUNDLE_CUDA:-}" = host ] && continue ;;
  esac
  cp -L "$lib" "$ROOT/lib/"
done
LOADER=$(basename "$(ldd "$ROOT/libexec/${TOOLS[0]}" | awk '$1 ~ /^\/.*ld-linux/ { print $1 }')")
[ -f "$ROOT/lib/$LOADER" ] || { echo "make_bundle: cannot find the dynamic loader" >&2; exit 1; }

# Expanded by the launcher where it runs, not here.
LIBRARY_PATH='$here/../lib'
if [ "${PST_BUNDLE_CUDA:-}" = host ]; then
  for dir in lib64 lib targets/x86_64-linux/lib; do
    LIBRARY_PATH="$LIBRARY_PATH"':${CUDA_HOME:-/usr/local/cuda}/'"$dir"
  done
fi
for tool in "${TOOLS[@]}"; do
  extra=""
  # pslaunch finds ps_server and worker next to itself; under the bundled
  # loader /proc/self/exe names the loader, so say where they are.
  [ "$tool" = pslaunch ] && extra=' --bin_dir="$here"'
  cat > "$ROOT/bin/$tool" <<LAUNCHER
#!/bin/sh
# Runs $tool with the bundled loader and libraries (see make_bundle.sh).
case "\$0" in */*) here=\${0%/*} ;; *) here=\$(command -v "\$0"); here=\${here%/*} ;; esac
here=\$(cd "\$here" && pwd)
exec "\$here/../lib/$LOADER" --library-path "$LIBRARY_PATH" "\$here/../libexec/$tool"$extra "\$@"
LAUNCHER
  chmod +x "$ROOT/bin/$tool"
done
cp configs/*.textproto "$ROOT/configs/"
cp scripts/gpu_check.sh "$ROOT/"
tar -C "$STAGE" -czf "$OUTPUT" pstrain
echo "make_bundle: wrote $OUTPUT ($(du -h "$OUTPUT" | cut -f1), ${#TOOLS[@]} tools, $(ls "$ROOT/lib" | wc -l) libraries)"
