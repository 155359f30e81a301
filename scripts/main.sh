#!/usr/bin/env bash
# The main job: set up and build, then the pre-flight check of a 4-rank job on this machine
# (hosts, master port, the example config's batch triple, and a collective self-test of
# all_reduce / reduce_scatter / all_gather / barrier through the launcher).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/dscpp check --num_procs 4 --config examples/ds_config.json "$@"
