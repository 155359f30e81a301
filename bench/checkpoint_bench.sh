#!/usr/bin/env bash
# Checkpoint save speed: how long save_checkpoint blocks and the bytes per second it writes,
# against the disk's own sequential write bandwidth measured in the same run, alternated per
# round (docs/checkpoint.md, "Save speed").
#   bench/checkpoint_bench.sh [ROUNDS]
# Each round:
#   save   dscpp train on 2 local ranks, ZeRO stage 2, fp32 AdamW (12 bytes per parameter saved:
#          values, exp_avg, exp_avg_sq), 3 steps with a save after each; the engine logs each
#          save's bytes and wall time (how long save_checkpoint blocked). The first save of a
#          process pays for fresh page-cache pages (on this VM a first touch of guest memory is
#          slow: see docs/checkpoint.md); "steady" is the mean of saves 2 and 3.
#   plain  the same number of bytes written by dd into DIR, two writers at once (as two ranks
#          write), each fsynced at its end, timed from start to both done: once through the page
#          cache in 8 MiB blocks (the best block size here), once with O_DIRECT.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median
ROUNDS=${1:-3}
MODEL=${MODEL:-small}
if [ "$MODEL" = 150m ]; then
  ARGS="--n_layer 12 --n_head 16 --n_embd 1024 --block_size 256 --data ../shared/data/tinyshakespeare.txt"
else
  ARGS="--n_layer 16 --n_head 8 --n_embd 512"
fi
DIR=${DIR:-$(mktemp -d /var/tmp/dscpp_ckpt_bench_XXXXXX)}
CFG=$(mktemp /tmp/ckpt_bench_XXXXXX.json)
trap 'rm -rf "$CFG" "$DIR"' EXIT
cat >"$CFG" <<'JSON'
{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}
JSON
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))

printf "%-6s %8s %11s %11s %12s %12s %8s %8s\n" round MiB "first s" "steady s" "steady MiB/s" "plain MiB/s" "direct" "ratio"
ratios=() directs=() steadies=() firsts=()
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "${DIR:?}"/*
  port=$((port + 1))
  out=$(build/dscpp launch --num_procs 2 --master_port $port build/dscpp train --config "$CFG" \
    $ARGS --steps 3 --save_interval 1 --eval_problems 10 --save_dir "$DIR/ckpt" 2>&1)
  lines=$(grep -o "saved checkpoint .* MiB in [0-9.]* s" <<<"$out" || true)
  [ "$(wc -l <<<"$lines")" = 3 ] || { echo "expected 3 saves:"; echo "$out" | tail -20; exit 1; }
  mib=$(head -1 <<<"$lines" | sed -E 's/.* ([0-9.]+) MiB in ([0-9.]+) s/\1/')
  secs=($(sed -E 's/.* ([0-9.]+) MiB in ([0-9.]+) s/\2/' <<<"$lines"))
  steady=$(awk -v a="${secs[1]}" -v b="${secs[2]}" 'BEGIN {printf "%.3f", (a + b) / 2}')
  rm -rf "$DIR/ckpt"
  sync
  plain() {  # plain FLAG...: MiB/s of two dd writers of mib/2 each
    local blocks t0 t1
    blocks=$(awk -v m="$mib" 'BEGIN {print int(m / 2 / 8 + 0.5)}')
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$DIR/plain0" bs=8M count="$blocks" conv=fsync status=none "$@" &
    dd if=/dev/zero of="$DIR/plain1" bs=8M count="$blocks" conv=fsync status=none "$@" &
    wait
    t1=$(date +%s.%N)
    rm -f "$DIR"/plain*
    awk -v b="$blocks" -v a="$t0" -v z="$t1" 'BEGIN {printf "%.0f", 2 * b * 8 / (z - a)}'
  }
  plain_bw=$(plain)
  direct_bw=$(plain oflag=direct)
  save_bw=$(awk -v m="$mib" -v s="$steady" 'BEGIN {printf "%.0f", m / s}')
  ratio=$(awk -v a="$save_bw" -v b="$plain_bw" 'BEGIN {printf "%.3f", a / b}')
  printf "%-6s %8s %11s %11s %12s %12s %8s %8s\n" "$round" "$mib" "${secs[0]}" "$steady" "$save_bw" "$plain_bw" "$direct_bw" "$ratio"
  ratios+=("$ratio") directs+=("$(awk -v a="$save_bw" -v b="$direct_bw" 'BEGIN {printf "%.3f", a / b}')")
  steadies+=("$steady") firsts+=("${secs[0]}")
done
echo "medians: first save $(median "${firsts[@]}") s, steady save $(median "${steadies[@]}") s;" \
  "steady save / plain buffered write $(median "${ratios[@]}")," \
  "/ plain O_DIRECT write $(median "${directs[@]}")"
