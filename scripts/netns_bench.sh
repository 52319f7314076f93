#!/usr/bin/env bash
# Our push+pull beside iperf3 across a shaped link. iperf3 --bidir runs
# between two network namespaces behind a bridge whose ports are shaped to
# RATE each way (scripts/netns_lib.sh); then, per size, scripts/netns_cluster.sh
# builds the same topology and runs one ps_server and one ps_bench worker
# across it (one PushPull a round trip over TCP, both directions at once).
# Prints one JSON row per size: both GB/s (both directions together), their
# ratio, the CPU cores the shard, the worker and the whole machine used, and
# the CPU per byte moved of the shard, the worker and iperf3's two ends
# together. Needs root; removes its namespaces and stops its processes on
# exit.
#
# Usage: sudo scripts/netns_bench.sh [--rate=1gbit] [--sizes=4MiB,64MiB] [--seconds=4]
#
# benchmarks/rounds.py alternates it over rounds and rates:
#   /usr/bin/python3 benchmarks/rounds.py --benchmark=netns_link --rounds=3 \
#       --vary=rate=1gbit,2gbit,4gbit,10gbit --keys=size_bytes --json=docs/bench/netns_link.json \
#       -- scripts/netns_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/netns_lib.sh
PROGRAM=netns_bench.sh
PYTHON=/usr/bin/python3
RATE=1gbit SIZES=4MiB,64MiB SECONDS_=4
for arg in "$@"; do
  case $arg in
    --rate=*) RATE=${arg#*=} ;;
    --sizes=*) SIZES=${arg#*=} ;;
    --seconds=*) SECONDS_=${arg#*=} ;;
    *) echo "$PROGRAM: unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ $RATE =~ ^[0-9]+(kbit|mbit|gbit)$ ]] || { echo "$PROGRAM: --rate=$RATE: give a rate such as 1gbit" >&2; exit 2; }
[[ $SECONDS_ =~ ^[1-9][0-9]*$ ]] || { echo "$PROGRAM: --seconds=$SECONDS_: give whole seconds" >&2; exit 2; }
netns_require_root "$PROGRAM"
command -v iperf3 >/dev/null || { echo "$PROGRAM: iperf3 is missing (apt-get install iperf3)" >&2; exit 1; }

NETNS_TAG=pstb$$
SCRATCH=$(mktemp -d)
cleanup() {
  netns_down
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# iperf3 both ways at once, 1 MiB writes, between two shaped ports.
netns_switch_up
netns_node_up ps 0 "$RATE"
netns_node_up wk 1 "$RATE"
netns_spawn ps "$SCRATCH/iperf_server.log" iperf3 -s -1 -p 5201
for ((tries = 0; ; tries++)); do
  # Refused until the server listens (an "error" in the JSON); then the one
  # test it serves.
  ip netns exec "${NETNS_TAG}_wk" iperf3 -c "$(netns_address 0)" -p 5201 -l 1M \
    -t "$SECONDS_" --bidir -J > "$SCRATCH/iperf.json" 2>&1 || true
  grep -q '"error"' "$SCRATCH/iperf.json" || break
  ((tries < 100)) || { echo "$PROGRAM: iperf3 failed:" >&2; cat "$SCRATCH/iperf.json" >&2; exit 1; }
  sleep 0.1
done
netns_down

IFS=',' read -ra sizes <<< "$SIZES"
for size in "${sizes[@]}"; do
  scripts/netns_cluster.sh bench --shards=1 --workers=1 --size="$size" --rate="$RATE" \
    --seconds="$SECONDS_" --exchange=push_pull | tail -n 1 > "$SCRATCH/ours_$size.json"
done

$PYTHON - "$SCRATCH" "$SIZES" <<'EOF'
import json, sys
scratch, sizes = sys.argv[1], sys.argv[2].split(",")
iperf = json.load(open(scratch + "/iperf.json"))["end"]
# Both directions' received bytes per second, as ps_bench counts both ways.
iperf3_gbps = (iperf["sum_received"]["bits_per_second"] +
               iperf["sum_received_bidir_reverse"]["bits_per_second"]) / 8e9
# Its client's and server's CPU, in percent of one core each.
cpu = iperf["cpu_utilization_percent"]
iperf3_cores = (cpu["host_total"] + cpu["remote_total"]) / 100
for size in sizes:
    ours = json.loads(open(f"{scratch}/ours_{size}.json").read())
    gbps = ours["gbytes_per_s"]
    print(json.dumps({
        "rate": ours["rate"], "size": size, "size_bytes": ours["size_bytes"],
        "ours_gbps": gbps, "iperf3_gbps": round(iperf3_gbps, 4),
        "of_iperf3": round(gbps / iperf3_gbps, 3), "step_ms": ours["step_ms"],
        "cpu_cores_ps": ours["cpu_cores_ps"], "cpu_cores_workers": ours["cpu_cores_workers"],
        "cpu_cores_machine": ours["cpu_cores_machine"],
        # cores / (GB/s): nanoseconds of CPU per byte moved, in + out.
        "ps_cpu_ns_per_byte": round(ours["cpu_cores_ps"] / gbps, 3),
        "worker_cpu_ns_per_byte": round(ours["cpu_cores_workers"] / gbps, 3),
        "iperf3_cpu_ns_per_byte": round(iperf3_cores / iperf3_gbps, 3)}))
EOF
