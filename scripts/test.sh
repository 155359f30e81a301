#!/usr/bin/env bash
# Sets up and builds, then runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# As many tests at once as there are cores (DSCPP_TEST_JOBS overrides): the multi-process tests
# spend much of their time waiting on each other. (nproc obeys OMP_NUM_THREADS: ask it first.)
jobs=${DSCPP_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
export OMP_NUM_THREADS=1
ctest --test-dir build --output-on-failure --timeout 600 -j"$jobs" "$@"
