#!/usr/bin/env bash
# Lock annotations, checked. GCC ignores Abseil's ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED and the like; clang's -Wthread-safety reads
# them. Every C++ source of the libraries and programs (not tests, fuzzers or
# CUDA kernels) is compiled by clang with -Werror=thread-safety, syntax only
# (no code is generated, so this takes a fraction of a build), in
# build-lint/. Any finding fails the run. CI runs it; it needs clang, which
# scripts/install_deps.sh installs where missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
BUILD_DIR=${LINT_BUILD_DIR:-build-lint}
command -v clang++ >/dev/null || { echo "lint.sh: clang++ not found (scripts/install_deps.sh)" >&2; exit 2; }

started=$SECONDS
# In unity batches, as every build compiles the sources: the headers of
# gRPC and protobuf, most of a syntax check's time, are parsed once a batch,
# not once a file (359 s on 2 cores one file at a time, 120 s batched).
# LINT_UNITY=OFF checks each source alone, which also shows one that
# compiles only inside its batch.
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DPS_WITH_CUDA=OFF -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD="${LINT_UNITY:-ON}" >/dev/null
# The generated protobuf and gRPC headers that the sources include.
generated=()
for stem in config event ps result; do generated+=("proto/$stem.pb.h"); done
generated+=(proto/ps.grpc.pb.h proto/etcd/kv.pb.h proto/etcd/rpc.pb.h proto/etcd/rpc.grpc.pb.h)
# And the generated source that a unity batch of common/ includes.
generated+=(common/embedded_config.cc)
cmake --build "$BUILD_DIR" --target "${generated[@]}" >/dev/null

/usr/bin/python3 - "$BUILD_DIR" "${JOBS:-2}" <<'PY'
import concurrent.futures, json, os, shlex, subprocess, sys

build, jobs = sys.argv[1], int(sys.argv[2])
root = os.getcwd()
with open(os.path.join(build, "compile_commands.json")) as f:
    commands = json.load(f)
checks = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
          "-Wno-unknown-warning-option"]
sources = []
for entry in commands:
    source = os.path.relpath(entry["file"], root)
    # A unity batch (build-lint/<dir>/CMakeFiles/<target>.dir/Unity/unity_N_cxx.cxx)
    # stands for the sources of its target's folder.
    batch = "/Unity/unity_" in source and source.endswith(".cxx")
    folder = os.path.relpath(source, build).split("/CMakeFiles/")[0] + "/" if batch else source
    if folder.startswith(("..", "tests/", "fuzz/", "build")) or not (batch or source.endswith(".cc")):
        continue
    argv = shlex.split(entry["command"])
    # Drop the output: syntax only.
    if "-o" in argv:
        at = argv.index("-o")
        del argv[at:at + 2]
    sources.append((source, argv + checks, entry["directory"]))

def check(item):
    source, argv, directory = item
    run = subprocess.run(argv, cwd=directory, capture_output=True, text=True)
    return source, run.returncode, run.stderr

if not sources:
    sys.exit("lint.sh: compile_commands.json names no source of ours")
failed = []
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for source, code, errors in pool.map(check, sorted(sources)):
        if code != 0:
            failed.append(source)
            sys.stderr.write(errors)
print(f"== lint: {len(sources)} compile commands checked for -Wthread-safety, {len(failed)} with findings",
      file=sys.stderr)
sys.exit(1 if failed else 0)
PY
echo "== lint: done in $((SECONDS - started)) s" >&2
