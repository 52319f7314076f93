#!/usr/bin/env bash
# ps_bench_vs_pslite.sh: one round of our TCP path beside ps-lite, the peer
# (scripts/pslite_peer.sh), at the same sizes and workers: the peer's rows,
# then ps_bench's (--transport=tcp --peer_json), one JSON object a line.
# benchmarks/rounds.py alternates it over rounds and worker counts:
#
#   /usr/bin/python3 benchmarks/rounds.py --benchmark=ps_bench_pslite --rounds=3 \
#       --vary=workers=1,2 --keys=size_bytes,workers \
#       --json=docs/bench/ps_bench_pslite.json -- scripts/ps_bench_vs_pslite.sh --dir=DIR
#
# --dir (outside the repository) and --src are pslite_peer.sh's; --sizes
# (default 4MiB,64MiB), --workers (default 1) and --seconds apply to both.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
peer_args=()
sizes="4MiB,64MiB" workers=1 seconds=3
for arg in "$@"; do
  case "$arg" in
    --dir=*|--src=*|--commit=*) peer_args+=("$arg") ;;
    --sizes=*) sizes="${arg#*=}" ;;
    --workers=*) workers="${arg#*=}" ;;
    --seconds=*) seconds="${arg#*=}" ;;
    *) echo "ps_bench_vs_pslite.sh: error: unknown argument $arg" >&2; exit 2 ;;
  esac
done
rows="$(mktemp)"
trap 'rm -f "$rows"' EXIT
"$here/scripts/pslite_peer.sh" "${peer_args[@]}" --sizes="$sizes" --workers="$workers" \
  --seconds="$seconds" > "$rows"
cat "$rows"
"$here/build/bin/ps_bench" --transport=tcp --iperf=false --json --sizes="$sizes" \
  --workers="$workers" --seconds="$seconds" --peer_json="$rows"
