#!/usr/bin/env bash
# Builds examples/ (allreduce_example, my_trainer, my_blocks) as a separate CMake project with find_package(dscpp), against the
# build tree ($1 = build dir) or an install of it ($2 = "install"), then runs it on 2 ranks.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
mode=${2:-build-tree}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$mode" = install ]; then
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  cmake -S "$src/examples" -B "$work/ex" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  dscpp="$work/prefix/bin/dscpp"
else
  cmake -S "$src/examples" -B "$work/ex" -G Ninja -Ddscpp_DIR="$build" >/dev/null
  dscpp="$build/dscpp"
fi
cmake --build "$work/ex" >/dev/null
port=$(( 10000 + RANDOM % 22000 ))  # below the ephemeral range (outgoing connections take those)
out=$("$dscpp" launch --num_procs 2 --master_port $port "$work/ex/allreduce_example" 2>&1)
echo "$out"
grep -q "rank 0 of 2: mean of ranks = 0.5" <<<"$out"
grep -q "rank 1 of 2: mean of ranks = 0.5" <<<"$out"
out=$("$dscpp" launch --num_procs 2 --master_port $((port + 1)) "$work/ex/my_trainer" 2>&1)
echo "$out"
grep -q "trained 600 steps on 2 ranks" <<<"$out"
# A model of the user's own at stage 3 in bf16 (blocks marked as units), saved half-way and
# resumed in a second job: both end on the same loss.
first=$("$dscpp" launch --num_procs 2 --master_port $((port + 2)) "$work/ex/my_blocks" "$work/ckpt" 2>&1)
echo "$first"
second=$("$dscpp" launch --num_procs 2 --master_port $((port + 3)) "$work/ex/my_blocks" "$work/ckpt" --resume 2>&1)
echo "$second"
a=$(grep -o "trained: loss at step 60: [0-9.]*" <<<"$first" | grep -o "[0-9.]*$")
b=$(grep -o "resumed: loss at step 60: [0-9.]*" <<<"$second" | grep -o "[0-9.]*$")
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "my_blocks: resumed loss '$b' differs from '$a'"; exit 1; }
echo "find_package($mode): ok"
