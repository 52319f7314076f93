#!/usr/bin/env bash
# Installs the Debian 12 packages this project builds, tests and runs with
# (with --job: only those the main job builds and runs with), skipping the
# ones already present. Runs apt-get as root, or through sudo.
set -euo pipefail

# What the main job needs to build and run (scripts/quickstart.sh passes
# --job and installs only these); the test framework is here too, because
# configuring the tree looks for it.
JOB_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev zlib1g-dev
  libssl-dev          # HMAC-SHA256 of the task tokens (gRPC's own TLS library)
  libmicrohttpd-dev   # the Prometheus /metrics endpoint of ps_server and worker
  prometheus-cpp-dev  # their metrics registry (labelled counters, gauges, histograms)
  libopenblas-dev     # the CPU backend's matrix products (CBLAS)
  librocksdb-dev      # an embedding table's disk tier (TableStorage.disk)
  dataset-fashion-mnist
)
# The rest: tests, checks and benchmarks (scripts/test.sh and CI).
CHECK_PACKAGES=(
  # Tests only: a static /bin/sh for the empty root the bundle test runs in,
  # and python3 to pick a free port there.
  busybox-static python3
  # scripts/lint.sh and scripts/fuzz.sh: clang (its lock-annotation checks;
  # libFuzzer), its libFuzzer runtime and llvm-symbolizer
  # (for symbolized sanitizer stacks). g++ already brings the runtimes that
  # scripts/sanitize.sh needs.
  clang libclang-rt-14-dev llvm
  # Tests only: certificates for the TLS tests, and YAML parsing for the
  # offline check of deploy/k8s, deploy/kubeflow and docker/.
  openssl python3-yaml
  # Tests only: dpkg-shlibdeps, which cpack -G DEB asks for the package's
  # Depends (tests/packaging/deb_package_test.sh).
  dpkg-dev
  # The Python module (python/): its bindings and the interpreter it is
  # built for; NumPy for its arrays, PyTorch for pstrain.torch, the CNN
  # example and their tests.
  pybind11-dev python3-dev python3-numpy python3-torch
  # `pip install .` of the module with Debian's setuptools, wheel and pip,
  # into a virtual environment (tests/packaging/pip_install_test.sh).
  python3-setuptools python3-wheel python3-pip python3-venv
  # The HTTP/2 relay deploy/relay/nghttpx.conf configures (nghttpx), which
  # ends the floods gRPC 1.51 does not bound; tests/scripts/relay_test.sh.
  nghttp2-proxy
  # etcd (its server and etcdctl), which holds replicated shards'
  # membership: pslaunch runs one for a job with backups, and the tests of
  # cluster/membership/ start their own. The main job needs none.
  etcd-server etcd-client
  # Benchmarks only: ps_bench's loopback TCP baseline.
  iperf3
  # Benchmarks only: the cost model's plot (scripts/cost_model_plot.py).
  python3-matplotlib
)
case "${1:-}" in
  --job) PACKAGES=("${JOB_PACKAGES[@]}") ;;
  "") PACKAGES=("${JOB_PACKAGES[@]}" "${CHECK_PACKAGES[@]}") ;;
  *) echo "install_deps: unknown argument \"$1\"; use --job (the main job's packages only) or nothing (all)" >&2; exit 2 ;;
esac

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
