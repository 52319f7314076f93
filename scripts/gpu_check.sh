#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, run from a bundle on the GPU machine
# itself, which needs none of our build dependencies:
#
#   here:  cmake --build build     # a CUDA build (nvcc present)
#          PST_BUNDLE_TESTS=cuda_kernels_test PST_BUNDLE_CUDA=host \
#             scripts/make_bundle.sh build gpu.tar.gz
#   there: tar xzf gpu.tar.gz && pstrain/gpu_check.sh pstrain OUT_DIR
#
# Runs every CUDA test (cuda_kernels_test: the kernels, the embedding bags,
# the MLP, towers and CTR models against the CPU), then trains the default
# job and the CTR job with their workers on GPU 0, and the CTR job once more
# on the CPU beside it. Each log goes to OUT_DIR; the last lines summarise.
# Exits non-zero when a test fails or a job does not finish.
set -uo pipefail
BUNDLE=$(cd "${1:?usage: gpu_check.sh BUNDLE_DIR OUT_DIR}" && pwd)
OUT=${2:?usage: gpu_check.sh BUNDLE_DIR OUT_DIR}
mkdir -p "$OUT"
BIN=$BUNDLE/bin
failed=()
summary=()

if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: nvidia-smi not found: no NVIDIA driver on this machine; run it on the GPU machine" >&2
  exit 2
fi
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1; then
  echo "gpu_check: no NVIDIA GPU answers here (nvidia-smi: $(head -n 1 "$OUT/gpu.txt")); run it on the GPU machine" >&2
  exit 2
fi
cat "$OUT/gpu.txt"

# run NAME SECONDS COMMAND...: the command's output in OUT/NAME.log.
run() {
  local name=$1 seconds=$2
  shift 2
  local start=$SECONDS rc=0
  timeout -k 10 "$seconds" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  echo "gpu_check: $name exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || { failed+=("$name"); tail -n 20 "$OUT/$name.log"; }
}

run cuda_kernels_test 300 "$BIN/cuda_kernels_test"
summary+=("cuda_kernels_test: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$OUT/cuda_kernels_test.log" | tr '\n' ' ')")

# The default job (1 PS, 2 workers), both workers on GPU 0; Fashion-MNIST
# from $FASHION_MNIST_DIR when the machine keeps it elsewhere.
config=$OUT/local.textproto
sed "s#/usr/share/datasets/fashion-mnist#${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}#" \
  "$BUNDLE/configs/local.textproto" >"$config"
run mlp_gpu 300 "$BIN/pslaunch" --config="$config" --device=gpu:0 --epochs=3
summary+=("default job on gpu:0: $(grep -E '^\{"mode"' "$OUT/mlp_gpu.log" | tail -n 1)")

# The CTR job (2 PS, 2 workers, SYNC), its lookups as CUDA kernels; then on
# the CPU for the same AUC.
for device in gpu:0 cpu; do
  name=ctr_${device%%:*}
  run "$name" 300 "$BIN/pslaunch" --config="$BUNDLE/configs/ctr.textproto" --device="$device"
  summary+=("ctr job on $device: $(grep -E '^\{"mode"' "$OUT/$name.log" | tail -n 1)")
done

printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "gpu_check: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "gpu_check: every check passed"
