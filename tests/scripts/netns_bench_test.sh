#!/usr/bin/env bash
# scripts/netns_bench.sh: iperf3 and one shard with one ps_bench worker over
# the same shaped link print one row per size, both having moved bytes
# across it. Needs root (skipped, exit 77, otherwise).
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) != 0 ]]; then
  echo "netns_bench_test: skipped: needs root to create network namespaces"
  exit 77
fi
export PST_BIN_DIR=$BUILD_DIR/bin
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
echo "netns_bench_test: ok"
