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
#        [--config=configs/local.textproto] [--epochs=1] [--mode=sync] \
#        [--backups=0] [--partition=V]
#     the config's training job (its cluster replaced, its checkpoint
#     directory one of its own); the row has the chief's test accuracy (a
#     click model: test AUC and log-loss), the steps, the wall time, the
#     samples per second, and model_sha256: the sha256 of the model psctl
#     export takes out of the final checkpoints of every shard's primary.
#     --backups=B: B backups per shard (ps_server --replica), each in a
#       namespace of its own, and an etcd holding the membership (1 s
#       leases) in another; the CPU of the shards counts the backups, and
#       replicas_agree says whether every replica's final checkpoints hold
#       that same model.
#     --partition=V (with --backups): once shard 0's primary reaches version
#       V its link goes down; once a backup is primary and training moved on,
#       the link comes back. The row's "partition" has the version cut at,
#       the seconds from the cut to the new primary (its log line) and to the
#       next version, and whether the old primary rejoined as a backup.
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
CONFIG=configs/local.textproto EPOCHS=1 MODE=sync BACKUPS=0 PARTITION=
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
    --backups=*) BACKUPS=${arg#*=} ;;
    --partition=*) PARTITION=${arg#*=} ;;
    *) echo "$PROGRAM: unknown argument $arg" >&2; usage ;;
  esac
done
bad() { echo "$PROGRAM: $1" >&2; exit 2; }
[[ $SHARDS =~ ^[1-9][0-9]?$ ]] || bad "--shards=$SHARDS: give 1 to 99"
[[ $WORKERS =~ ^[1-9][0-9]?$ ]] || bad "--workers=$WORKERS: give 1 to 99"
[[ $BACKUPS =~ ^[0-9]$ ]] || bad "--backups=$BACKUPS: give 0 to 9"
[[ -z $PARTITION || $PARTITION =~ ^[1-9][0-9]*$ ]] || bad "--partition=$PARTITION: give a version from 1"
[[ $KIND == train || ($BACKUPS == 0 && -z $PARTITION) ]] || bad "--backups and --partition are for train"
[[ -z $PARTITION || $BACKUPS -ge 1 ]] || bad "--partition needs --backups=1 or more: a backup takes over"
# Every task and replica, and the etcd, has an address of its own.
NODES=$((SHARDS * (1 + BACKUPS) + WORKERS + (BACKUPS > 0 ? 1 : 0)))
((NODES <= 250)) || bad "--shards x (1 + --backups) + --workers: at most 250 tasks (one /24 of addresses)"
[[ $RATE =~ ^[0-9]+(kbit|mbit|gbit)$ ]] || bad "--rate=$RATE: give a rate such as 200mbit"
[[ $SECONDS_ =~ ^[0-9]+([.][0-9]+)?$ ]] || bad "--seconds=$SECONDS_: give a number"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || bad "--epochs=$EPOCHS: give a whole number from 1"
netns_require_root "$PROGRAM"
for bin in "$BIN/ps_server" "$BIN/ps_bench" "$BIN/worker" "$BIN/psctl"; do
  [[ -x $bin ]] || { echo "$PROGRAM: $bin is missing; run scripts/build.sh first" >&2; exit 1; }
done
ETCD=/usr/bin/etcd
if ((BACKUPS > 0)); then
  [[ -x $ETCD ]] || { echo "$PROGRAM: --backups needs $ETCD for the shards' membership: apt-get install etcd-server (scripts/install_deps.sh does)" >&2; exit 1; }
  # The replicas' metrics (who is primary, each one's version) are read with curl.
  command -v curl > /dev/null || { echo "$PROGRAM: --backups needs curl to read the replicas' metrics" >&2; exit 1; }
fi
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
# etcd's data in memory where the host has a tmpfs, as pslaunch keeps its
# etcd's (cluster/membership/local_etcd.h): a disk sync that other processes
# slow can outlast the 1 s lease and depose a healthy primary.
ETCD_DATA=$SCRATCH/etcd
if ((BACKUPS > 0)) && [[ -w /dev/shm ]]; then ETCD_DATA=$(mktemp -d /dev/shm/pstrain-etcd-netns.XXXXXX); fi
cleanup() {
  netns_down
  rm -rf "$SCRATCH"
  if [[ $ETCD_DATA == /dev/shm/* ]]; then rm -rf "$ETCD_DATA"; fi
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
# Addresses: the primaries first, then the workers, the backups and the etcd.
PS_LIST=()
for ((k = 0; k < SHARDS; k++)); do
  netns_node_up "ps$k" "$k" "$RATE" "$DELAY"
  PS_LIST+=("$(netns_address "$k"):$PORT")
done
for ((w = 0; w < WORKERS; w++)); do
  netns_node_up "wk$w" "$((SHARDS + w))" "$RATE" "$DELAY"
done
# Replica R of shard K runs in namespace replica_node K R.
replica_node() { if (($2 == 0)); then echo "ps$1"; else echo "ps$1r$2"; fi; }
CLUSTER=$(printf 'ps: "%s" ' "${PS_LIST[@]}")
if ((BACKUPS > 0)); then
  for ((k = 0; k < SHARDS; k++)); do
    CLUSTER+="ps_backups { "
    for ((r = 1; r <= BACKUPS; r++)); do
      index=$((SHARDS + WORKERS + k * BACKUPS + r - 1))
      netns_node_up "$(replica_node "$k" "$r")" "$index" "$RATE" "$DELAY"
      CLUSTER+="address: \"$(netns_address "$index"):$PORT\" "
    done
    CLUSTER+="} "
  done
  # The flags cluster/membership/local_etcd.cc gives the etcd pslaunch runs:
  # etcd's minimum lease is 1.5 election timeouts rounded up to whole
  # seconds, so the 1 s lease below is granted as asked, not as 2 s.
  ETCD_INDEX=$((SHARDS + WORKERS + SHARDS * BACKUPS))
  netns_node_up etcd "$ETCD_INDEX" "$RATE" "$DELAY"
  ETCD_URL=http://$(netns_address "$ETCD_INDEX"):2379
  PEER_URL=http://127.0.0.1:2380
  netns_spawn etcd "$SCRATCH/etcd.log" "$ETCD" --name=pstrain --data-dir="$ETCD_DATA" \
    --listen-client-urls="$ETCD_URL" --advertise-client-urls="$ETCD_URL" \
    --listen-peer-urls="$PEER_URL" --initial-advertise-peer-urls="$PEER_URL" \
    --initial-cluster="pstrain=$PEER_URL" --heartbeat-interval=50 --election-timeout=500
  ETCD_PID=$NETNS_LAST_PID
  for ((tries = 0; ; tries++)); do
    ip netns exec "${NETNS_TAG}_etcd" curl -sf --max-time 1 "$ETCD_URL/health" 2>/dev/null |
      grep -q '"health":"true"' && break
    netns_running "$ETCD_PID" ||
      { echo "$PROGRAM: etcd exited:" >&2; tail -20 "$SCRATCH/etcd.log" >&2; exit 1; }
    ((tries < 300)) || { echo "$PROGRAM: etcd did not answer in 30 s; see its log:" >&2;
                         tail -20 "$SCRATCH/etcd.log" >&2; exit 1; }
    sleep 0.1
  done
  CLUSTER+="membership { etcd_endpoints: \"${ETCD_URL#http://}\" lease_seconds: 1 } "
fi

# The job: the config's training block under a cluster of these namespaces.
CHECKPOINTS=$SCRATCH/checkpoints
if [[ $KIND == bench ]]; then
  cat > "$SCRATCH/job.textproto" <<EOF
cluster { $CLUSTER workers: $WORKERS shm: SHM_OFF worker_command: "ps_bench" }
training { mode: ASYNC optimizer { sgd { learning_rate: 1.0 } } batch_size: 64 epochs: 1
  model { mlp { hidden: 16 } } dataset { fashion_mnist {} } }
EOF
else
  # The checkpoints go to a directory of the run's own: the final ones
  # (written as each shard stops) hold the model compared across runs.
  $PYTHON - "$CONFIG" "$CLUSTER workers: $WORKERS shm: SHM_OFF" "$CHECKPOINTS" \
    > "$SCRATCH/job.textproto" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r'^cluster\s*\{.*?^\}', '', text, flags=re.S | re.M)
block = re.search(r'\bcheckpoint\s*\{([^{}]*)\}', text)
if block:
    inner = re.sub(r'\bdir\s*:\s*"[^"]*"', '', block.group(1))
    text = text[:block.start()] + 'checkpoint { dir: "%s" %s}' % (sys.argv[3], inner) + text[block.end():]
else:
    text = re.sub(r'^training\s*\{', lambda m: '%s\n  checkpoint { dir: "%s" }' % (m.group(0), sys.argv[3]),
                  text, count=1, flags=re.M)
print('cluster { %s }\n%s' % (sys.argv[2], text))
EOF
fi

# Every replica serves its metrics on its own loopback: who is primary, and
# each one's version.
METRICS_PORT=9100
PS_FLAGS=()
if [[ $KIND == train ]]; then PS_FLAGS+=(--mode="$MODE"); fi
if ((BACKUPS > 0)); then PS_FLAGS+=(--metrics_port="$METRICS_PORT"); fi
SHARD_PIDS=()
declare -A PS_PID=() PS_TASK=()
ps_start() {  # ps_start K R: replica R of shard K
  local node replica=() task="ps:$1"
  node=$(replica_node "$1" "$2")
  if (($2 > 0)); then replica=(--replica="$2") task+=" replica $2"; fi
  netns_spawn "$node" "$SCRATCH/$node.log" "$BIN/ps_server" --config="$SCRATCH/job.textproto" \
    --task="ps:$1" "${replica[@]}" --allow_insecure --port_file="$SCRATCH/$node.port" \
    --max_message_bytes="$MAX_MESSAGE" "${PS_FLAGS[@]}"
  SHARD_PIDS+=("$NETNS_LAST_PID")
  PS_PID[$node]=$NETNS_LAST_PID
  PS_TASK[$node]=$task
}
# ps_wait NODE [PATTERN]: until the ps_server in NODE serves (its port
# file is there) and, with a PATTERN, its log has a line that matches it.
ps_wait() {
  local node=$1 pattern=${2:-} tries
  for ((tries = 0; tries < 300; tries++)); do
    if [[ -e $SCRATCH/$node.port ]] && { [[ -z $pattern ]] || grep -qE "$pattern" "$SCRATCH/$node.log"; }; then
      return 0
    fi
    netns_running "${PS_PID[$node]}" ||
      { echo "$PROGRAM: ${PS_TASK[$node]} exited:" >&2; cat "$SCRATCH/$node.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$PROGRAM: ${PS_TASK[$node]} did not ${pattern:+log /$pattern/ or }start in 30 s; its log:" >&2
  tail -20 "$SCRATCH/$node.log" >&2
  exit 1
}
# The backups first, as pslaunch starts them: a primary forwards to them
# from its first update. Workers start once every primary holds its office.
for ((k = 0; k < SHARDS; k++)); do
  for ((r = 1; r <= BACKUPS; r++)); do ps_start "$k" "$r"; done
done
for ((k = 0; k < SHARDS; k++)); do
  for ((r = 1; r <= BACKUPS; r++)); do ps_wait "$(replica_node "$k" "$r")"; done
done
for ((k = 0; k < SHARDS; k++)); do ps_start "$k" 0; done
for ((k = 0; k < SHARDS; k++)); do
  if ((BACKUPS > 0)); then
    ps_wait "ps$k" "shard $k replica 0 is primary at epoch"
  else
    ps_wait "ps$k"
  fi
done

# CPU seconds of this shell's children that have exited (bash's times): the
# workers, once waited for; the shards are still running and not counted.
# Called in this shell, never in $(...), whose subshell has children of its own.
children_cpu_seconds() {
  times > "$SCRATCH/times"
  sed -n 2p "$SCRATCH/times" | tr -d 's' | awk '{ split($1, u, "m"); split($2, s, "m");
    printf "%.3f\n", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' > "$SCRATCH/children_cpu"
}

# Gauge NAME of the ps_server in NODE, a whole number (empty while it does
# not answer; its loopback answers while its link is down).
ps_gauge() {
  { ip netns exec "${NETNS_TAG}_$1" curl -sf --max-time 1 "http://127.0.0.1:$METRICS_PORT/metrics" \
      2>/dev/null || true; } |
    awk -v name="$2" '{ split($1, n, "{") } n[1] == name { printf "%d\n", $2; exit }'
}
# Seconds from clock time FROM to TO (HH:MM:SS.fff, as the logs stamp
# their lines in local time), across midnight too.
clock_seconds() {
  awk -v from="$1" -v to="$2" 'function s(t, p) { split(t, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
    BEGIN { d = s(to) - s(from); if (d < -43200) d += 86400; printf "%.3f\n", d }'
}

# --partition: cuts shard 0's primary off at version $PARTITION, waits for
# a backup to take over and for the next version, heals, and waits for the
# old primary to rejoin the new one's chain. Leaves partition.json (or
# partition.error when no cut was made). Each wait is bounded, so that a
# failover that never comes still ends with a row saying so.
partition_monitor() {
  local version tries line cut_clock cut_s new=null new_after=null taken=-1 moved_after=null
  local heal_clock rejoined=false rejoined_after=null
  until version=$(ps_gauge ps0 pst_ps_version); [[ -n $version ]] && ((version >= PARTITION)); do
    local running=0 pid
    for pid in "${WORKER_PIDS[@]}"; do
      if netns_running "$pid"; then running=1; fi
    done
    if ((running == 0)); then
      echo "the run ended before shard 0's primary reached version $PARTITION (it is at ${version:-?})" \
        > "$SCRATCH/partition.error"
      return 1
    fi
    sleep 0.05
  done
  netns_link ps0 down
  cut_clock=$(date +%H:%M:%S.%N) cut_s=$(date +%s.%N)
  # Nothing reaches it from here on: its version now is the one cut at.
  line=$(ps_gauge ps0 pst_ps_version)
  version=${line:-$version}
  echo "$(date +%T.%3N) cut ps:0 off at version $version"
  for ((tries = 0; tries < 600; tries++)); do
    line=$(grep -hE "shard 0 replica [1-9][0-9]* is primary at epoch" "$SCRATCH"/ps0r*.log | head -1 || true)
    [[ -n $line ]] && break
    sleep 0.1
  done
  if [[ $line =~ replica\ ([0-9]+)\ is\ primary\ at\ epoch\ [0-9]+,\ version\ ([0-9]+) ]]; then
    new=${BASH_REMATCH[1]} taken=${BASH_REMATCH[2]}
    new_after=$(clock_seconds "$cut_clock" "${line%% *}")
    echo "$line"
    for ((tries = 0; tries < 600; tries++)); do
      local now
      now=$(ps_gauge "ps0r$new" pst_ps_version)
      if [[ -n $now ]] && ((now > taken)); then
        moved_after=$(awk -v a="$cut_s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", b - a }')
        echo "$(date +%T.%3N) ps:0 replica $new is at version $now"
        break
      fi
      sleep 0.1
    done
  fi
  netns_link ps0 up
  heal_clock=$(date +%H:%M:%S.%N)
  echo "$(date +%T.%3N) healed"
  if [[ $new != null ]]; then
    for ((tries = 0; tries < 1200; tries++)); do
      line=$(grep -hE "shard 0 replica $new: chain of replicas $new(,[0-9]+)*,0(,|$)" \
        "$SCRATCH/ps0r$new.log" | head -1 || true)
      if [[ -n $line ]]; then
        rejoined=true rejoined_after=$(clock_seconds "$heal_clock" "${line%% *}")
        echo "$line"
        break
      fi
      sleep 0.1
    done
  fi
  printf '{"cut_at_version": %s, "new_primary_replica": %s, "new_primary_after_s": %s, "new_primary_at_version": %s, "moved_on_after_s": %s, "healed": true, "rejoined": %s, "rejoined_after_s": %s}\n' \
    "$version" "$new" "$new_after" "$([[ $new == null ]] && echo null || echo "$taken")" \
    "$moved_after" "$rejoined" "$rejoined_after" > "$SCRATCH/partition.json"
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
  MONITOR_PID=
  if [[ -n $PARTITION ]]; then
    # Not a child of this shell (the subshell between exits at once), so
    # that its polls are not counted in the workers' CPU (bash's times).
    (partition_monitor > "$SCRATCH/partition.log" 2>&1 & echo $! > "$SCRATCH/partition.pid")
    MONITOR_PID=$(< "$SCRATCH/partition.pid")
    NETNS_PIDS+=("$MONITOR_PID")
  fi
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

if [[ -n $PARTITION ]]; then
  while netns_running "$MONITOR_PID"; do sleep 0.2; done
  sed "s/^/$PROGRAM: partition: /" "$SCRATCH/partition.log" >&2
  [[ -e $SCRATCH/partition.json ]] ||
    { echo "$PROGRAM: --partition=$PARTITION: $(cat "$SCRATCH/partition.error" 2>/dev/null ||
        echo "no cut was made")" >&2; exit 1; }
fi

if [[ $KIND == train ]]; then
  # Each shard's primary now, where replicas say so themselves.
  FINAL=()
  for ((k = 0; k < SHARDS; k++)); do
    if ((BACKUPS == 0)); then FINAL+=(0); continue; fi
    primaries=()
    for ((r = 0; r <= BACKUPS; r++)); do
      if [[ $(ps_gauge "$(replica_node "$k" "$r")" pst_ps_replica_primary) == 1 ]]; then
        primaries+=("$r")
      fi
    done
    ((${#primaries[@]} == 1)) ||
      { echo "$PROGRAM: shard $k has ${#primaries[@]} primaries at the end (replicas: ${primaries[*]:-none})" >&2; exit 1; }
    FINAL+=("${primaries[0]}")
  done
  # Stopped as SIGTERM stops them (each writes its final checkpoint), the
  # backups first, so that no backup takes over from a primary that stops.
  ps_stop() {
    local node status=0
    node=$(replica_node "$1" "$2")
    kill -TERM "${PS_PID[$node]}"
    wait "${PS_PID[$node]}" || status=$?
    ((status == 0)) ||
      { echo "$PROGRAM: ${PS_TASK[$node]} exited $status when stopped:" >&2; tail -20 "$SCRATCH/$node.log" >&2; exit 1; }
  }
  for ((k = 0; k < SHARDS; k++)); do
    for ((r = 0; r <= BACKUPS; r++)); do ((r == FINAL[k])) || ps_stop "$k" "$r"; done
  done
  for ((k = 0; k < SHARDS; k++)); do ps_stop "$k" "${FINAL[k]}"; done
  # export_model NAME R0 R1 ...: the sha256 of the model psctl export takes
  # out of the final checkpoints of replica R<k> of each shard k (empty if
  # it cannot; why, in NAME.log).
  export_model() {
    local name=$1 k=0 r
    shift
    mkdir "$SCRATCH/$name"
    for r in "$@"; do
      if ((r == 0)); then
        ln -s "$CHECKPOINTS/shard-$k" "$SCRATCH/$name/shard-$k"
      else
        ln -s "$CHECKPOINTS/replica-$r/shard-$k" "$SCRATCH/$name/shard-$k"
      fi
      ((++k))
    done
    if "$BIN/psctl" export --checkpoint="$SCRATCH/$name" --format=npz --out="$SCRATCH/$name.npz" \
         > "$SCRATCH/$name.log" 2>&1; then
      sha256sum "$SCRATCH/$name.npz" | cut -d' ' -f1
    fi
  }
  MODEL_SHA=$(export_model model "${FINAL[@]}")
  [[ -n $MODEL_SHA ]] ||
    { echo "$PROGRAM: psctl export of the final checkpoints failed:" >&2; cat "$SCRATCH/model.log" >&2; exit 1; }
  # Every replica's final checkpoints: the same model, bitwise.
  REPLICA_SHAS=()
  for ((r = 0; r <= BACKUPS && BACKUPS > 0; r++)); do
    set_of=()
    for ((k = 0; k < SHARDS; k++)); do set_of+=("$r"); done
    sha=$(export_model "replica$r" "${set_of[@]}")
    [[ -n $sha ]] || { echo "$PROGRAM: replica $r's final checkpoints:" >&2; cat "$SCRATCH/replica$r.log" >&2; }
    REPLICA_SHAS+=("${sha:-none}")
  done
  printf '%s\n' "$MODEL_SHA" > "$SCRATCH/model.sha"
  printf '%s\n' "${REPLICA_SHAS[@]}" > "$SCRATCH/replica.shas"
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
    row.update(mode="$MODE", epochs=$EPOCHS, backups=$BACKUPS)
    if chief.get("has_test_auc"):
        row.update(test_auc=round(float(chief["test_auc"]), 4),
                   test_logloss=round(float(chief["test_logloss"]), 4))
    else:
        row.update(test_accuracy=round(float(chief["test_accuracy"]), 4))
    row.update(worker_steps=steps, samples_per_s=round(samples / longest, 1),
               step_ms=round(longest / (steps / $WORKERS) * 1e3, 2),
               model_sha256=open(scratch + "/model.sha").read().strip())
    if $BACKUPS > 0:
        shas = open(scratch + "/replica.shas").read().split()
        row.update(replicas_agree=all(s == row["model_sha256"] for s in shas))
    if "$PARTITION":
        row.update(partition=json.load(open(scratch + "/partition.json")))
    cpu_wk = ($CPU_WK_1 - $CPU_WK_0) / window
row.update(cpu_cores_ps=round(cpu_ps, 3),
           cpu_cores_workers=None if cpu_wk is None else round(cpu_wk, 3),
           cpu_cores_machine=round(machine, 3))
print(json.dumps(row))
EOF
