#!/usr/bin/env bash
# Optimizer offload to disk (docs/offload.md): the plain direct-I/O bandwidth of the swap folder
# (dscpp io-bench), then the same GPT trained at ZeRO stage 2 on 2 ranks without offload and with
# the optimizer state (and fp32 weights) on disk, alternated in each round, in one invocation.
# Prints per round: tokens/s of both, the offloaded optimizer's per-step reads and writes (rank
# 0), the bandwidth of both ranks' swaps over the swap's time, the time the training thread waited
# for the disk and spent computing, and the share of the I/O time hidden behind the optimizer's
# compute (the swap's time not spent waiting: the disk is busy throughout, the swap moving data
# at or above the plain sequential rate).
#   bench/offload_bench.sh [ROUNDS] [STEPS]     MODEL=small|150m  SWAP=/work/swap  PREC=bf16|fp32
#   SUB_GROUP=2000000 (elements per sub-group)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # tokens_per_s
ROUNDS=${1:-3}
STEPS=${2:-6}
MODEL=${MODEL:-small}
SWAP=${SWAP:-/work/swap}
PREC=${PREC:-bf16}
SUB_GROUP=${SUB_GROUP:-2000000}
data_args=()
if [ "$MODEL" = 150m ]; then
  L=12 H=16 C=1024 MB=1 data_args=(--data ../shared/data/tinyshakespeare.txt --block_size 256)
else
  L=16 H=8 C=512 MB=2  # the built-in task
fi
export OMP_NUM_THREADS=1
mkdir -p "$SWAP"
port=$((21000 + RANDOM % 9000))
CFG=$(mktemp /tmp/offload_bench_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT

echo "## plain direct I/O on $SWAP"
plain=$(build/dscpp io-bench --path "$SWAP" --size 2 --quick)
echo "$plain"
read -r bw_w bw_r < <(grep -o 'write [0-9]* MiB/s, read [0-9]* MiB/s' <<<"$plain" | awk '{print $2, $5}')
echo "plain sequential O_DIRECT, one process: write $bw_w MiB/s, read $bw_r MiB/s"

write_config() {  # $1: offload JSON or empty
  local prec="" off=""
  [ "$PREC" = bf16 ] && prec=', "bf16": {"enabled": true}'
  [ -n "$1" ] && off=", \"sub_group_size\": $SUB_GROUP, \"offload_optimizer\": $1"
  cat >"$CFG" <<JSON
{"train_batch_size": $((MB * 2)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1,
 "wall_clock_breakdown": true, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 2$off},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
}
run() {
  port=$((port + 1))
  build/dscpp launch --num_procs 2 --master_port "$port" build/dscpp train --config "$CFG" \
    --n_layer "$L" --n_head "$H" --n_embd "$C" "${data_args[@]}" --steps "$STEPS" --no_shuffle \
    --eval_problems 10 2>&1
}
peak_rss() { grep -o 'peak RSS [0-9.]*' | awk '{if ($3 > m) m = $3} END {printf "%.0f", m}'; }
# Rank 0's swap figures, mean over steps 3..: swap ms, read MiB, written MiB, waited ms, stepped ms.
swap_means() {
  grep -o 'step [0-9]* |.*offloaded optimizer [0-9.]* ms: read [0-9.]* MiB, wrote [0-9.]* MiB, waited for the disk [0-9.]* ms, stepped [0-9.]* ms' |
    sed 's/[^0-9. ]//g' | awk '{s = $1; if (s > 2) {n++; t += $(NF-4); r += $(NF-3); w += $(NF-2); q += $(NF-1); c += $NF}}
      END {printf "%.1f %.1f %.1f %.1f %.1f\n", t / n, r / n, w / n, q / n, c / n}'
}

echo
echo "## $MODEL GPT ($L layers x $C wide, ${data_args[*]:-built-in task}, micro-batch $MB), 2 ranks, ZeRO stage 2, $PREC, sub_group_size $SUB_GROUP"
printf '| round | tokens/s in memory | tokens/s offloaded | offloaded / in memory | swap ms/step | read MiB/step | written MiB/step | swap MiB/s, both ranks | waited for disk ms | optimizer compute ms | I/O hidden | peak RSS MiB in memory / offloaded |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for r in $(seq "$ROUNDS"); do
  write_config ""
  mem=$(run)
  write_config "{\"device\": \"nvme\", \"nvme_path\": \"$SWAP\", \"pipeline_read\": true, \"pipeline_write\": true}"
  off=$(run)
  read -r opt rd wr waited stepped < <(swap_means <<<"$off")
  awk -v r="$r" -v a="$(tokens_per_s <<<"$mem")" -v b="$(tokens_per_s <<<"$off")" -v t="$opt" -v rd="$rd" -v wr="$wr" \
      -v q="$waited" -v c="$stepped"  -v m1="$(peak_rss <<<"$mem")" -v m2="$(peak_rss <<<"$off")" 'BEGIN {
    # The swap moves data at or above the plain sequential rate, so the disk is busy throughout
    # the swap: the I/O time hidden behind compute is the swap time the thread did not wait.
    hidden = t > 0 ? (t - q) / t : 0;
    printf "| %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f%% | %s / %s |\n",
      r, a, b, b / a, t, rd, wr, 2 * (rd + wr) / (t / 1000), q, c, 100 * hidden, m1, m2 }'
done
