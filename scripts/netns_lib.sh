# shellcheck shell=bash
# Helpers for a cluster in network namespaces on one machine, sourced by
# scripts/netns_cluster.sh and scripts/netns_bench.sh. Every task gets a namespace of its own with one
# veth into a switch namespace that holds a bridge; both ends of each veth
# are shaped (tbf for the rate, below netem for a delay where the kernel has
# netem), so a task's port has RATE in each direction, as a NIC does, and a
# round trip between two tasks crosses four delays. Nothing is created in the caller's network
# namespace: deleting the namespaces removes every veth and the bridge.
#
# Callers set NETNS_TAG (unique per run, e.g. pst$$), call netns_switch_up,
# netns_node_up per task, start processes with netns_spawn (their PIDs are
# kept in NETNS_PIDS), and call netns_down on exit (it is safe to call twice).
# netns_link takes a node's cable out and puts it back (a partition).

NETNS_NODES=()
NETNS_PIDS=()
declare -gA NETNS_DEV=()  # node name -> its end of the veth, for netns_link

netns_require_root() {
  if [[ $(id -u) != 0 ]]; then
    echo "$1: needs root (it creates network namespaces and shapes veth pairs with tc)" >&2
    exit 1
  fi
}

netns_switch_up() {
  ip netns add "${NETNS_TAG}_sw"
  ip -n "${NETNS_TAG}_sw" link add br0 type bridge
  ip -n "${NETNS_TAG}_sw" link set br0 up
  ip -n "${NETNS_TAG}_sw" link set lo up
}

# Whether this kernel has netem (sch_netem), the only qdisc that adds delay.
netns_have_netem() {
  local ns=${NETNS_TAG}_sw ok=1
  ip netns exec "$ns" tc qdisc add dev lo root netem delay 1us >/dev/null 2>&1 && ok=0
  ip netns exec "$ns" tc qdisc del dev lo root >/dev/null 2>&1 || true
  return $ok
}

# Shapes egress of DEV in namespace NS to RATE (tbf), after a netem DELAY
# unless DELAY is empty. The queue holds 100 ms at the rate (NETNS_QUEUE),
# deep enough that no step's burst is dropped: with 20 ms, four workers'
# SYNC pushes into one shard's port lose packets and each loss costs a
# 200 ms retransmission timeout (a 4-worker step over 2 shards at 200
# Mbit/s: 222 ms instead of 164; with 5 ms, even 1 MiB over 3 shards took
# 232 ms instead of 62). The price: TCP keeps the queue full, and a large
# step's last reply waits behind it.
netns_shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  local tbf=(tbf rate "$rate" burst "${NETNS_BURST:-128kb}" latency "${NETNS_QUEUE:-100ms}")
  if [[ -z $delay ]]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 10: "${tbf[@]}"
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: "${tbf[@]}"
  fi
}

# netns_node_up NAME INDEX RATE [DELAY]: namespace ${NETNS_TAG}_NAME with
# address 10.77.0.(INDEX+1)/24 on a port of the switch.
netns_node_up() {
  local name=$1 index=$2 rate=$3 delay=${4:-}
  local ns=${NETNS_TAG}_$name sw=${NETNS_TAG}_sw
  local node_dev=n${index}_$$ port_dev=s${index}_$$
  ip netns add "$ns"
  NETNS_NODES+=("$ns")
  NETNS_DEV[$name]=$node_dev
  ip link add "$node_dev" netns "$ns" type veth peer name "$port_dev" netns "$sw"
  ip -n "$ns" addr add "10.77.0.$((index + 1))/24" dev "$node_dev"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$node_dev" up
  ip -n "$sw" link set "$port_dev" master br0
  ip -n "$sw" link set "$port_dev" up
  netns_shape "$ns" "$node_dev" "$rate" "$delay"
  netns_shape "$sw" "$port_dev" "$rate" "$delay"
}

netns_address() { echo "10.77.0.$(($1 + 1))"; }

# netns_link NAME down|up: the node's own end of its veth set down or up,
# as its cable pulled or plugged back in: meanwhile nothing reaches the node
# or leaves it, its processes run on (and reach each other over its
# loopback), and both ends keep their shaping.
netns_link() {
  ip -n "${NETNS_TAG}_$1" link set "${NETNS_DEV[$1]}" "$2"
}

# netns_spawn NAME LOG COMMAND...: runs COMMAND in ${NETNS_TAG}_NAME in the
# background, output to LOG; its PID (ip netns exec execs the command) is
# appended to NETNS_PIDS and left in NETNS_LAST_PID.
netns_spawn() {
  local name=$1 log=$2
  shift 2
  ip netns exec "${NETNS_TAG}_$name" "$@" > "$log" 2>&1 &
  NETNS_LAST_PID=$!
  NETNS_PIDS+=("$NETNS_LAST_PID")
}

# Whether PID runs (an exited child not yet waited for is a zombie: no).
netns_running() {
  local state
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${state:0:1} != Z ]]
}

# CPU seconds (user + system) that PIDs have used so far.
netns_cpu_seconds() {
  local ticks=0 pid fields
  for pid in "$@"; do
    if [[ -r /proc/$pid/stat ]]; then
      read -ra fields < <(sed 's/^.*) //' "/proc/$pid/stat")
      ticks=$((ticks + fields[11] + fields[12]))
    fi
  done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f\n", t / hz }'
}

# Busy CPU seconds of the whole machine so far (every process, ours or not).
netns_machine_busy_seconds() {
  local user nice system irq softirq steal
  read -r _ user nice system _ _ irq softirq steal _ < /proc/stat
  awk -v t="$((user + nice + system + irq + softirq + steal))" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.3f\n", t / hz }'
}

netns_down() {
  local pid ns
  for pid in "${NETNS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${NETNS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  NETNS_PIDS=()
  for ns in "${NETNS_NODES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  NETNS_NODES=()
  ip netns del "${NETNS_TAG}_sw" 2>/dev/null || true
}
