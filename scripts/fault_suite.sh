#!/usr/bin/env bash
# The fault suite (docs/reliability.md): real `dscpp launch` jobs killed, stopped, cut off and
# fed bad input, with the outcome of every trial checked and counted.
#   scripts/fault_suite.sh --quick    2 trials per kill/stop case, 1 per user-program case, on 2
#                                     ranks (ctest runs this as faults.quick and faults.parsers)
#   scripts/fault_suite.sh            20 trials per case on 2-4 ranks; rewrites the table in
#                                     docs/reliability.md
# Other options go to tests/faults/fault_suite.py (--seed N, --trials N, --cases a,b,
# --except a,b, --show). The disk, nvme and network cases need root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dscpp_cli fault_trainer
export OMP_NUM_THREADS=1
report=(--report docs/reliability.md)
for a in "$@"; do [ "$a" = --quick ] && report=(); done
exec /usr/bin/python3 tests/faults/fault_suite.py --build build "${report[@]}" "$@"
