#!/usr/bin/env bash
# Muon against AdamW on the same work: the optimizer-state bytes the engine holds per rank, the
# optimizer's update time per step (wall_clock_breakdown's "update", the Newton-Schulz iterations
# and their exchanges included), tokens/s over the steps after warm-up and the peak RSS, at the
# ZeRO stages given. 2 ranks x 1 thread, fp32, clipping 1.0, tinyshakespeare, config defaults
# otherwise. Each round runs AdamW then Muon per stage; the last row of each table holds the
# medians over the rounds.
#   bench/muon_bench.sh [ROUNDS, default 3]
#   MODELS="bench 150m" STAGES="0 2" STEPS_BENCH=12 STEPS_150M=6
#   PRECISION=bf16_states: both optimizers with bf16 master weights and bf16 optimizer states
#   (bf16.bf16_master_weights_and_grads and bf16_optimizer_states; stages 1-3) instead of fp32
# bench: the benchmark GPT (6 x 384, 6 heads, T 256, vocab 256, micro-batch 4);
# 150m: 12 x 1024, 16 heads, T 256, vocab 256, micro-batch 1.
# Needs build/ and ../shared/data/tinyshakespeare.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
CFG=$(mktemp /tmp/muon_bench_XXXXXX.json)
BF16=""
if [ "${PRECISION:-fp32}" = bf16_states ]; then
  BF16=' "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true},'
elif [ "${PRECISION:-fp32}" != fp32 ]; then
  echo "PRECISION must be fp32 or bf16_states" >&2
  exit 2
fi
trap 'rm -f "$CFG"' EXIT
export OMP_NUM_THREADS=1

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# run MODEL STAGE OPT -> "tokens/s update_ms optimizer_MiB peak_rss_MiB"
run() {
  local model=$1 stage=$2 opt=$3 shape micro steps
  if [ "$model" = bench ]; then
    shape="--n_layer 6 --n_embd 384 --n_head 6"; micro=4; steps=${STEPS_BENCH:-12}
  else
    shape="--n_layer 12 --n_embd 1024 --n_head 16"; micro=1; steps=${STEPS_150M:-6}
  fi
  local params='"lr": 3e-4'
  [ "$opt" = Muon ] && params='"lr": 0.02, "adam_lr": 3e-4'
  cat >"$CFG" <<JSON
{"train_batch_size": $((2 * micro)), "train_micro_batch_size_per_gpu": $micro,
 "gradient_clipping": 1.0, "steps_per_print": $steps, "wall_clock_breakdown": true,
 "dump_state": true, "zero_optimization": {"stage": $stage},$BF16
 "optimizer": {"type": "$opt", "params": {$params}}}
JSON
  local out
  out=$(build/dscpp launch --num_procs 2 --master_port $((21000 + RANDOM % 9000)) build/dscpp train \
    --config "$CFG" --data "$DATA" $shape --block_size 256 --steps "$steps" 2>&1)
  local tps upd opt_bytes rss
  tps=$(grep -o "throughput: [0-9.]* tokens/s" <<<"$out" | awk '{print $2}')
  upd=$(grep -o "update [0-9.]* ms" <<<"$out" | tail -1 | awk '{print $2}')
  opt_bytes=$(grep -o "optimizer [0-9]*)" <<<"$out" | head -1 | tr -d ')' | awk '{printf "%.1f", $2 / 1048576}')
  rss=$(grep -o "peak RSS [0-9]* MiB" <<<"$out" | tail -1 | awk '{print $3}')
  echo "$tps $upd $opt_bytes $rss"
}

for model in ${MODELS:-bench 150m}; do
  for stage in ${STAGES:-0 2}; do
    echo "### $model, stage $stage"
    echo
    echo "| round | AdamW tokens/s | Muon tokens/s | Muon time / AdamW | update ms AdamW / Muon | optimizer state MiB/rank AdamW / Muon | peak RSS MiB AdamW / Muon |"
    echo "|---|---|---|---|---|---|---|"
    ratios=() ta=() tm=() ua=() um=()
    for r in $(seq 1 "$ROUNDS"); do
      read -r a_tps a_upd a_opt a_rss < <(run "$model" "$stage" AdamW)
      read -r m_tps m_upd m_opt m_rss < <(run "$model" "$stage" Muon)
      ratio=$(awk -v a="$a_tps" -v m="$m_tps" 'BEGIN {printf "%.2f", a / m}')
      echo "| $r | $a_tps | $m_tps | $ratio | $a_upd / $m_upd | $a_opt / $m_opt | $a_rss / $m_rss |"
      ratios+=("$ratio") ta+=("$a_tps") tm+=("$m_tps") ua+=("$a_upd") um+=("$m_upd")
    done
    med() { printf '%s\n' "$@" | median; }
    echo "| median | $(med "${ta[@]}") | $(med "${tm[@]}") | $(med "${ratios[@]}") | $(med "${ua[@]}") / $(med "${um[@]}") | | |"
    echo
  done
done
