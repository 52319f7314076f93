#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md with the command its section
# quotes, writes docs/bench/<kind>.json and docs/bench/machine.json (the
# machine it ran on), and renders the doc's tables from them
# (scripts/benchmark_tables.py --update). About an hour on a 2-vCPU VM,
# half of it train_vs_torch and ctr_vs_torch.
#
#   scripts/run_benchmarks.sh                     # everything, the rounds the doc quotes
#   ROUNDS=1 scripts/run_benchmarks.sh            # every benchmark once: a quick look
#   ONLY=train_bench,metrics_bench scripts/run_benchmarks.sh
#   DRY_RUN=1 scripts/run_benchmarks.sh           # print the commands, run nothing
#
# Kinds, in order: machine train_vs_torch ctr_vs_torch time_to_accuracy
# train_bench main_job ps_bench ps_bench_shards ps_bench_wire_dtype
# ps_bench_sizes gpu_bench metrics_bench netns_link netns_cluster cost_model
# python_client table_bench row_step_bench ctr_scale replication_cost failover_chaos cnn_vs_ddp.
# ONLY without
# machine keeps machine.json
# as it is.
# netns_cluster needs root (skipped otherwise) and takes about an hour;
# cost_model redraws from its constants. Run it on a quiet machine, on a
# Release build in build/ (scripts/build.sh). train_vs_torch and
# ctr_vs_torch need python3-torch and python3-numpy and gpu_bench a GPU and
# a CUDA build; without them each is skipped with one line. A benchmark that
# fails leaves its JSON as it was; the others still run, and the script exits 1.
# BENCH_DIR and DOC (default docs/bench, docs/benchmarks.md) move the output.
set -euo pipefail
if (($#)); then
  if [[ $1 != -h && $1 != --help ]]; then
    echo "run_benchmarks.sh: error: no arguments; it reads environment variables (--help)" >&2
    exit 2
  fi
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
ONLY=${ONLY:-}

PY=/usr/bin/python3
BENCH_DIR=${BENCH_DIR:-docs/bench}
DOC=${DOC:-docs/benchmarks.md}
WORK=build/bench  # intermediate files
KINDS=(machine train_vs_torch ctr_vs_torch time_to_accuracy train_bench main_job ps_bench
       ps_bench_shards ps_bench_wire_dtype ps_bench_sizes gpu_bench metrics_bench netns_link netns_cluster cost_model
       python_client table_bench row_step_bench ctr_scale replication_cost failover_chaos
       cnn_vs_ddp)
DRY_RUN=${DRY_RUN:-}

say() { echo "run_benchmarks.sh: $*" >&2; }
die() { say "error: $*"; exit 2; }

# The rounds a benchmark runs: $ROUNDS when set, else the doc's figure ($1).
rounds() { echo "${ROUNDS:-$1}"; }

# A command as a shell would read it, quoting only what needs it.
quote() {
  local safe='^[A-Za-z0-9_./=:,+@%-]+$' out=() a
  for a in "$@"; do
    if [[ $a =~ $safe ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  echo "${out[*]}"
}

# Prints a command on stdout (the lines docs/benchmarks.md quotes) and runs it.
run() {
  quote "$@"
  [[ -n $DRY_RUN ]] || "$@"
}

# Like run, with stdout into a file: run_to FILE COMMAND...
run_to() {
  local file=$1
  shift
  echo "$(quote "$@") > $file"
  [[ -n $DRY_RUN ]] || "$@" >"$file"
}

wanted() { [[ -z $ONLY || ",$ONLY," == *",$1,"* ]]; }

machine() {
  if [[ -n $DRY_RUN ]]; then
    say "machine: nproc, /proc/cpuinfo, uname -r and the date into $BENCH_DIR/machine.json"
    return
  fi
  "$PY" - "$BENCH_DIR/machine.json" <<'EOF'
import json, os, platform, subprocess, sys, time

def out(*command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        return ""

def field(path, name, sep):
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(sep)
                if key.strip() == name:
                    return value.strip().strip('"')
    except OSError:
        pass
    return ""

cache = {}
if os.path.exists("build/CMakeCache.txt"):
    with open("build/CMakeCache.txt") as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            cache[key.split(":")[0]] = value
compiler = cache.get("CMAKE_CXX_COMPILER", "")
memory_kb = field("/proc/meminfo", "MemTotal", ":").split()[0]
row = {
    "benchmark": "machine",
    "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    "cpu": field("/proc/cpuinfo", "model name", ":"),
    "cpu_features": " ".join(f for f in ("avx2", "fma", "avx512f")
                             if f in field("/proc/cpuinfo", "flags", ":").split()),
    "nproc": int(out("nproc") or 0),
    "memory": f"{int(memory_kb) / 2**20:.1f} GiB",
    "os": field("/etc/os-release", "PRETTY_NAME", "="),
    "kernel": platform.release(),
    "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    "compiler": (out(compiler, "--version").splitlines() or [""])[0] if compiler else "",
    "build_type": cache.get("CMAKE_BUILD_TYPE", ""),
    "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
    "torch": out(sys.executable, "-c", "import torch; print(torch.__version__)"),
    "gpu": ", ".join(out("nvidia-smi", "--query-gpu=name", "--format=csv,noheader").splitlines()),
}
with open(sys.argv[1], "w") as f:
    f.write(json.dumps(row) + "\n")
EOF
}

train_vs_torch() {
  if [[ -z $DRY_RUN ]] && ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    say "skipping train_vs_torch: no python3-torch or python3-numpy"
    return
  fi
  local skip="ours 2 workers layer-wise exchange,ours 1 worker 2 towers layer-wise exchange"
  run "$PY" benchmarks/train_vs_torch.py --rounds="$(rounds 5)" --json=$WORK/train_vs_torch.1.json
  run "$PY" benchmarks/train_vs_torch.py --rounds="$(rounds 3)" --optimizers=sgd \
    --hidden=512,256 --skip="$skip" --json=$WORK/train_vs_torch.2.json
  run "$PY" benchmarks/train_vs_torch.py --rounds="$(rounds 3)" --optimizers=sgd \
    --batch_size=128 --skip="$skip" --json=$WORK/train_vs_torch.3.json
  run_to "$BENCH_DIR/train_vs_torch.json" cat $WORK/train_vs_torch.{1,2,3}.json
}

ctr_vs_torch() {
  if [[ -z $DRY_RUN ]] && ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    say "skipping ctr_vs_torch: no python3-torch or python3-numpy"
    return
  fi
  run "$PY" benchmarks/ctr_vs_torch.py --rounds="$(rounds 5)" --json="$BENCH_DIR/ctr_vs_torch.json"
}

time_to_accuracy() {
  run "$PY" benchmarks/time_to_accuracy.py --rounds="$(rounds 3)" \
    --json="$BENCH_DIR/time_to_accuracy.json" tcp=build/bin:configs/local.textproto:--shm=off \
    shm=build/bin:configs/local.textproto towers=build/bin:configs/towers.textproto
}

train_bench() {
  run "$PY" benchmarks/rounds.py --benchmark=train_bench --rounds="$(rounds 3)" \
    --keys=workers,batch_size,straggler_delay_ms,replicas_to_aggregate,push_pull_bytes \
    --json="$BENCH_DIR/train_bench.json" -- build/bin/train_bench --json
}

main_job() {
  run "$PY" benchmarks/rounds.py --benchmark=main_job --rounds="$(rounds 2)" \
    --keys=workers,epochs --vary=config=configs/local.textproto,configs/towers.textproto \
    --json="$BENCH_DIR/main_job.json" -- build/bin/pslaunch
}

ps_bench() {
  run "$PY" benchmarks/data_plane.py --rounds="$(rounds 3)" --json="$BENCH_DIR/ps_bench.json"
}

ps_bench_shards() {
  run "$PY" benchmarks/rounds.py --benchmark=ps_bench_shards --rounds="$(rounds 3)" \
    --keys=size_bytes,workers,shards --vary=shards=1,2,4 \
    --json="$BENCH_DIR/ps_bench_shards.json" -- \
    build/bin/ps_bench --json --sizes=4MiB,64MiB --workers=2 --seconds=3 --transport=tcp
}

ps_bench_wire_dtype() {
  run "$PY" benchmarks/rounds.py --benchmark=ps_bench_wire_dtype --rounds="$(rounds 3)" \
    --keys=size_bytes,workers,shards --vary=wire_dtype=fp32,bf16 \
    --json="$BENCH_DIR/ps_bench_wire_dtype.json" -- \
    build/bin/ps_bench --json --sizes=4MiB,64MiB --seconds=3 --transport=tcp
}

ps_bench_sizes() {
  run "$PY" benchmarks/rounds.py --benchmark=ps_bench_sizes --rounds="$(rounds 1)" \
    --keys=size_bytes,workers,shards --json="$BENCH_DIR/ps_bench_sizes.json" -- \
    build/bin/ps_bench --json --sizes=4KiB,64KiB,1MiB,4MiB,16MiB,64MiB,256MiB --seconds=3 \
    --transport=tcp
}

gpu_bench() {
  if [[ -z $DRY_RUN ]]; then
    if [[ -z $(nvidia-smi -L 2>/dev/null) ]]; then
      say "skipping gpu_bench: no GPU (nvidia-smi lists none)"
      return
    fi
    if [[ ! -x build/bin/gpu_bench ]]; then
      say "skipping gpu_bench: no build/bin/gpu_bench (a CUDA build makes it)"
      return
    fi
  fi
  local torch=()
  local cuda_torch='import torch; assert torch.cuda.is_available()'
  if [[ -n $DRY_RUN ]] || python3 -c "$cuda_torch" 2>/dev/null; then
    run_to $WORK/torch_step.txt python3 benchmarks/torch_step.py
    torch=("--torch_results=$WORK/torch_step.txt")
  else
    say "gpu_bench without PyTorch's step: no python3 torch with CUDA"
  fi
  run "$PY" benchmarks/rounds.py --benchmark=gpu_bench --rounds="$(rounds 3)" --keys=batch \
    --json="$BENCH_DIR/gpu_bench.json" -- build/bin/gpu_bench --json "${torch[@]}"
}

metrics_bench() {
  run "$PY" benchmarks/rounds.py --benchmark=metrics_bench --rounds="$(rounds 3)" \
    --vary=registry=prometheus-cpp,lock-free --keys=threads \
    --json="$BENCH_DIR/metrics_bench.json" -- build/bin/metrics_bench --json
}

netns_link() {
  if [[ -z $DRY_RUN && $(id -u) != 0 ]]; then
    say "skipping netns_link: needs root (network namespaces)"
    return
  fi
  run "$PY" benchmarks/rounds.py --benchmark=netns_link --rounds="$(rounds 3)" \
    --vary=rate=1gbit,2gbit,4gbit,10gbit --keys=size_bytes \
    --json="$BENCH_DIR/netns_link.json" -- scripts/netns_bench.sh
}

netns_cluster() {
  if [[ -z $DRY_RUN && $(id -u) != 0 ]]; then
    say "skipping netns_cluster: needs root (network namespaces)"
    return
  fi
  [[ -n $DRY_RUN ]] || rm -f $WORK/netns_rows.json  # measure resumes a file it finds
  run "$PY" benchmarks/cost_model.py measure --out=$WORK/netns_rows.json
  run "$PY" benchmarks/cost_model.py fit $WORK/netns_rows.json --out="$BENCH_DIR/netns_cluster.json"
}

cost_model() {
  run "$PY" benchmarks/cost_model.py beyond "$BENCH_DIR/netns_cluster.json" \
    --out="$BENCH_DIR/cost_model.json"
  run "$PY" scripts/cost_model_plot.py "$BENCH_DIR/cost_model.json" --out=docs/cost_model.png
}

cnn_vs_ddp() {
  if [[ -z $DRY_RUN ]] && ! { [[ -d build/python/pstrain ]] && "$PY" -c 'import torch' 2>/dev/null; }; then
    say "skipping cnn_vs_ddp: no Python module in build/python, or no python3-torch"
    return
  fi
  run "$PY" benchmarks/cnn_vs_ddp.py --steps=200 --rounds="$(rounds 5)" \
    --json="$BENCH_DIR/cnn_vs_ddp.json"
  run "$PY" benchmarks/cnn_vs_ddp.py --to_accuracy=0.91 --epochs=15 \
    --json="$BENCH_DIR/cnn_time_to_accuracy.json"
}

python_client() {
  if [[ -z $DRY_RUN && ! -d build/python/pstrain ]]; then
    say "skipping python_client: no Python module in build/python (pybind11-dev, python3-dev)"
    return
  fi
  run "$PY" benchmarks/python_client_bench.py --rounds="$(rounds 5)" \
    --json="$BENCH_DIR/python_client.json"
}

table_bench() {
  run_to $WORK/table_bench_scale.json build/bin/table_bench --measure=scale --rows=10000000 \
    --rounds="$(rounds 3)" --json
  run_to $WORK/table_bench_bound.json build/bin/table_bench --measure=bound --rows=10000000 \
    --max_rows=1000000 --json
  run_to $WORK/table_bench_stall.json build/bin/table_bench --measure=stall --rows=5000000 \
    --rounds="$(rounds 3)" --json
  run_to $WORK/table_bench_delta.json build/bin/table_bench --measure=stall \
    --stall_variants=delta,model --rows=10000000 --rounds="$(rounds 5)" --json
  [[ -n $DRY_RUN ]] ||
    cat $WORK/table_bench_{scale,bound,stall,delta}.json >"$BENCH_DIR/table_bench.json"
}

row_step_bench() {
  local steps=(--rounds="$(rounds 3)" --warm_steps=300 --steps=50)
  local tiers=(--memory_bytes=37000000 --disk=$WORK/tiers --worker_us=5000)
  run_to $WORK/row_step_bench.ram.json build/bin/row_step_bench "${steps[@]}" --json
  run_to $WORK/row_step_bench.ram9.json build/bin/row_step_bench "${steps[@]}" --dims=9 --json
  run_to $WORK/row_step_bench.noahead.json build/bin/row_step_bench "${steps[@]}" "${tiers[@]}" \
    --prefetch_rows=0 --json
  run_to $WORK/row_step_bench.ahead.json build/bin/row_step_bench "${steps[@]}" "${tiers[@]}" --json
  run_to "$BENCH_DIR/row_step_bench.json" cat $WORK/row_step_bench.{ram,ram9,noahead,ahead}.json
}

ctr_scale() {
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 3)" --json=$WORK/ctr_scale.8.json
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 1)" --dim=16 --json=$WORK/ctr_scale.16.json
  # At dim 16 again, then with RAM for a quarter of the rows and the rest on disk, back to back.
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 1)" --dim=16 --json=$WORK/ctr_scale.ram16.json
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 1)" --dim=16 --memory_mib=512 \
    --hot_set=lru --json=$WORK/ctr_scale.tier16.json
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 1)" --dim=16 --memory_mib=512 \
    --hot_set=lfu --json=$WORK/ctr_scale.tier16lfu.json
  # 10^8 ids: about 7 x 10^7 rows, 15 GB on disk, under the same 512 MiB (an hour here).
  run "$PY" benchmarks/ctr_scale.py --rounds=1 --rows=100000000 --train_examples=6000000 \
    --dim=16 --memory_mib=512 --hot_set=lfu --work_dir=build/bench/ctr_scale_1e8 --timeout=6000 \
    --json=$WORK/ctr_scale.far16.json
  # The CTR job's own skew, all in RAM and with a quarter of its rows in
  # RAM, alternated in each round.
  run "$PY" benchmarks/ctr_scale.py --rounds="$(rounds 3)" --dim=16 --zipf_exponent=1.1 \
    --memory_fraction=0.25 --hot_set=lfu --work_dir=build/bench/ctr_scale_z11 \
    --json=$WORK/ctr_scale.z11.json
  run_to "$BENCH_DIR/ctr_scale.json" cat $WORK/ctr_scale.{8,16,ram16,tier16,tier16lfu,far16,z11}.json
}

replication_cost() {
  run "$PY" benchmarks/replication_cost.py --job=ctr --rounds="$(rounds 3)" \
    --json=$WORK/replication_cost.ctr.json
  run "$PY" benchmarks/replication_cost.py --job=default --rounds="$(rounds 3)" \
    --json=$WORK/replication_cost.default.json
  local netns=()
  if [[ -n $DRY_RUN || $(id -u) == 0 ]]; then
    run "$PY" benchmarks/replication_cost.py --cluster=netns --job=ctr --rounds="$(rounds 3)" \
      --json=$WORK/replication_cost.netns_ctr.json
    run "$PY" benchmarks/replication_cost.py --cluster=netns --job=default --rounds="$(rounds 5)" \
      --json=$WORK/replication_cost.netns_default.json
    netns=($WORK/replication_cost.netns_{ctr,default}.json)
  else
    say "replication_cost: skipping the namespace cluster's rows: needs root (network namespaces)"
  fi
  run_to "$BENCH_DIR/replication_cost.json" cat $WORK/replication_cost.{ctr,default}.json "${netns[@]}"
}

failover_chaos() {
  run "$PY" benchmarks/failover_chaos.py --job=ctr --modes=sync,async --kills=10 \
    --json=$WORK/failover_chaos.ctr.json
  run "$PY" benchmarks/failover_chaos.py --job=default --epochs=30 --modes=sync,async --kills=10 \
    --json=$WORK/failover_chaos.default.json
  run_to "$BENCH_DIR/failover_chaos.json" cat $WORK/failover_chaos.{ctr,default}.json
}

for kind in ${ONLY//,/ }; do
  [[ " ${KINDS[*]} " == *" $kind "* ]] || die "ONLY: no benchmark \"$kind\" (${KINDS[*]})"
done
if [[ -z $DRY_RUN ]]; then
  for bin in train_bench ps_bench socket_bench metrics_bench table_bench row_step_bench pslaunch \
    ps_server worker; do
    [[ -x build/bin/$bin ]] || die "no build/bin/$bin; build first (scripts/build.sh)"
  done
  data=/usr/share/datasets/fashion-mnist
  [[ -d $data ]] || die "no Fashion-MNIST in $data"
  mkdir -p "$BENCH_DIR" $WORK
fi

failed=()
start=$SECONDS
for kind in "${KINDS[@]}"; do
  wanted "$kind" || continue
  [[ -n $DRY_RUN ]] || say "$kind ..."
  began=$SECONDS
  set +e
  ( set -e; "$kind" )
  status=$?
  set -e
  if ((status != 0)); then
    failed+=("$kind")
    say "$kind failed (exit $status); its JSON is as it was"
  elif [[ -z $DRY_RUN ]]; then
    say "$kind done in $((SECONDS - began)) s"
  fi
done
run "$PY" scripts/benchmark_tables.py --update "$DOC" --bench_dir="$BENCH_DIR"
[[ -n $DRY_RUN ]] || say "all done in $(((SECONDS - start) / 60)) min"
if ((${#failed[@]})); then
  say "failed: ${failed[*]}"
  exit 1
fi
