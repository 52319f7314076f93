#!/usr/bin/env bash
# Bounded libFuzzer runs: builds the fuzz/ targets with clang in build-asan/
# (ASan + UBSan + coverage; the tree scripts/sanitize.sh's ASan tests use,
# configured by scripts/configure_asan.sh, so CI compiles the instrumented
# libraries once) and runs each for FUZZ_SECONDS (default 60) on a copy of
# its corpus, so the repository's corpus does not grow. Fails on the first
# crash, leak, timeout or broken invariant and prints the reproducer;
# replay one with: build-asan/bin/<fuzzer> <reproducer>. FUZZ_MERGE=1 grows
# the repository's corpus instead (see the end of this file).
# Needs clang, libclang-rt-14-dev (libFuzzer) and llvm (llvm-symbolizer),
# which scripts/install_deps.sh lists and installs where missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh

BUILD_DIR=${FUZZ_BUILD_DIR:-build-asan}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZERS=(config_fuzzer shard_fuzzer chunk_wire_fuzzer rpc_limits_fuzzer shm_exchange_fuzzer
         replica_fuzzer)

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (scripts/install_deps.sh)" >&2; exit 2; }
done

started=$SECONDS
scripts/configure_asan.sh "$BUILD_DIR"
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${FUZZERS[@]}"
echo "== fuzz: built in $((SECONDS - started)) s" >&2

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

failed=()
for fuzzer in "${FUZZERS[@]}"; do
  name=${fuzzer%_fuzzer}
  work=$BUILD_DIR/fuzz-runs/$name
  rm -rf "$work"
  mkdir -p "$work/artifacts"
  cp -r "fuzz/corpus/$name" "$work/corpus"
  echo "== fuzz: $fuzzer for ${FUZZ_SECONDS} s" >&2
  rc=0
  "$BUILD_DIR/bin/$fuzzer" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" >"$work/log" 2>&1 || rc=$?
  # The last status line carries coverage (cov: edges, ft: features) and
  # the corpus; the final stats the executions per second.
  grep -E '^#[0-9]+.*(DONE|cov:)' "$work/log" | tail -n 1 >&2 || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$work/log" >&2 || true
  reproducers=$(find "$work/artifacts" -type f)
  if [ "$rc" -ne 0 ] || [ -n "$reproducers" ]; then
    tail -n 60 "$work/log" >&2
    echo "fuzz.sh: $fuzzer failed (exit $rc); full log: $work/log" >&2
    for r in $reproducers; do echo "fuzz.sh: reproducer: $r" >&2; done
    failed+=("$fuzzer")
  fi
done

# FUZZ_MERGE=1: add to fuzz/corpus/ the inputs of this run that reach new
# edges (libFuzzer -merge=1 keeps the smallest such set; -use_counters=0
# judges by edges alone, not hit counts, which keeps about a third as many
# files for the same edges), to be committed.
if [ "${FUZZ_MERGE:-0}" = 1 ] && [ ${#failed[@]} -eq 0 ]; then
  for fuzzer in "${FUZZERS[@]}"; do
    name=${fuzzer%_fuzzer}
    before=$(ls "fuzz/corpus/$name" | wc -l)
    "$BUILD_DIR/bin/$fuzzer" -merge=1 -use_counters=0 -max_len=65536 "fuzz/corpus/$name" \
      "$BUILD_DIR/fuzz-runs/$name/corpus" >"$BUILD_DIR/fuzz-runs/$name/merge.log" 2>&1
    echo "== fuzz: fuzz/corpus/$name: $before -> $(ls "fuzz/corpus/$name" | wc -l) inputs" >&2
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "== fuzz: all fuzzers ran ${FUZZ_SECONDS} s without a finding" >&2
