#!/usr/bin/env bash
# A cluster across shaped links on one machine: K ps_server shards and N
# workers, each in a network namespace of its own, joined through a bridge
# whose every port is shaped to RATE each way, with a quarter of RTT of delay
# each way where the kernel has netem (scripts/netns_lib.sh). Every byte between tasks crosses two
# shaped ports, as between two hosts behind one switch; tensors go over TCP
# (shared memory is off). Prints one JSON row, with the CPU the shards, the
# workers and the whole machine used beside the throughput. Needs root;
# removes its namespaces and stops its processes on exit, also when killed.
#
# Usage:
#   sudo scripts/netns_cluster.sh bench --shards=K --workers=N --size=4MiB \
#        [--rate=200mbit] [--rtt=200us] [--seconds=4] [--exchange=push_pull]
#     N ps_bench processes of one worker each against K shards (ASYNC, SGD),
#     measuring over the same window; the row has each worker's step time
#     (median round trip) and the wire bytes all of them moved per second.
#   sudo scripts/netns_cluster.sh train --shards=K --workers=N [--rate=...] [--rtt=...] \
#        [--config=configs/local.textproto] [--epochs=1] [--mode=sync]
#     the config's training job (its cluster replaced); the row has the chief's
#     test accuracy, the steps, the wall time and the samples per second.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/netns_lib.sh
PROGRAM=netns_cluster.sh
PYTHON=/usr/bin/python3
BIN=${PST_BIN_DIR:-build/bin}  # ps_server, ps_bench and worker

usage() {
  sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
KIND=$1
shift
[[ $KIND == bench || $KIND == train ]] || usage
SHARDS=1 WORKERS=1 SIZE=4MiB RATE=200mbit RTT='' SECONDS_=4 EXCHANGE=push_pull
CONFIG=configs/local.textproto EPOCHS=1 MODE=sync
for arg in "$@"; do
  case $arg in
    --shards=*) SHARDS=${arg#*=} ;;
    --workers=*) WORKERS=${arg#*=} ;;
    --size=*) SIZE=${arg#*=} ;;
    --rate=*) RATE=${arg#*=} ;;
    --rtt=*) RTT=${arg#*=} ;;
    --seconds=*) SECONDS_=${arg#*=} ;;
    --exchange=*) EXCHANGE=${arg#*=} ;;
    --config=*) CONFIG=${arg#*=} ;;
    --epochs=*) EPOCHS=${arg#*=} ;;
    --mode=*) MODE=${arg#*=} ;;
    *) echo "$PROGRAM: unknown argument $arg" >&2; usage ;;
  esac
done
bad() { echo "$PROGRAM: $1" >&2; exit 2; }
[[ $SHARDS =~ ^[1-9][0-9]?$ ]] || bad "--shards=$SHARDS: give 1 to 99"
[[ $WORKERS =~ ^[1-9][0-9]?$ ]] || bad "--workers=$WORKERS: give 1 to 99"
((SHARDS + WORKERS <= 250)) || bad "--shards + --workers: at most 250 (one /24 of addresses)"
[[ $RATE =~ ^[0-9]+(kbit|mbit|gbit)$ ]] || bad "--rate=$RATE: give a rate such as 200mbit"
[[ $SECONDS_ =~ ^[0-9]+([.][0-9]+)?$ ]] || bad "--seconds=$SECONDS_: give a number"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || bad "--epochs=$EPOCHS: give a whole number from 1"
netns_require_root "$PROGRAM"
for bin in "$BIN/ps_server" "$BIN/ps_bench" "$BIN/worker"; do
  [[ -x $bin ]] || { echo "$PROGRAM: $bin is missing; run scripts/build.sh first" >&2; exit 1; }
done
# One direction of one port: a quarter of the round trip.
DELAY=
if [[ -n $RTT ]]; then
  DELAY=$($PYTHON -c "import re,sys; v,u=re.fullmatch(r'([0-9.]+)(us|ms|s)','$RTT').groups(); print('%dus' % max(1,round(float(v)*{'us':1,'ms':1e3,'s':1e6}[u]/4)))" 2>/dev/null) ||
    { echo "$PROGRAM: --rtt=$RTT: give a time such as 200us or 1ms" >&2; exit 2; }
fi

# A shard takes the whole model in one Init request when it is that big.
SIZE_BYTES=$($PYTHON -c "
import re; v,u=re.fullmatch(r'([0-9]+)(B|KiB|MiB|GiB)','$SIZE').groups()
print(int(v)*{'B':1,'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}[u])" 2>/dev/null) ||
  { echo "$PROGRAM: --size=$SIZE: give a size such as 4MiB" >&2; exit 2; }
MAX_MESSAGE=$((SIZE_BYTES + (8 << 20) > (256 << 20) ? SIZE_BYTES + (8 << 20) : (256 << 20)))
NETNS_TAG=pst$$
SCRATCH=$(mktemp -d)
cleanup() {
  netns_down
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

PORT=50071
netns_switch_up
if [[ -n $DELAY ]] && ! netns_have_netem; then
  echo "$PROGRAM: --rtt needs the netem qdisc (sch_netem), which this kernel lacks; leave --rtt out to shape the rate alone" >&2
  exit 2
fi
PS_LIST=()
for ((k = 0; k < SHARDS; k++)); do
  netns_node_up "ps$k" "$k" "$RATE" "$DELAY"
  PS_LIST+=("$(netns_address "$k"):$PORT")
done
for ((w = 0; w < WORKERS; w++)); do
  netns_node_up "wk$w" "$((SHARDS + w))" "$RATE" "$DELAY"
done

# The job: the config's training block under a cluster of these namespaces.
CLUSTER=$(printf 'ps: "%s" ' "${PS_LIST[@]}")
if [[ $KIND == bench ]]; then
  cat > "$SCRATCH/job.textproto" <<EOF
cluster { $CLUSTER workers: $WORKERS shm: SHM_OFF worker_command: "ps_bench" }
training { mode: ASYNC optimizer { sgd { learning_rate: 1.0 } } batch_size: 64 epochs: 1
  model { mlp { hidden: 16 } } dataset { fashion_mnist {} } }
EOF
else
  $PYTHON - "$CONFIG" "$CLUSTER workers: $WORKERS shm: SHM_OFF" > "$SCRATCH/job.textproto" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r'^cluster\s*\{.*?^\}', '', text, flags=re.S | re.M)
print('cluster { %s }\n%s' % (sys.argv[2], text))
EOF
fi
SHARD_PIDS=()
for ((k = 0; k < SHARDS; k++)); do
  netns_spawn "ps$k" "$SCRATCH/ps$k.log" "$BIN/ps_server" --config="$SCRATCH/job.textproto" \
    --task="ps:$k" --allow_insecure --port_file="$SCRATCH/ps$k.port" \
    --max_message_bytes="$MAX_MESSAGE"
  SHARD_PIDS+=("$NETNS_LAST_PID")
done
for ((k = 0; k < SHARDS; k++)); do
  for ((tries = 0; tries < 300; tries++)); do
    [[ -e $SCRATCH/ps$k.port ]] && break
    kill -0 "${SHARD_PIDS[$k]}" 2>/dev/null ||
      { echo "$PROGRAM: ps:$k exited:" >&2; cat "$SCRATCH/ps$k.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -e $SCRATCH/ps$k.port ]] || { echo "$PROGRAM: ps:$k did not start in 30 s" >&2; exit 1; }
done

# CPU seconds of this shell's children that have exited (bash's times): the
# workers, once waited for; the shards are still running and not counted.
# Called in this shell, never in $(...), whose subshell has children of its own.
children_cpu_seconds() {
  times > "$SCRATCH/times"
  sed -n 2p "$SCRATCH/times" | tr -d 's' | awk '{ split($1, u, "m"); split($2, s, "m");
    printf "%.3f\n", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' > "$SCRATCH/children_cpu"
}

WORKER_PIDS=()
if [[ $KIND == bench ]]; then
  # Each ps_bench says it is ready on one FIFO and starts on a line on its own.
  mkfifo "$SCRATCH/ready"
  exec {ready_fd}<>"$SCRATCH/ready"
  GO_FDS=()
  PS_ARG=$(IFS=,; echo "${PS_LIST[*]}")
  for ((w = 0; w < WORKERS; w++)); do
    mkfifo "$SCRATCH/go$w"
    ip netns exec "${NETNS_TAG}_wk$w" "$BIN/ps_bench" --ps="$PS_ARG" --sizes="$SIZE" \
      --workers=1 --first_worker="$w" --transport=tcp --exchange="$EXCHANGE" \
      --seconds="$SECONDS_" --iperf=false --json --ready_file="$SCRATCH/ready" \
      < "$SCRATCH/go$w" > "$SCRATCH/bench$w.json" 2> "$SCRATCH/bench$w.log" &
    WORKER_PIDS+=($!)
    NETNS_PIDS+=($!)
    exec {fd}>"$SCRATCH/go$w"
    GO_FDS+=("$fd")
  done
  # A ps_bench that exits before it is ready fails the row at once.
  for ((w = 0, waited = 0; w < WORKERS; )); do
    if read -r -t 1 -u "$ready_fd" _; then
      ((++w))
      continue
    fi
    for pid in "${WORKER_PIDS[@]}"; do
      netns_running "$pid" ||
        { echo "$PROGRAM: a ps_bench exited before it was ready:" >&2;
          cat "$SCRATCH"/bench*.log >&2; exit 1; }
    done
    ((++waited < 600)) || { echo "$PROGRAM: the ps_bench processes were not ready in 600 s" >&2; exit 1; }
  done
  for fd in "${GO_FDS[@]}"; do echo go >&"$fd"; done
fi
START=$(date +%s.%N)
CPU_PS_0=$(netns_cpu_seconds "${SHARD_PIDS[@]}")
MACHINE_0=$(netns_machine_busy_seconds)
if [[ $KIND == bench ]]; then
  sleep "$SECONDS_"
  CPU_WK_0=0 CPU_WK_1=0
else
  for ((w = 0; w < WORKERS; w++)); do
    netns_spawn "wk$w" "$SCRATCH/wk$w.log" "$BIN/worker" --config="$SCRATCH/job.textproto" \
      --task="worker:$w" --epochs="$EPOCHS" --mode="$MODE" --result_file="$SCRATCH/wk$w.result"
    WORKER_PIDS+=("$NETNS_LAST_PID")
  done
  children_cpu_seconds
  CPU_WK_0=$(< "$SCRATCH/children_cpu")
  for ((w = 0; w < WORKERS; w++)); do
    wait "${WORKER_PIDS[$w]}" ||
      { echo "$PROGRAM: worker:$w failed:" >&2; tail -5 "$SCRATCH/wk$w.log" >&2; exit 1; }
  done
  children_cpu_seconds
  CPU_WK_1=$(< "$SCRATCH/children_cpu")
fi
END=$(date +%s.%N)
CPU_PS_1=$(netns_cpu_seconds "${SHARD_PIDS[@]}")
MACHINE_1=$(netns_machine_busy_seconds)
if [[ $KIND == bench ]]; then
  for pid in "${WORKER_PIDS[@]}"; do
    wait "$pid" || { echo "$PROGRAM: a ps_bench failed:" >&2; cat "$SCRATCH"/bench*.log >&2; exit 1; }
  done
fi

$PYTHON - "$KIND" "$SCRATCH" <<EOF
import glob, json, statistics, sys
kind, scratch = sys.argv[1], sys.argv[2]
window = $END - $START
row = {"kind": kind, "shards": $SHARDS, "workers": $WORKERS, "rate": "$RATE", "rtt": "${RTT:-none}",
       "seconds": round(window, 3)}
cpu_ps = ($CPU_PS_1 - $CPU_PS_0) / window
machine = ($MACHINE_1 - $MACHINE_0) / window
if kind == "bench":
    rows = [json.loads(l) for f in sorted(glob.glob(scratch + "/bench*.json"))
            for l in open(f) if l.startswith("{")]
    steps = sorted(r["p50_us"] / 1e3 for r in rows)
    cpu_wk = sum(r["cpu_us_per_round_trip"] * r["round_trips"] for r in rows) / 1e6 / window
    row.update(size="$SIZE", size_bytes=rows[0]["size_bytes"], exchange="$EXCHANGE",
               wire_bytes_per_step=rows[0]["wire_bytes_per_round_trip"],
               step_ms=round(statistics.median(steps), 2), slowest_step_ms=round(steps[-1], 2),
               gbytes_per_s=round(sum(r["push_pull_gbps"] for r in rows), 4),
               round_trips=sum(r["round_trips"] for r in rows),
               echo_us=round(statistics.median(r["echo_p50_us"] for r in rows), 1))
else:
    results = [json.load(open(f)) for f in sorted(glob.glob(scratch + "/wk*.result"))]
    chief = [r for r in results if r.get("task") == "worker:0"][0]
    steps = sum(int(r["steps"]) for r in results)
    samples = sum(int(r["samples"]) for r in results)
    longest = max(float(r["train_seconds"]) for r in results)
    row.update(mode="$MODE", epochs=$EPOCHS, test_accuracy=round(float(chief["test_accuracy"]), 4),
               worker_steps=steps, samples_per_s=round(samples / longest, 1),
               step_ms=round(longest / (steps / $WORKERS) * 1e3, 2))
    cpu_wk = ($CPU_WK_1 - $CPU_WK_0) / window
row.update(cpu_cores_ps=round(cpu_ps, 3),
           cpu_cores_workers=None if cpu_wk is None else round(cpu_wk, 3),
           cpu_cores_machine=round(machine, 3))
print(json.dumps(row))
EOF
