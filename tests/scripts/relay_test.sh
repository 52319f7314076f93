#!/usr/bin/env bash
# deploy/relay/nghttpx.conf in front of a ps_server, as docs/hardening.md
# starts it (the PS at a socket file only this user reaches): 1 PS + 2
# workers train the default model through the relay to its usual accuracy,
# in plaintext and with mutual TLS and a token on both of the relay's sides
# (as deploy/k8s/ps.yaml runs it); then floods the PS
# alone cannot bound (HTTP/2 streams opened and reset in a loop, a header
# block that never ends) are ended by the relay: each flooding connection is
# closed, the PS's resident memory stays flat and a Stats call through the
# relay is answered meanwhile; and one client re-opening 150 Exchange calls
# that never send a message takes no other client's place: every Stats
# through the relay meanwhile is answered within 1 s.
# Needs nghttpx (Debian's nghttp2-proxy; skipped, exit 77, otherwise).
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v nghttpx > /dev/null; then
  echo "relay_test: skipped: nghttpx is not installed (Debian package nghttp2-proxy)"
  exit 77
fi
BIN=$BUILD_DIR/bin
FLOOD=$BUILD_DIR/tests/support/http2_flood_client
HEADERLESS=$BUILD_DIR/tests/support/headerless_exchange_client
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

resident_mib() { awk '/^VmRSS/ { print int($2 / 1024) }' "/proc/$1/status"; }
# Waits (bounded) until a file is not empty.
wait_for_file() {
  for _ in $(seq 600); do
    [[ -s $1 ]] && return 0
    sleep 0.1
  done
  echo "relay_test: $1 never appeared" >&2
  return 1
}

stats_through_relay() {
  timeout 10 "$BIN/psctl" status --config="$WORK/cluster.textproto" > /dev/null
}

# Starts a PS at the socket file $WORK/ps.sock and the relay in front of it
# at cluster.ps[0] (the config in $WORK/cluster.textproto); sets PS and
# RELAY to their pids.
start_ps_and_relay() {
  rm -f "$WORK/ps_port" "$WORK/relay.pid"
  "$BIN/ps_server" "${COMMON[@]}" --listen="unix:$WORK/ps.sock" --port_file="$WORK/ps_port" > "$WORK/ps.log" 2>&1 &
  PS=$!
  PIDS+=("$PS")
  wait_for_file "$WORK/ps_port"
  if [[ $(stat -c %a "$WORK/ps.sock") != 600 ]]; then
    echo "relay_test: the PS's socket file is not of mode 600" >&2
    exit 1
  fi
  local backend="unix:$WORK/ps.sock;;proto=h2"
  if [[ $1 == tls ]]; then
    # As deploy/k8s/ps.yaml: TLS on both sides, the task's certificate
    # verified at the front, the relay's own (the same one) at the PS.
    nghttpx --conf="$REPO/deploy/relay/nghttpx.conf" --pid-file="$WORK/relay.pid" \
      --frontend="127.0.0.1,$RELAY_PORT" --backend="$backend;tls;sni=pstrain-ps" \
      --verify-client --verify-client-cacert="$WORK/ca.crt" --cacert="$WORK/ca.crt" \
      --client-private-key-file="$WORK/tls.key" --client-cert-file="$WORK/tls.crt" \
      --errorlog-file="$WORK/relay.log" "$WORK/tls.key" "$WORK/tls.crt" 2> "$WORK/relay.stderr" &
  else
    nghttpx --conf="$REPO/deploy/relay/nghttpx.conf" --pid-file="$WORK/relay.pid" \
      --frontend="127.0.0.1,$RELAY_PORT;no-tls" --backend="$backend" \
      --errorlog-file="$WORK/relay.log" 2> "$WORK/relay.stderr" &
  fi
  RELAY=$!
  PIDS+=("$RELAY")
  wait_for_file "$WORK/relay.pid"
}

stop_ps_and_relay() {
  kill "$PS" "$RELAY"
  # A PS stops on SIGTERM with status 0; anything else is reported with its
  # log's end, so that a rare fault at shutdown is seen (not failed on).
  local status=0
  wait "$PS" || status=$?
  if ((status != 0)); then
    echo "relay_test: note: the PS exited with status $status at SIGTERM; its log ends:" >&2
    tail -n 20 "$WORK/ps.log" >&2
  fi
  wait "$RELAY" || true
}

# 1 PS + 2 workers through the relay, 1 epoch; the chief's accuracy.
train_through_relay() {
  local workers=()
  for w in 0 1; do
    "$BIN/worker" "${COMMON[@]}" --task=worker:$w --result_file="$WORK/result$w.json" > "$WORK/worker$w.log" 2>&1 &
    workers+=("$!")
    PIDS+=("$!")
  done
  for pid in "${workers[@]}"; do
    if ! wait "$pid"; then
      echo "relay_test: a worker failed ($1):" >&2
      tail -n 5 "$WORK"/worker*.log "$WORK/relay.log" >&2
      exit 1
    fi
  done
  /usr/bin/python3 - "$WORK/result0.json" "$1" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
print("through the relay (%s): test accuracy %.4f" % (sys.argv[2], result["test_accuracy"]))
assert result["test_accuracy"] >= 0.80, result
PY
}

# The relay's port: one the kernel has just given out, free again.
RELAY_PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Shared memory off: every byte crosses the relay.
COMMON=(--config="$WORK/cluster.textproto" --epochs=1 --shm=off)

# Mutual TLS and a token, one certificate for every task (as the Kubernetes
# manifests have it).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=pstrain-test-ca -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2> /dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=pstrain-ps \
  -keyout "$WORK/tls.key" -out "$WORK/tls.csr" 2> /dev/null
printf 'subjectAltName=DNS:pstrain-ps\nextendedKeyUsage=serverAuth,clientAuth\n' > "$WORK/tls.ext"
openssl x509 -req -in "$WORK/tls.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" -CAcreateserial \
  -days 1 -extfile "$WORK/tls.ext" -out "$WORK/tls.crt" 2> /dev/null
export PSTRAIN_TOKEN=relay-test-token
{
  echo "cluster { ps: \"127.0.0.1:$RELAY_PORT\" workers: 2"
  echo "  tls { cert: \"$WORK/tls.crt\" key: \"$WORK/tls.key\" ca: \"$WORK/ca.crt\""
  echo "        require_client_cert: true server_name: \"pstrain-ps\" }"
  echo "  auth { token_env: \"PSTRAIN_TOKEN\" } }"
  sed -n '/^training/,$p' "$REPO/configs/local.textproto"
} > "$WORK/cluster.textproto"
start_ps_and_relay tls
train_through_relay "mutual TLS, token"
stop_ps_and_relay

sed "s/127.0.0.1:50051/127.0.0.1:$RELAY_PORT/" "$REPO/configs/local.textproto" > "$WORK/cluster.textproto"
start_ps_and_relay plaintext
train_through_relay plaintext

# Floods: the relay ends each flooding connection (the client exits 0 when
# its connection is closed; against the PS alone it never is).
for kind in rapid_reset continuation; do
  before=$(resident_mib "$PS")
  timeout 60 "$FLOOD" "$RELAY_PORT" "$kind" > /dev/null || {
    echo "relay_test: the relay did not end a $kind flood within 60 s" >&2
    exit 1
  }
  # Five more flooding connections, one after the other, while Stats calls
  # go through the relay.
  (for _ in 1 2 3 4 5; do timeout 60 "$FLOOD" "$RELAY_PORT" "$kind" > /dev/null; done) &
  ATTACK=$!
  PIDS+=("$ATTACK")
  stats_through_relay
  wait "$ATTACK"
  stats_through_relay
  after=$(resident_mib "$PS")
  echo "$kind through the relay: PS resident ${before} -> ${after} MiB"
  # Against the PS alone, either flood grows it by more than 1 GiB in 5 s.
  if ((after > before + 64)); then
    echo "relay_test: the PS grew by $((after - before)) MiB under a $kind flood" >&2
    exit 1
  fi
done

# One client holds 150 Exchange calls open through the relay without a
# message, re-opening each as the PS ends it (past --max_streams it ends
# the oldest); the relay funnels every client into its few connections to
# the PS, and no other client's call may wait behind them.
"$HEADERLESS" "127.0.0.1:$RELAY_PORT" 150 15 > "$WORK/headerless.out" 2>&1 &
ATTACK=$!
PIDS+=("$ATTACK")
wait_for_file "$WORK/headerless.out"
slowest=0
for _ in $(seq 10); do
  start=$(date +%s%N)
  if ! timeout 5 "$BIN/psctl" status --config="$WORK/cluster.textproto" --connect_timeout_seconds=4 > /dev/null; then
    echo "relay_test: Stats through the relay failed while a client held 150 calls open" >&2
    exit 1
  fi
  took=$((($(date +%s%N) - start) / 1000000))
  ((took > slowest)) && slowest=$took
done
wait "$ATTACK"
echo "150 calls held open through the relay: slowest of 10 Stats ${slowest} ms ($(tail -n 1 "$WORK/headerless.out"))"
if ((slowest > 1000)); then
  echo "relay_test: a Stats call took ${slowest} ms while a client held 150 calls open" >&2
  exit 1
fi
stop_ps_and_relay

# pslaunch --relay starts the same: each shard at a socket file in the run's
# directory, nghttpx at its address.
LAUNCH_PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed "s/127.0.0.1:50051/127.0.0.1:$LAUNCH_PORT/" "$REPO/configs/local.textproto" > "$WORK/launch.textproto"
if ! timeout 300 "$BIN/pslaunch" --config="$WORK/launch.textproto" --relay \
    --relay_conf="$REPO/deploy/relay/nghttpx.conf" --epochs=1 --shm=off \
    > "$WORK/launch.out" 2> "$WORK/launch.err"; then
  echo "relay_test: pslaunch --relay failed:" >&2
  tail -n 20 "$WORK/launch.err" "$WORK/launch.out" >&2
  exit 1
fi
grep -q "started ps:0 (pid [0-9]*), relay:0 (pid [0-9]*), worker:0" "$WORK/launch.err" || {
  echo "relay_test: pslaunch --relay did not start relay:0 after ps:0" >&2
  exit 1
}
grep -q "\[ps:0\] .* serving unix:/tmp/pslaunch\.[^ ]*/ps-0\.sock" "$WORK/launch.out" || {
  echo "relay_test: ps:0 did not serve at its socket file" >&2
  exit 1
}
/usr/bin/python3 - "$(tail -n 1 "$WORK/launch.out")" <<'PY'
import json, sys
summary = json.loads(sys.argv[1])
print("pslaunch --relay: test accuracy %.4f" % summary["test_accuracy"])
assert summary["test_accuracy"] >= 0.80, summary
PY
echo "relay_test: passed"
