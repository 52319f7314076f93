#!/usr/bin/env bash
# scripts/netns_cluster.sh: 2 shards and 3 workers, each in a network
# namespace behind a shaped port, train the default model for one epoch to
# its usual accuracy; a bench row (the cost model's measurement) moves its
# tensors across the links; scripts/netns_bench.sh puts iperf3 and one
# shard with one worker over the same link; then a run killed mid-training
# leaves no namespace, veth or process behind. Needs root (skipped, exit 77,
# otherwise).
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) != 0 ]]; then
  echo "netns_cluster_test: skipped: needs root to create network namespaces"
  exit 77
fi
export PST_BIN_DIR=$BUILD_DIR/bin
SCRIPT=$REPO/scripts/netns_cluster.sh

ROW=$(timeout 300 "$SCRIPT" train --shards=2 --workers=3 --rate=1gbit --epochs=1 | tail -1)
echo "$ROW"
/usr/bin/python3 - "$ROW" <<'PY'
import json, sys
row = json.loads(sys.argv[1])
assert row["shards"] == 2 and row["workers"] == 3, row
assert row["test_accuracy"] >= 0.80, "accuracy %s < 0.80" % row["test_accuracy"]
assert row["worker_steps"] > 0 and row["cpu_cores_machine"] > 0, row
PY

# A bench row: 2 ps_bench workers push and pull 1 MiB through 2 shards.
ROW=$(timeout 120 "$SCRIPT" bench --shards=2 --workers=2 --size=1MiB --rate=1gbit --seconds=1 | tail -1)
echo "$ROW"
/usr/bin/python3 - "$ROW" <<'PY'
import json, sys
row = json.loads(sys.argv[1])
assert row["kind"] == "bench" and row["shards"] == 2 and row["workers"] == 2, row
assert row["round_trips"] > 0 and row["gbytes_per_s"] > 0, row
PY

# netns_bench.sh: a row per size, ours and iperf3's bytes both across the link.
ROWS=$(timeout 120 "$REPO/scripts/netns_bench.sh" --rate=1gbit --sizes=1MiB,2MiB --seconds=1)
echo "$ROWS"
/usr/bin/python3 - "$ROWS" <<'PY'
import json, sys
rows = [json.loads(line) for line in sys.argv[1].splitlines() if line.startswith("{")]
assert [r["size"] for r in rows] == ["1MiB", "2MiB"], rows
for r in rows:
    assert r["rate"] == "1gbit", r
    assert r["ours_gbps"] > 0 and r["iperf3_gbps"] > 0, r
    # A 1 Gbit/s port each way carries at most 0.25 GB/s both ways: the
    # bytes crossed the shaped link, not loopback or shared memory.
    assert r["ours_gbps"] < 0.26 and r["iperf3_gbps"] < 0.26, r
    assert abs(r["of_iperf3"] - r["ours_gbps"] / r["iperf3_gbps"]) < 0.01, r
PY

# Killed mid-run: once all three workers run (each namespace has a process
# of its own), SIGTERM the script, then look for what it made.
"$SCRIPT" train --shards=2 --workers=3 --rate=1gbit --epochs=5 > /dev/null 2>&1 &
RUN=$!
TAG=pst$RUN
PIDS=()
for ((tries = 0; tries < 600; tries++)); do
  mapfile -t PIDS < <(for w in 0 1 2; do ip netns pids "${TAG}_wk$w" 2>/dev/null; done)
  ((${#PIDS[@]} >= 3)) && break
  kill -0 "$RUN" 2>/dev/null || { echo "netns_cluster_test: the run ended before its workers started" >&2; exit 1; }
  sleep 0.1
done
((${#PIDS[@]} >= 3)) || { kill "$RUN"; echo "netns_cluster_test: no workers after 60 s" >&2; exit 1; }
mapfile -t -O "${#PIDS[@]}" PIDS < <(for k in 0 1; do ip netns pids "${TAG}_ps$k"; done)
kill -TERM "$RUN"
wait "$RUN" || true
LEFT=$(ip netns list | grep -c "^${TAG}_" || true)
[[ $LEFT == 0 ]] || { echo "netns_cluster_test: $LEFT namespace(s) left: $(ip netns list | grep "^${TAG}_")" >&2; exit 1; }
if ip -o link | grep -E "[ns][0-9]+_${RUN}[@:]"; then
  echo "netns_cluster_test: veths left in the root namespace" >&2; exit 1
fi
for pid in "${PIDS[@]}"; do
  if kill -0 "$pid" 2>/dev/null; then
    echo "netns_cluster_test: process $pid ($(cat "/proc/$pid/comm")) left running" >&2; exit 1
  fi
done
echo "netns_cluster_test: ok (${#PIDS[@]} processes stopped, no namespace or veth left)"
