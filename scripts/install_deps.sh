#!/usr/bin/env bash
# Installs the Debian 12 packages this project builds and runs with, skipping
# the ones already present. Runs apt-get as root, or through sudo.
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev zlib1g-dev
  libssl-dev          # HMAC-SHA256 of the task tokens (gRPC's own TLS library)
  libmicrohttpd-dev   # the Prometheus /metrics endpoint of ps_server and worker
  libopenblas-dev     # the CPU backend's matrix products (CBLAS)
  dataset-fashion-mnist
  # The Python module (python/): its bindings and the interpreter it is
  # built for; NumPy for its arrays, PyTorch for pstrain.torch, the CNN
  # example and their tests.
  pybind11-dev python3-dev python3-numpy python3-torch
  # Tests only: a static /bin/sh for the empty root the bundle test runs in,
  # and python3 to pick a free port there.
  busybox-static python3
  # scripts/lint.sh and scripts/fuzz.sh: clang (its lock-annotation checks;
  # libFuzzer), its libFuzzer runtime and llvm-symbolizer
  # (for symbolized sanitizer stacks). g++ already brings the runtimes that
  # scripts/sanitize.sh needs.
  clang libclang-rt-14-dev llvm
  # Tests only: certificates for the TLS tests, and YAML parsing for the
  # offline check of deploy/k8s and docker/.
  openssl python3-yaml
  # Benchmarks only: ps_bench's loopback TCP baseline, and the metrics
  # library metrics_bench compares our registry with.
  iperf3 prometheus-cpp-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 2; }
  SUDO="sudo"
fi
echo "install_deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
