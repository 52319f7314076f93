#!/usr/bin/env bash
# `pip install .` from the checkout, as docs/deploy.md ("Installing") gives
# it: into a virtual environment made with --system-site-packages (Debian's
# NumPy and PyTorch), with --no-build-isolation --no-index, so nothing is
# downloaded. setup.py builds in BUILD_DIR (PSTRAIN_BUILD_DIR), which the
# suite has built already. Then, from a folder outside the checkout and
# with no PYTHONPATH, the environment's python imports pstrain and
# pstrain.torch from its own site-packages, and the environment's pslaunch
# runs two PyTorch workers of tests/packaging/torch_train.py that bring the
# loss down. The checkout is left as it was (setuptools writes in BUILD_DIR).
#
# Usage: pip_install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

SOURCE_DIR=$(cd "$1" && pwd)
BUILD_DIR=$(cd "$2" && pwd)
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
unset PYTHONPATH
export PIP_NO_CACHE_DIR=1  # the wheel is built for this run, not kept in ~/.cache/pip

say() { echo "pip_install_test: $*"; }
fail() { echo "pip_install_test: FAIL: $*" >&2; exit 1; }

VENV=$SCRATCH/venv
/usr/bin/python3 -m venv --system-site-packages "$VENV" ||
  fail "python3 -m venv failed (scripts/install_deps.sh installs python3-venv)"
before=$(git -C "$SOURCE_DIR" status --porcelain 2>/dev/null || true)
(cd "$SOURCE_DIR" && PSTRAIN_BUILD_DIR=$BUILD_DIR "$VENV/bin/pip" install --no-build-isolation \
   --no-index . >"$SCRATCH/pip.log" 2>&1) || fail "pip install: $(tail -n 20 "$SCRATCH/pip.log")"
grep -q "^Successfully installed pstrain-" "$SCRATCH/pip.log" || fail "pip said: $(tail -n 5 "$SCRATCH/pip.log")"
after=$(git -C "$SOURCE_DIR" status --porcelain 2>/dev/null || true)
[ "$before" = "$after" ] || fail "pip install changed the checkout: $(diff <(echo "$before") <(echo "$after"))"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
cd "$SCRATCH"
found=$("$VENV/bin/python" -c 'import pstrain, pstrain.torch; print(pstrain.__file__)') ||
  fail "import pstrain, pstrain.torch failed in the environment"
[ "$found" = "$SITE/pstrain/__init__.py" ] || fail "the environment imported pstrain from $found, not $SITE"
for program in pslaunch ps_server worker psctl psreport ctr_datagen; do
  [ -x "$VENV/bin/$program" ] || fail "pip install put no $program in $VENV/bin"
done

cp "$SOURCE_DIR/tests/packaging/torch_train.py" "$SCRATCH/train.py"
timeout 240 "$VENV/bin/pslaunch" --ps=1 --workers=2 --learning_rate=0.1 --result_dir="$SCRATCH/run" \
  -- "$VENV/bin/python" train.py >"$SCRATCH/job.log" 2>&1 </dev/null ||
  fail "the job failed: $(tail -n 20 "$SCRATCH/job.log")"
trained=$(grep -c "module $SITE/pstrain/__init__.py loss" "$SCRATCH/job.log" || true)
[ "$trained" -eq 2 ] || fail "$trained of 2 workers trained with the installed module: $(tail -n 20 "$SCRATCH/job.log")"
sed -n 's/.* loss \([0-9.]*\) -> \([0-9.]*\)$/\1 \2/p' "$SCRATCH/job.log" |
  awk '{ if ($2 >= $1 / 4) bad = 1 } END { exit bad }' ||
  fail "the loss did not come down to a quarter: $(grep ' loss ' "$SCRATCH/job.log")"
tail -n 1 "$SCRATCH/job.log" | grep -q '^{"mode":"sync","workers":2' ||
  fail "no job summary: $(tail -n 5 "$SCRATCH/job.log")"
say "pip install --no-build-isolation --no-index . into $VENV: pstrain and pstrain.torch from $SITE"
say "$(grep ' loss ' "$SCRATCH/job.log" | head -n 1)"
say "$(tail -n 1 "$SCRATCH/job.log")"
