#!/usr/bin/env bash
# scripts/netns_cluster.sh with a backup per shard: 2 shards and 2 workers
# train the default model for one SYNC epoch (468 steps) twice, once without
# a failure and once with shard 0's primary cut off (its link down) at
# version 150 until its backup has taken over and training moved on. The
# partitioned run must see the backup take over, the old primary rejoin as
# a backup once healed, and end with the failure-free run's model bitwise
# (psctl export of the final checkpoints, on every replica) and its test
# accuracy. Needs root, etcd and curl (skipped, exit 77, otherwise).
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PROGRAM=netns_partition_test
skip() { echo "$PROGRAM: skipped: $1"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces"
[[ -x /usr/bin/etcd ]] || skip "needs /usr/bin/etcd for the shards' membership (apt-get install etcd-server)"
command -v curl > /dev/null || skip "needs curl to read the replicas' metrics"
export PST_BIN_DIR=$BUILD_DIR/bin
SCRIPT=$REPO/scripts/netns_cluster.sh
CUT_AT=150

WORK=$(mktemp -d)
RUN='' WATCHDOG=''
cleanup() {
  if [[ -n $WATCHDOG ]]; then kill "$WATCHDOG" 2>/dev/null || true; fi
  if [[ -n $RUN ]]; then
    # SIGTERM: the script stops its processes and removes its namespaces.
    kill -TERM "$RUN" 2>/dev/null || true
    wait "$RUN" 2>/dev/null || true
    # What a run killed outright would leave.
    local ns
    for ns in $(ip netns list | awk -v tag="pst${RUN}_" 'index($1, tag) == 1 { print $1 }'); do
      ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# run NAME ARGS...: one training run in the background (so that a signal to
# this test reaches cleanup at once), at most 280 s; its row in NAME.row.
run() {
  local name=$1 status=0 ended=''
  shift
  "$SCRIPT" train --shards=2 --workers=2 --backups=1 --mode=sync --epochs=1 --rate=1gbit "$@" \
    > "$WORK/$name.out" 2> "$WORK/$name.err" &
  RUN=$!
  sleep 280 &
  WATCHDOG=$!
  wait -n -p ended "$RUN" "$WATCHDOG" || status=$?
  if [[ $ended == "$WATCHDOG" ]]; then
    echo "$PROGRAM: the $name run took over 280 s; stopping it" >&2
    kill -TERM "$RUN"
    wait "$RUN" || true
    status=124
  else
    kill "$WATCHDOG"
    wait "$WATCHDOG" 2>/dev/null || true
  fi
  RUN='' WATCHDOG=''
  cat "$WORK/$name.err" >&2
  if ((status != 0)); then
    echo "$PROGRAM: the $name run failed (exit $status)" >&2
    exit 1
  fi
  tail -1 "$WORK/$name.out" > "$WORK/$name.row"
  cat "$WORK/$name.row"
}

run quiet
run partitioned --partition="$CUT_AT"
/usr/bin/python3 - "$WORK/quiet.row" "$WORK/partitioned.row" "$CUT_AT" <<'PY'
import json, sys
quiet, cut = (json.load(open(f)) for f in sys.argv[1:3])
cut_at = int(sys.argv[3])
for row in (quiet, cut):
    assert row["backups"] == 1 and row["shards"] == 2 and row["workers"] == 2, row
    assert row["test_accuracy"] >= 0.80, "accuracy %s < 0.80" % row["test_accuracy"]
    assert len(row["model_sha256"]) == 64, row
    # Each replica's final checkpoints hold the primary's model.
    assert row["replicas_agree"], row
assert "partition" not in quiet, quiet
p = cut["partition"]
assert p["cut_at_version"] >= cut_at, p
assert p["new_primary_replica"] == 1, "no backup took over: %s" % p
# The lease is 1 s: the backup takes over within a few.
assert p["new_primary_after_s"] is not None and p["new_primary_after_s"] < 10, p
assert p["moved_on_after_s"] is not None, "training did not go on while cut off: %s" % p
assert p["healed"] and p["rejoined"], "the old primary did not rejoin: %s" % p
# SYNC: the step the cut interrupted is sent again, unchanged, to the new
# primary, so the run ends bitwise as without the cut.
assert cut["worker_steps"] == quiet["worker_steps"], (quiet, cut)
assert cut["model_sha256"] == quiet["model_sha256"], "the models differ: %s vs %s" % (quiet, cut)
assert cut["test_accuracy"] == quiet["test_accuracy"], (quiet, cut)
print("netns_partition_test: ok (cut at version %d, new primary after %.2f s, training on after "
      "%.2f s, rejoined %.2f s after the heal; model %s in both runs)"
      % (p["cut_at_version"], p["new_primary_after_s"], p["moved_on_after_s"],
         p["rejoined_after_s"], cut["model_sha256"][:12]))
PY
