#!/usr/bin/env bash
# The unit and concurrency tests under AddressSanitizer + UndefinedBehavior-
# Sanitizer (build-asan/, clang: the tree scripts/fuzz.sh builds its targets
# in, configured by scripts/configure_asan.sh) and under ThreadSanitizer
# (build-tsan/, g++). Any report fails the run. Usage:
# scripts/sanitize.sh [asan|tsan]... (default: both). CI runs it after the
# main tests; it needs only the packages of scripts/install_deps.sh, which it
# installs where missing (clang and g++ ship their sanitizer runtimes).
#
# Only the tests' own binaries are built (-O1, line tables only, to keep the
# build short), so ctest lists every other test as <name>_NOT_BUILT; those are
# excluded below. Left out on purpose: the multi-process tests
# (pslaunch_e2e_test, fault_test, bundle_test, launch_test), which fork the
# real binaries and take minutes; their code is the same libraries tested here;
# k8s_manifests_test and kubeflow_manifest_test, scripts that run the shipped
# ps_server (not built); deb_package_test, which installs and packs the
# programs (not built); netns_cluster_test, which runs the shipped ps_server
# and worker across network namespaces (not built); relay_test, which runs
# the shipped ps_server, worker and pslaunch behind nghttpx (not built);
# rounds_test and benchmark_tables_test, Python tests of the benchmark
# scripts (rounds_test runs metrics_bench, which is not built here). The
# fuzzers' corpus replays (<name>_fuzzer_corpus) run under ASan + UBSan
# only; scripts/fuzz.sh then searches from that corpus in the same tree.
#
# ThreadSanitizer and Debian's uninstrumented libabsl: absl::Mutex blocks on
# futexes inside libabsl_synchronization.so, so TSan would see none of our
# locking and report every field that a mutex protects. Two ways out were
# weighed. Moving our synchronization to std::mutex (which TSan intercepts)
# would change ParameterShard, Checkpointer, Trainer and ps_server/main.cc,
# lose Abseil's thread-safety annotations, and leave the next absl::Mutex
# someone adds silently unchecked. Wrapping instead keeps the code as it is
# and covers every current and future call: with PST_SANITIZE=thread, CMake
# links scripts/tsan_absl_mutex.cc into every executable and -Wl,--wrap
# routes our calls to absl::Mutex, CondVar and Notification through it,
# adding __tsan_acquire/__tsan_release; check_tsan_wrappers proves it works.
# The wrap list is read from that file; a changed absl namespace fails its
# static_assert, and scripts/tsan.supp holds only reports whose every frame
# is inside the uninstrumented libraries (each one justified there).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
ROOT=$PWD
JOBS=${JOBS:-2}

# Tests whose code runs in this process only, or crosses gRPC only to a
# server in the same process (training_test runs whole clusters in-process;
# load_test drives 32 pushing threads against one shard).
ASAN_TESTS=(kernels_test worker_test common_test placement_test rpc_test ps_core_test ps_server_test consistency_policy_test chunk_streams_test rpc_limits_test step_exchange_test ps_client_shm_test training_test load_test connection_gate_test ps_tiers_test)
# And the membership client (its lease thread, watch and keep-alive streams)
# against the etcd each of its tests starts: only etcd runs outside.
ASAN_TESTS+=(membership_test shard_office_test)
# And every fuzzer's seed corpus through its entry point (ctest's
# <name>_fuzzer_corpus): the regressions the fuzzers found, under ASan + UBSan.
for fuzzer in config shard chunk_wire rpc_limits shm_exchange replica; do
  ASAN_TESTS+=("${fuzzer}_fuzzer_replay")
done
# Under TSan only the tests that run no gRPC thread: the concurrent
# ParameterShard tests (pushers, pullers, stoppers on plain threads against
# one shard), the Checkpointer's thread, kernels, codecs, configs. gRPC and
# protobuf hand each message between their threads through completion queues
# and lock-free queues compiled without TSan. Run under TSan, the gRPC tests
# gave thousands of reports at every step of a call (byte buffers,
# ProtoBufferReader, parse contexts, ClientContext, delete); in a sample of
# 1 540 the racing access was in gRPC, protobuf (with the generated
# ps.pb.cc), Abseil or libstdc++ code every time, never in ps_server/,
# worker/, common/ or tests/. Suppressing them would take rules broad enough
# to hide our own races on gRPC threads, so those tests run under ASan +
# UBSan only. So does ps_tiers_test: RocksDB (uninstrumented) flushes and
# compacts on threads of its own.
TSAN_TESTS=(kernels_test worker_test common_test placement_test rpc_test ps_core_test ps_server_test consistency_policy_test)
# The gRPC tests by name, so that a build-tsan/ where training_test or
# load_test happen to be built still skips them. CompletionDriverTest drives
# a gRPC completion queue with gRPC alarms: its one report was in Abseil's
# lock-order graph, which gRPC's own mutexes feed (uninstrumented).
TSAN_GRPC_TESTS='^PsClientTest\.|^PsClientShmTest\.|MaxRequestBytesTest\.|StartGrpcServerTest\.|ShmExchangeTest\.|^ReplicaSenderTest\.|^TrainingTest\.|ConvergenceTest\.|^LoadTest\.|^CompletionDriverTest\.'
# Not run under the sanitizers: the full Fashion-MNIST convergence run (about
# 4 minutes under ASan on 2 cores, most of this script's test time). Its
# concurrent paths are those of the small SYNC/ASYNC/SSP convergence runs and
# the load test, which do run; its bfloat16 codec is covered by common_test.
SKIPPED='^TrainingTest\.FashionMnistTrainsWithBfloat16OnTheWire$'
# Not run under ASan+UBSan: the gate test that drives a server past its
# descriptor limit on purpose (caps above what the process can hold, which
# ps_server never configures: its cap leaves a reserve). There gRPC's own
# code runs out of descriptors too; UBSan reports a shared_ptr control
# block with an invalid vptr inside inlined grpc++ code and the listener
# does not recover under ASan's slower allocator. It passes in the plain
# build, where it checks that the gate itself survives EMFILE.
ASAN_SKIPPED='^ConnectionGateBurstTest\.RunningOutOfDescriptorsLeavesTheListenerListening$'

# Link flags that route our calls into absl's synchronization through the
# annotating wrappers, for the self-check below (the CMake build adds the
# same to every executable when PST_SANITIZE is thread).
tsan_link_flags() {
  local dir=$1
  local obj=$ROOT/$dir/tsan_absl_mutex.o
  mkdir -p "$dir"
  if [ ! -f "$obj" ] || [ scripts/tsan_absl_mutex.cc -nt "$obj" ]; then
    ${CXX:-c++} -std=c++20 -O1 -g1 -fsanitize=thread -c scripts/tsan_absl_mutex.cc -o "$obj"
  fi
  local flags="$obj"
  local sym
  for sym in $(sed -n 's|^// wrap: ||p' scripts/tsan_absl_mutex.cc); do
    flags+=" -Wl,--wrap=$sym"
  done
  echo "$flags"
}

# Proves the wrappers work on this machine's libabsl before trusting a clean
# TSan run (see scripts/tsan_absl_mutex_check.cc).
check_tsan_wrappers() {
  local dir=$1
  local bin=$ROOT/$dir/tsan_absl_mutex_check
  # shellcheck disable=SC2046  # word splitting of the flag lists is meant
  ${CXX:-c++} -std=c++20 -O1 -g1 -fsanitize=thread scripts/tsan_absl_mutex_check.cc \
    $(tsan_link_flags "$dir") $(pkg-config --libs absl_synchronization) -o "$bin"
  if ! "$bin" locked; then
    echo "sanitize.sh: TSan reports absl::Mutex-protected state: the wrappers in scripts/tsan_absl_mutex.cc do not take effect" >&2
    exit 1
  fi
  if "$bin" racy 2>"$ROOT/$dir/tsan_absl_mutex_check.log"; then
    echo "sanitize.sh: TSan missed a real race with the wrappers linked in (scripts/tsan_absl_mutex.cc)" >&2
    exit 1
  fi
  grep -q "WARNING: ThreadSanitizer: data race" "$ROOT/$dir/tsan_absl_mutex_check.log" || {
    echo "sanitize.sh: the racy check failed without a race report:" >&2
    cat "$ROOT/$dir/tsan_absl_mutex_check.log" >&2
    exit 1
  }
  echo "== tsan: the absl::Mutex wrappers hide no race and report no false one" >&2
}

run_suite() {
  local name=$1 sanitize=$2 dir=$3
  shift 3
  local tests=("$@")
  local started=$SECONDS
  echo "== $name: configuring and building ${tests[*]} in $dir" >&2
  if [ "$name" = tsan ]; then check_tsan_wrappers "$dir"; fi
  if [ "$name" = asan ]; then
    scripts/configure_asan.sh "$dir"
  else
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DPS_WITH_CUDA=OFF \
      -DPST_SANITIZE="$sanitize" >/dev/null
  fi
  cmake --build "$dir" -j "$JOBS" --target "${tests[@]}"
  echo "== $name: built in $((SECONDS - started)) s; running ctest" >&2
  started=$SECONDS
  local skipped=$SKIPPED
  if [ "$name" = tsan ]; then skipped+="|$TSAN_GRPC_TESTS|_fuzzer_corpus\$"; fi
  if [ "$name" = asan ]; then skipped+="|$ASAN_SKIPPED"; fi
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j "$JOBS" -E "_NOT_BUILT\$|^bundle_test\$|^k8s_manifests_test\$|^kubeflow_manifest_test\$|^deb_package_test\$|^netns_cluster_test\$|^netns_partition_test\$|^relay_test\$|^rounds_test\$|^benchmark_tables_test\$|$skipped")
  echo "== $name: tests passed in $((SECONDS - started)) s" >&2
}

# handle_sigbus=0: SIGBUS is the shared-memory guard's (common/shared_memory.cc),
# and its tests send and cause SIGBUS on purpose; the sanitizer's own handler,
# installed first, would take the signals the guard hands on and abort.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:detect_leaks=1:strict_string_checks=1:handle_sigbus=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 handle_sigbus=0 suppressions=$ROOT/scripts/tsan.supp}

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(asan tsan)
for suite in "${suites[@]}"; do
  case $suite in
    asan) run_suite asan "" "${ASAN_BUILD_DIR:-build-asan}" "${ASAN_TESTS[@]}" ;;
    tsan) run_suite tsan thread "${TSAN_BUILD_DIR:-build-tsan}" "${TSAN_TESTS[@]}" ;;
    *) echo "sanitize.sh: unknown suite '$suite' (asan or tsan)" >&2; exit 2 ;;
  esac
done
