#!/bin/sh
# Starts one task of the compose cluster (docker/docker-compose.yml, and
# docker/docker-compose.replicated.yml over it):
#   pstrain-entrypoint ps         the PS shard (replica 0 of shard 0), listening on
#                                 PS_LISTEN (default 0.0.0.0:50051)
#   pstrain-entrypoint ps-backup  a backup of a shard: replica REPLICA (default 1) of
#                                 shard SHARD (default 0), listening on PS_LISTEN, else
#                                 on its address in the config's cluster.ps_backups
#   pstrain-entrypoint worker     a worker whose index comes from its container name
#   pstrain-entrypoint etcd       a one-member etcd holding the shards' membership:
#                                 clients on 0.0.0.0:2379, advertised as
#                                 http://ADVERTISE_HOST:2379 (default: etcd, the compose
#                                 service), data in /var/lib/etcd/data (mount a volume
#                                 at /var/lib/etcd)
#   pstrain-entrypoint CMD...     runs CMD
# Environment: MODE (sync|async|ssp), STALENESS (ssp), WORKERS, CONFIG, and
# the variables above.
#
# A replica of a replicated shard names the address it listens on in etcd,
# where the other replicas of its shard look for it: give it an address they
# can dial (its service name, PS_LISTEN=ps:50051), not 0.0.0.0.
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
    exec ps_server --config="$CONFIG" --task=ps:0 --listen="${PS_LISTEN:-0.0.0.0:50051}" \
      --allow_insecure $overrides
    ;;
  ps-backup)
    listen=""
    if [ -n "${PS_LISTEN:-}" ]; then listen="--listen=$PS_LISTEN"; fi
    exec ps_server --config="$CONFIG" --task="ps:${SHARD:-0}" --replica="${REPLICA:-1}" $listen \
      --allow_insecure $overrides
    ;;
  etcd)
    # One member: its peer URL stays on the loopback. The heartbeat and
    # election timeout are pslaunch's own etcd's (cluster/membership/local_etcd.cc),
    # which lower etcd's minimum lease to 1 s (cluster.membership.lease_seconds: 1).
    # The data go to a folder below the mount point (a fresh file system's
    # lost+found does not suit etcd). No ETCD_* variable here: etcd reads
    # those as its flags.
    exec etcd --name=pstrain --data-dir=/var/lib/etcd/data \
      --listen-client-urls=http://0.0.0.0:2379 \
      --advertise-client-urls="http://${ADVERTISE_HOST:-etcd}:2379" \
      --listen-peer-urls=http://127.0.0.1:2380 \
      --initial-advertise-peer-urls=http://127.0.0.1:2380 \
      --initial-cluster=pstrain=http://127.0.0.1:2380 \
      --heartbeat-interval=50 --election-timeout=500
    ;;
  worker)
    index=$(worker_index)
    exec worker --config="$CONFIG" --task="worker:$index" $overrides
    ;;
  *)
    exec "$@"
    ;;
esac
