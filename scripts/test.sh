#!/usr/bin/env bash
# Sets up and builds, then runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=1
# As many tests at once as there are cores (DSCPP_TEST_JOBS overrides): the multi-process tests
# spend much of their time waiting on each other.
ctest --test-dir build --output-on-failure --timeout 600 -j"${DSCPP_TEST_JOBS:-$(nproc)}" "$@"
