#!/usr/bin/env bash
# pslite_peer.sh: ps-lite (dmlc/ps-lite, ZeroMQ) doing ps_bench's round trip,
# the peer of `ps_bench --peer_json`. Fetches ps-lite into a folder outside
# this repository, builds it there (CMake Release, Debian's libzmq3-dev and
# protobuf) with benchmarks/peer/pslite_bench.cc, runs one scheduler, one
# server and N worker processes on 127.0.0.1 per row and prints one JSON row
# per size: size, size_bytes, workers, push_pull_gbps (both ways),
# cpu_us_per_round_trip (workers' and server's processes), p50_us.
#
#   scripts/pslite_peer.sh --dir=/tmp/pslite-peer --workers=2 --sizes=4MiB,64MiB
#
# --src: a git URL or a local clone of ps-lite (default its GitHub address);
# --commit: what to build (default 15b8adf, upstream master's ZeroMQ van).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${TMPDIR:-/tmp}/pslite-peer"
src="https://github.com/dmlc/ps-lite"
commit="15b8adf"
workers=1
sizes="4MiB,64MiB"
seconds=3

fail() { echo "pslite_peer.sh: error: $*" >&2; exit 2; }
for arg in "$@"; do
  case "$arg" in
    --dir=*) dir="${arg#*=}" ;;
    --src=*) src="${arg#*=}" ;;
    --commit=*) commit="${arg#*=}" ;;
    --workers=*) workers="${arg#*=}" ;;
    --sizes=*) sizes="${arg#*=}" ;;
    --seconds=*) seconds="${arg#*=}" ;;
    *) fail "unknown argument $arg (see the header of $0)" ;;
  esac
done
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || fail "--workers=$workers: give a positive number"
case "$dir" in "$here"|"$here"/*) fail "--dir=$dir: give a folder outside the repository" ;; esac
[ -f /usr/include/zmq.h ] || fail "ZeroMQ headers missing: apt-get install libzmq3-dev"

bytes_of() {
  local s="$1"
  case "$s" in
    *GiB) echo $(( ${s%GiB} << 30 )) ;;
    *MiB) echo $(( ${s%MiB} << 20 )) ;;
    *KiB) echo $(( ${s%KiB} << 10 )) ;;
    *B) echo "${s%B}" ;;
    *) fail "--sizes: $s: use B, KiB, MiB or GiB" ;;
  esac
}

mkdir -p "$dir"
if [ ! -d "$dir/ps-lite/.git" ]; then
  git clone -q "$src" "$dir/ps-lite" >&2
fi
git -C "$dir/ps-lite" checkout -q "$commit"
bench="$dir/pslite_bench"
if [ ! -x "$bench" ] || [ "$here/benchmarks/peer/pslite_bench.cc" -nt "$bench" ]; then
  cmake -S "$dir/ps-lite" -B "$dir/ps-lite/build" -DCMAKE_BUILD_TYPE=Release >&2
  cmake --build "$dir/ps-lite/build" --target pslite -j2 >&2
  g++ -std=c++17 -O3 -DNDEBUG -I"$dir/ps-lite/include" \
    "$here/benchmarks/peer/pslite_bench.cc" "$dir/ps-lite/build/libpslite.a" \
    -lzmq -lprotobuf -pthread -o "$bench"
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

run_row() {  # SIZE
  local size="$1" bytes out port
  bytes="$(bytes_of "$size")"
  out="$dir/run.$$"
  rm -f "$out".*
  port="$(free_port)"
  export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port" DMLC_NODE_HOST=127.0.0.1 \
         DMLC_NUM_SERVER=1 DMLC_NUM_WORKER="$workers" PSLITE_BENCH_OUT="$out"
  pids=()
  DMLC_ROLE=scheduler "$bench" "$bytes" "$seconds" >&2 & pids+=($!)
  DMLC_ROLE=server "$bench" "$bytes" "$seconds" >&2 & pids+=($!)
  local w
  for ((w = 0; w < workers; ++w)); do
    DMLC_ROLE=worker "$bench" "$bytes" "$seconds" >&2 & pids+=($!)
  done
  local deadline=$((SECONDS + 120)) p
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      (( SECONDS < deadline )) || fail "a ps-lite process still runs after 120 s"
      sleep 0.2
    done
    wait "$p" || fail "a ps-lite process exited with an error"
  done
  pids=()
  /usr/bin/python3 - "$out" "$size" "$bytes" "$workers" <<'EOF'
import glob, json, sys
out, size, nbytes, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [list(map(float, open(p).read().split())) for p in sorted(glob.glob(out + ".worker.*"))]
server_cpu = sum(float(open(p).read()) for p in glob.glob(out + ".server.*"))
if len(rows) != workers:
    sys.exit(f"pslite_peer.sh: error: {len(rows)} of {workers} workers reported")
trips = sum(r[0] for r in rows)
elapsed = max(r[1] for r in rows)
cpu = sum(r[2] for r in rows) + server_cpu
print(json.dumps({"size": size, "size_bytes": nbytes, "workers": workers,
                  "transport": "ps-lite", "push_pull_gbps": round(trips * 2 * nbytes / elapsed / 1e9, 3),
                  "cpu_us_per_round_trip": round(cpu * 1e6 / trips),
                  "p50_us": round(sorted(r[3] for r in rows)[len(rows) // 2], 1),
                  "round_trips": int(trips)}))
EOF
  rm -f "$out".*
}

IFS=',' read -ra size_list <<< "$sizes"
for size in "${size_list[@]}"; do run_row "$size"; done
