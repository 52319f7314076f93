#!/bin/sh
# Starts one task of the compose cluster (docker/docker-compose.yml):
#   pstrain-entrypoint ps       the PS shard, listening on every interface
#   pstrain-entrypoint worker   a worker whose index comes from its container name
#   pstrain-entrypoint CMD...   runs CMD
# Environment: MODE (sync|async|ssp), STALENESS (ssp), WORKERS, CONFIG.
set -eu

CONFIG=${CONFIG:-/etc/pstrain/compose.textproto}
MODE=${MODE:-sync}

# --scale worker=N gives containers named <project>_worker_<n> (Compose 1.x)
# or <project>-worker-<n> (Compose v2), n = 1..N. Docker's DNS answers the
# reverse lookup of a container's address with that name, so the ordinal
# n - 1 is the task index: stable across restarts, and no two replicas share one.
worker_index() {
  address=$(getent hosts "$(hostname)" | awk '{print $1; exit}')
  name=$(getent -s dns hosts "$address" | awk '{print $2; exit}')
  name=${name%%.*}
  ordinal=$(printf '%s\n' "$name" | sed -n 's/.*[-_]\([0-9][0-9]*\)$/\1/p')
  if [ -z "$ordinal" ]; then
    echo "pstrain-entrypoint: error: cannot tell this worker's index: container name \"$name\" (address $address) does not end in _<n> or -<n>; start workers with compose, or run 'worker --task=worker:<i>' yourself" >&2
    exit 2
  fi
  index=$((ordinal - 1))
  if [ "$index" -ge "${WORKERS:-2}" ]; then
    echo "pstrain-entrypoint: error: this is worker replica $ordinal but WORKERS=${WORKERS:-2}; set WORKERS to the number of worker replicas (WORKERS=N docker compose up)" >&2
    exit 2
  fi
  echo "$index"
}

overrides="--mode=$MODE"
if [ -n "${STALENESS:-}" ]; then overrides="$overrides --staleness=$STALENESS"; fi

case "${1:-}" in
  ps)
    # The compose network is private to the project: plaintext is allowed
    # there unless the config turns TLS on.
    exec ps_server --config="$CONFIG" --task=ps:0 --listen=0.0.0.0:50051 --allow_insecure $overrides
    ;;
  worker)
    index=$(worker_index)
    exec worker --config="$CONFIG" --task="worker:$index" $overrides
    ;;
  *)
    exec "$@"
    ;;
esac
