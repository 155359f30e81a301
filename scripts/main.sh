#!/usr/bin/env bash
# The main job: set up and build, then train the built-in GPT on 2 processes with the example
# DeepSpeed config (data parallelism, gradient accumulation, AdamW, WarmupLR); it ends by
# printing the held-out accuracy. Extra arguments go to `dscpp train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dscpp_cli  # the tests build in scripts/test.sh
exec build/dscpp launch --num_procs 2 build/dscpp train --config examples/ds_config.json "$@"
