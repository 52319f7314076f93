#!/usr/bin/env bash
# The README's two commands in their order on a fresh machine: the first
# (scripts/quickstart.sh) configures before the Python module's packages are
# installed, the second (scripts/test.sh) after. Played here by hiding
# pybind11-dev and the interpreter's headers from a first configure
# (CMAKE_IGNORE_PATH), then configuring again as scripts/test.sh does
# (scripts/configure.sh -DPST_REQUIRE_PYTHON=ON): the module is found, not
# left out for good by the first configure's cache. Still hidden, the second
# configure stops with one line naming the packages.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PYTHON_INCLUDE=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')
HIDDEN="/usr/lib/cmake/pybind11;/usr/share/cmake/pybind11;$PYTHON_INCLUDE"
if [[ ! -d /usr/lib/cmake/pybind11 && ! -d /usr/share/cmake/pybind11 ]]; then
  echo "configure_order_test: skipped: pybind11-dev is not installed"
  exit 77
fi

# The first command's configure, without the module's packages.
cmake -S "$REPO" -B "$WORK/build" -G Ninja "-DCMAKE_IGNORE_PATH=$HIDDEN" > "$WORK/first.out" 2> "$WORK/first.err"
grep -q "Python module pstrain: not built (needs python3-dev and pybind11-dev)" "$WORK/first.err" || {
  echo "configure_order_test: the first configure did not say the module is not built:" >&2
  cat "$WORK/first.err" >&2
  exit 1
}

# Still without them, the suite's configure stops, saying what to install.
if BUILD_DIR="$WORK/build" "$REPO/scripts/configure.sh" -DPST_REQUIRE_PYTHON=ON 2> "$WORK/required.err"; then
  echo "configure_order_test: the suite's configure went on without the Python module" >&2
  exit 1
fi
grep -q "The Python module pstrain cannot be built: it needs python3-dev and" "$WORK/required.err" || {
  echo "configure_order_test: the refusal does not name the packages:" >&2
  cat "$WORK/required.err" >&2
  exit 1
}

# Once they are there, the suite's configure finds them.
BUILD_DIR="$WORK/build" "$REPO/scripts/configure.sh" -DPST_REQUIRE_PYTHON=ON -UCMAKE_IGNORE_PATH
grep -q "^PST_PYTHON_MODULE_BUILT:INTERNAL=ON" "$WORK/build/CMakeCache.txt" || {
  echo "configure_order_test: the second configure did not find the Python module's packages" >&2
  exit 1
}
echo "configure_order_test: passed"
