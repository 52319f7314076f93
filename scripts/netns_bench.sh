#!/usr/bin/env bash
# The data plane across a real link rather than loopback: a ps_server in one
# network namespace and ps_bench in another, joined by a veth pair shaped to
# RATE in each direction (as a NIC is: the two directions do not share
# bandwidth). Prints iperf3 over the link one way and both ways at once, then
# ps_bench's push+pull per size with each exchange (push_then_pull: a Push,
# then a Pull; push_pull: one PushPull call, which uses both directions at
# once). Needs root (ip netns, tc); removes its namespaces and stops its
# processes on exit.
#
# Usage: sudo scripts/netns_bench.sh [RATE=1gbit] [SIZES=4MiB,64MiB] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
SIZES=${2:-4MiB,64MiB}
ROUNDS=${3:-3}
PORT=50071
if [[ $(id -u) != 0 ]]; then
  echo "netns_bench.sh: needs root (it creates network namespaces and shapes a veth pair)" >&2
  exit 1
fi
for bin in build/bin/ps_server build/bin/ps_bench; do
  [[ -x $bin ]] || { echo "netns_bench.sh: $bin is missing; run scripts/build.sh first" >&2; exit 1; }
done

PS_NS=pst_bench_ps_$$
WK_NS=pst_bench_wk_$$
SCRATCH=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns del "$PS_NS" 2>/dev/null || true
  ip netns del "$WK_NS" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

ip netns add "$PS_NS"
ip netns add "$WK_NS"
ip link add pst_v0_$$ type veth peer name pst_v1_$$
ip link set pst_v0_$$ netns "$PS_NS"
ip link set pst_v1_$$ netns "$WK_NS"
ip -n "$PS_NS" addr add 10.99.0.1/24 dev pst_v0_$$
ip -n "$WK_NS" addr add 10.99.0.2/24 dev pst_v1_$$
for ns in "$PS_NS" "$WK_NS"; do ip -n "$ns" link set lo up; done
ip -n "$PS_NS" link set pst_v0_$$ up
ip -n "$WK_NS" link set pst_v1_$$ up
ip netns exec "$PS_NS" tc qdisc add dev pst_v0_$$ root tbf rate "$RATE" burst 256kb latency 50ms
ip netns exec "$WK_NS" tc qdisc add dev pst_v1_$$ root tbf rate "$RATE" burst 256kb latency 50ms

if command -v iperf3 >/dev/null; then
  for mode in "" "--bidir"; do
    ip netns exec "$PS_NS" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    PIDS+=($!)
    sleep 0.5
    echo "iperf3 ${mode:-one way} (1 MiB writes), GB/s per direction:"
    ip netns exec "$WK_NS" iperf3 -c 10.99.0.1 -p 5201 -l 1M -t 3 $mode -f g |
      awk '/receiver/ {printf "  %.3f\n", $(NF-2) / 8}'
  done
fi

cat > "$SCRATCH/job.textproto" <<EOF
cluster { ps: "10.99.0.1:$PORT" workers: 1 }
training {
  mode: ASYNC
  optimizer { sgd { learning_rate: 1.0 } }
  batch_size: 64
  epochs: 1
  seed: 1
  model { mlp { hidden: 16 } }
  dataset { fashion_mnist { dir: "/usr/share/datasets/fashion-mnist" } }
}
EOF
IFS=',' read -ra sizes <<< "$SIZES"
for size in "${sizes[@]}"; do
  # A shard keeps the first model it is given: a fresh one per size.
  ip netns exec "$PS_NS" build/bin/ps_server --config="$SCRATCH/job.textproto" --task=ps:0 \
    --allow_insecure > "$SCRATCH/ps_$size.log" 2>&1 &
  ps_pid=$!
  PIDS+=($ps_pid)
  sleep 1
  for ((round = 0; round < ROUNDS; round++)); do
    for exchange in push_then_pull push_pull; do
      ip netns exec "$WK_NS" build/bin/ps_bench --ps="10.99.0.1:$PORT" --sizes="$size" \
        --seconds=4 --iperf=false --json --exchange="$exchange"
    done
  done
  kill "$ps_pid"
  wait "$ps_pid" || true
done
