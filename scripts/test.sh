#!/usr/bin/env bash
# Sets up and builds, then runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=1
ctest --test-dir build --output-on-failure --timeout 600 "$@"
