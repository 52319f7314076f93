#!/usr/bin/env bash
# The compose cluster for real: installs Docker if missing (docker.io,
# docker-compose, debootstrap), starts dockerd by hand, makes the
# debian:bookworm base image locally (no registry is reachable), builds
# the image of docker/Dockerfile (its runtime stage with the programs of the
# packaged CPU build; COMPOSE_FROM_SOURCE=1: the whole Dockerfile) and runs
# docker/docker-compose.yml to completion twice:
# SYNC with 2 workers, ASYNC with --scale worker=3; then the replicated
# cluster (docker/docker-compose.replicated.yml over it: etcd and a backup of
# the shard), SYNC with 2 workers, whose primary it kills mid-run: the backup
# must take over and the run end as without the kill. Before the image, the
# .deb of the build in $BUILD_DIR (default build/; for a CUDA build, that of
# scripts/package_deb.sh) is installed in a clean container, where Python
# workers train through its module (tests/packaging/deb_install_test.sh). Asserts every worker's
# exit code, the PS health check, the chief's accuracy line and the
# transport: shared memory where the workers share the PS's IPC namespace
# (the compose file's default), TCP where each has its own. Then it
# removes what it made (containers, networks, volumes, the dockerd it started).
#
# Skips (exit 0, saying why) only without root or when dockerd cannot start.
# Caches the base image's root file system under $WORK (build/docker-ci).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${COMPOSE_TEST_DIR:-$ROOT/build/docker-ci}
DOCKER=/usr/bin/docker  # Debian's docker.io; another docker may come first on PATH
COMPOSE=(docker-compose -f "$ROOT/docker/docker-compose.yml")
COMPOSE_REPLICATED=("${COMPOSE[@]}" -f "$ROOT/docker/docker-compose.replicated.yml")
IMAGE=pstrain:compose-test
MIN_ACCURACY=0.60  # 4000 training images; guessing gives 0.10
START=$(date +%s)
STARTED_DOCKERD=""
PROJECTS=()

say() { echo "compose_test: $*"; }
fail() { echo "compose_test: FAIL: $*" >&2; exit 1; }
skip() { say "SKIP: $*"; exit 0; }
elapsed() { echo $(($(date +%s) - $1)); }
# await_workers LABEL PROJECT IDS COMPOSE...: waits for the worker
# containers IDS, keeps the project's log in $WORK/PROJECT.log, and fails
# unless each exited 0.
await_workers() {
  local label=$1 project=$2 ids=$3 codes code
  shift 3
  codes=$(timeout 600 "$DOCKER" wait $ids) || fail "$label: workers did not finish within 600 s"
  "$@" -p "$project" logs --no-color >"$WORK/$project.log" 2>&1
  for code in $codes; do
    [ "$code" -eq 0 ] || { tail -40 "$WORK/$project.log" >&2; fail "$label: a worker exited $code (log: $WORK/$project.log)"; }
  done
}

cleanup() {
  set +e
  # The replicated files name every service and volume of either cluster.
  for project in "${PROJECTS[@]}"; do
    "${COMPOSE_REPLICATED[@]}" -p "$project" down -v --remove-orphans >/dev/null 2>&1
  done
  if [ -n "$STARTED_DOCKERD" ]; then
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
    kill -9 "$STARTED_DOCKERD" 2>/dev/null
  fi
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || skip "needs root to install Docker and start dockerd (run as root, as CI does)"
mkdir -p "$WORK"

missing=()
for p in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# dockerd: reuse a running one, else start our own in the background.
if ! "$DOCKER" info >/dev/null 2>&1; then
  [ -x /usr/sbin/dockerd ] || skip "no /usr/sbin/dockerd after installing docker.io"
  /usr/sbin/dockerd --pidfile "$WORK/dockerd.pid" >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    kill -0 "$STARTED_DOCKERD" 2>/dev/null || break
    sleep 1
  done
  if ! "$DOCKER" info >/dev/null 2>&1; then
    tail -5 "$WORK/dockerd.log" >&2
    STARTED_DOCKERD=""
    skip "dockerd does not start here (log above: $WORK/dockerd.log)"
  fi
  say "started dockerd (pid $STARTED_DOCKERD)"
fi

# debian:bookworm from debootstrap: Docker Hub is out of reach.
phase=$(date +%s)
if ! "$DOCKER" image inspect debian:bookworm >/dev/null 2>&1; then
  if [ ! -s "$WORK/bookworm-minbase.tar" ]; then
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" http://deb.debian.org/debian \
      >"$WORK/debootstrap.log" 2>&1 || { tail -5 "$WORK/debootstrap.log" >&2; fail "debootstrap failed"; }
    tar -C "$WORK/rootfs" -cf "$WORK/bookworm-minbase.tar" .
    rm -rf "$WORK/rootfs"
  fi
  "$DOCKER" import "$WORK/bookworm-minbase.tar" debian:bookworm >/dev/null
fi
say "base image ready ($(elapsed "$phase") s)"

# The Dockerfile installs its packages from the Debian mirror: say so
# plainly if containers cannot reach it, rather than failing mid-build.
"$DOCKER" run --rm debian:bookworm sh -c 'apt-get update -qq' >/dev/null 2>&1 ||
  fail "a container cannot reach the Debian mirror (apt-get update fails), which docker build needs"

# The .deb of the build CI made before (scripts/test.sh: ctest ran with no
# Docker engine, so its deb_package_test skipped this part), installed in a
# clean container of the base image. A CUDA build (a host with nvcc), which
# cpack refuses, gives way to scripts/package_deb.sh's CPU build (the
# programs and the module, no test) under $WORK.
phase=$(date +%s)
build=${BUILD_DIR:-$ROOT/build}
deb=""
if grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$build/CPackConfig.cmake" 2>/dev/null; then
  BUILD_DIR="$WORK/deb-build" "$ROOT/scripts/package_deb.sh" >"$WORK/package_deb.log" 2>&1 ||
    { tail -n 20 "$WORK/package_deb.log" >&2; fail "scripts/package_deb.sh failed (log: $WORK/package_deb.log)"; }
  deb=$(tail -n 1 "$WORK/package_deb.log")
  say "$build is a CUDA build: packaged a CPU build instead, $deb ($(elapsed "$phase") s)"
fi
DOCKER=$DOCKER "$ROOT/tests/packaging/deb_install_test.sh" "$build" $deb ||
  fail "the .deb does not install and run in a clean container"
say "package checked ($(elapsed "$phase") s)"

# The image: the Dockerfile's runtime-base stage with the programs of the
# CPU build just packaged (the host's Debian 12 libraries are the image's),
# its runtime stage's other COPY lines as they stand; compiling them again
# in a container took 8-9 minutes of CI. COMPOSE_FROM_SOURCE=1 (or no CPU
# build's programs) builds the whole Dockerfile instead.
phase=$(date +%s)
programs=${deb:+$WORK/deb-build/bin}
programs=${programs:-$build/bin}
prebuilt=1
for p in ps_server worker pslaunch psctl psreport; do [ -x "$programs/$p" ] || prebuilt=""; done
if [ -n "${COMPOSE_FROM_SOURCE:-}" ] || [ -z "$prebuilt" ] ||
   { [ -z "$deb" ] && grep -q 'CPACK_PSTRAIN_CUDA "ON"' "$build/CPackConfig.cmake" 2>/dev/null; }; then
  "$DOCKER" build -f "$ROOT/docker/Dockerfile" -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1 ||
    { tail -30 "$WORK/build.log" >&2; fail "docker build failed (log: $WORK/build.log)"; }
  say "image $IMAGE built from source ($(elapsed "$phase") s)"
else
  "$DOCKER" build -f "$ROOT/docker/Dockerfile" --target runtime-base -t "$IMAGE-base" "$ROOT" \
    >"$WORK/build.log" 2>&1 ||
    { tail -30 "$WORK/build.log" >&2; fail "docker build --target runtime-base failed (log: $WORK/build.log)"; }
  context=$WORK/image-context
  rm -rf "$context"
  mkdir -p "$context/build/bin"
  cp "$programs"/{ps_server,worker,pslaunch,psctl,psreport} "$context/build/bin/"
  cp -r "$ROOT/docker" "$ROOT/configs" "$ROOT/deploy" "$context/"
  { echo "FROM $IMAGE-base"
    sed -n '/^FROM runtime-base AS runtime$/,$p' "$ROOT/docker/Dockerfile" | sed '1d; s|--from=builder /build/bin/|build/bin/|; s| /build/bin/| build/bin/|g'
  } > "$context/Dockerfile"
  "$DOCKER" build -t "$IMAGE" "$context" >>"$WORK/build.log" 2>&1 ||
    { tail -30 "$WORK/build.log" >&2; fail "docker build of the image with $programs failed (log: $WORK/build.log)"; }
  say "image $IMAGE built: runtime-base and $programs ($(elapsed "$phase") s)"
fi

# Runs the cluster to completion: run_cluster MODE WORKERS WORKER_IPC EPOCHS,
# where WORKER_IPC is the workers' IPC namespace: service:ps (shared memory
# with the PS) or private (each its own: tensors over TCP).
run_cluster() {
  local mode=$1 workers=$2 ipc=$3 epochs=$4 project="pstrain-ci-$1"
  PROJECTS+=("$project")
  local phase
  phase=$(date +%s)
  export PSTRAIN_IMAGE=$IMAGE MODE=$mode WORKERS=$workers TRAIN_LIMIT=4000 EPOCHS=$epochs WORKER_IPC=$ipc
  "${COMPOSE[@]}" -p "$project" down -v --remove-orphans >/dev/null 2>&1 || true
  "${COMPOSE[@]}" -p "$project" up -d --no-build --scale "worker=$workers" >"$WORK/$project.up.log" 2>&1 ||
    { cat "$WORK/$project.up.log" >&2; fail "$mode: compose up failed"; }
  local ids
  ids=$("${COMPOSE[@]}" -p "$project" ps -q worker)
  [ "$(echo "$ids" | wc -w)" -eq "$workers" ] || fail "$mode: expected $workers worker containers, got: $ids"
  await_workers "$mode" "$project" "$ids" "${COMPOSE[@]}"
  local health
  health=$("$DOCKER" inspect -f '{{.State.Health.Status}}' "$("${COMPOSE[@]}" -p "$project" ps -q ps)")
  [ "$health" = healthy ] || fail "$mode: the PS health check says $health"
  # Every replica took a distinct task index.
  local tasks
  tasks=$(grep -o 'worker:[0-9]* computing' "$WORK/$project.log" | sort -u | wc -l)
  [ "$tasks" -eq "$workers" ] || fail "$mode: $tasks distinct worker tasks ran, expected $workers"
  local accuracy
  accuracy=$(sed -n 's/.*final: version [0-9]* test_accuracy \([0-9.]*\).*/\1/p' "$WORK/$project.log" | tail -1)
  [ -n "$accuracy" ] || fail "$mode: no 'final: ... test_accuracy' line from the chief (log: $WORK/$project.log)"
  awk -v a="$accuracy" -v min="$MIN_ACCURACY" 'BEGIN { exit !(a >= min) }' ||
    fail "$mode: test accuracy $accuracy is below $MIN_ACCURACY"
  local transport="through shared memory"
  [ "$ipc" = private ] && transport="over TCP"
  local chose
  chose=$(grep -c "tensors travel $transport" "$WORK/$project.log" || true)
  [ "$chose" -eq "$workers" ] ||
    fail "$mode: $chose of $workers workers said their tensors travel $transport (log: $WORK/$project.log)"
  "${COMPOSE[@]}" -p "$project" down -v --remove-orphans >/dev/null 2>&1
  say "$mode with $workers workers: all exited 0, PS healthy, test_accuracy $accuracy, tensors $transport ($(elapsed "$phase") s)"
}

# The replicated cluster, SYNC with 2 workers: once psctl status shows the
# primary at version kill_at or past it, its container is killed (SIGKILL;
# docker does not restart a container it killed). The backup must take over
# (its log), both workers follow it and exit 0, and the run must end at the
# version of a run without the kill (no step lost or repeated) with the
# chief's accuracy. 8000 images, batch 64: 62 steps an epoch, 1860 in all;
# 620 took 8-10 s on a 2-core VM, where compose up returns once the workers
# start and the first psctl status sees version 100-150. The run is three
# times that long so that the poll cannot miss it: a docker exec of psctl
# takes seconds on a loaded host, and 620 steps were once over before its
# first answer came.
run_replicated() {
  local workers=2 epochs=30 train_limit=8000 project="pstrain-ci-replicated"
  local steps=$((epochs * (train_limit / workers / 64))) kill_at=50
  local config=/etc/pstrain/compose-replicated.textproto
  PROJECTS+=("$project")
  local phase
  phase=$(date +%s)
  export PSTRAIN_IMAGE=$IMAGE MODE=sync WORKERS=$workers TRAIN_LIMIT=$train_limit EPOCHS=$epochs \
    WORKER_IPC=service:ps
  "${COMPOSE_REPLICATED[@]}" -p "$project" down -v --remove-orphans >/dev/null 2>&1 || true
  # Returns once the workers started, which wait for the primary's health check.
  "${COMPOSE_REPLICATED[@]}" -p "$project" up -d --no-build --scale "worker=$workers" \
    >"$WORK/$project.up.log" 2>&1 ||
    { cat "$WORK/$project.up.log" >&2; fail "replicated: compose up failed"; }
  local ids ps
  ids=$("${COMPOSE_REPLICATED[@]}" -p "$project" ps -q worker)
  [ "$(echo "$ids" | wc -w)" -eq "$workers" ] || fail "replicated: expected $workers worker containers, got: $ids"
  ps=$("${COMPOSE_REPLICATED[@]}" -p "$project" ps -q ps)
  # Polls the primary's Stats (its version shows nowhere else); each
  # docker exec of psctl paces the next.
  local version="" deadline=$(($(date +%s) + 120))
  while :; do
    version=$("$DOCKER" exec "$ps" psctl status --config="$config" --connect_timeout_seconds=2 2>/dev/null |
      awk '$1 == "ps:0" { print $3; exit }') || true
    [ -n "$version" ] && [ "$version" -ge "$kill_at" ] && break
    [ "$(date +%s)" -lt "$deadline" ] ||
      fail "replicated: the primary did not reach version $kill_at within 120 s (last seen: ${version:-none})"
  done
  [ "$version" -lt "$steps" ] || fail "replicated: the run had ended (version $version) before the kill"
  "$DOCKER" kill -s KILL "$ps" >/dev/null || fail "replicated: docker kill of the primary failed"
  say "replicated: killed the primary at version $version or later ($(elapsed "$phase") s)"
  await_workers replicated "$project" "$ids" "${COMPOSE_REPLICATED[@]}"
  # ps_server/service/shard_office.cc: "<office> is primary at epoch E, version V".
  local took
  took=$(sed -n 's/^ps-backup[-_0-9]* *| .*shard 0 replica 1 is primary at epoch \([0-9]*\), version \([0-9]*\).*/\1 \2/p' \
    "$WORK/$project.log" | head -1)
  [ -n "$took" ] ||
    fail "replicated: the backup never says 'shard 0 replica 1 is primary at epoch' (log: $WORK/$project.log)"
  local followed
  followed=$(grep "ps:0: its primary is now ps-backup:50051" "$WORK/$project.log" | awk '{ print $1 }' | sort -u | wc -l)
  [ "$followed" -eq "$workers" ] ||
    fail "replicated: $followed of $workers workers say they follow the backup (log: $WORK/$project.log)"
  local final accuracy
  final=$(sed -n 's/.*final: version \([0-9]*\) test_accuracy \([0-9.]*\).*/\1 \2/p' "$WORK/$project.log" | tail -1)
  [ -n "$final" ] || fail "replicated: no 'final: ... test_accuracy' line from the chief (log: $WORK/$project.log)"
  accuracy=${final#* }
  [ "${final%% *}" -eq "$steps" ] ||
    fail "replicated: the run ended at version ${final%% *}, not $steps: steps were lost or repeated (log: $WORK/$project.log)"
  [ "${took#* }" -lt "$steps" ] ||
    fail "replicated: the backup took over at version ${took#* }, after the run's last step: the kill came too late"
  awk -v a="$accuracy" -v min="$MIN_ACCURACY" 'BEGIN { exit !(a >= min) }' ||
    fail "replicated: test accuracy $accuracy is below $MIN_ACCURACY"
  "${COMPOSE_REPLICATED[@]}" -p "$project" down -v --remove-orphans >/dev/null 2>&1
  say "replicated: the backup took over at epoch ${took% *}, version ${took#* }; both workers followed it and exited 0; $steps steps, test_accuracy $accuracy ($(elapsed "$phase") s)"
}

run_cluster sync 2 service:ps 1
# ASYNC scales each gradient's step by 1 / (1 + staleness), and on a loaded
# 2-core machine three workers interleave more: one epoch (60 updates) ends
# between 0.60 and 0.67 there, two epochs between 0.75 and 0.79.
run_cluster async 3 private 2
run_replicated
say "PASS in $(elapsed "$START") s"
