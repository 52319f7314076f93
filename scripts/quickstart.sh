#!/usr/bin/env bash
# The main job: install what is missing, build, and train MLP 784-256-128-10
# on Fashion-MNIST with 1 PS + 2 workers (configs/local.textproto, SYNC).
# Installs and builds only what the job runs (pslaunch starts ps_server and
# worker, and writes run.html itself); scripts/test.sh adds the rest.
# Arguments go to pslaunch (e.g. --mode=async --epochs=3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --job
BUILD_TARGETS="pslaunch ps_server worker" scripts/build.sh
# run.html: the loss and accuracy curves of this run (README, "The curves page").
exec "${BUILD_DIR:-build}/bin/pslaunch" --config=configs/local.textproto --report=run.html "$@"
