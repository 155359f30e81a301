#!/usr/bin/env bash
# torch_autocast (fp32 weights, bf16 forward) beside fp32 and bf16 (bf16 weights, fp32 master) in
# dscpp, and beside DeepSpeed 0.19.8's own torch_autocast and DDP under torch.autocast, on the
# same work: same GPT, initial weights (dscpp's seeded init), data order, AdamW (lr 3e-4, weight
# decay 0.01), clipping 1.0, config defaults otherwise; 2 ranks x 1 intra-op thread. Each round
# runs every row once in the same order; a row's cells are medians over the rounds, and each
# ratio is dscpp torch_autocast's tokens/s over the row's in the same round, then the median.
#   bench/peers/setup.sh     (once: DeepSpeed into .venv)
#   [MODELS="bench 150m"] [STAGES="0 2"] bench/autocast_bench.sh [ROUNDS, default 3]
# Steps: 12 (bench GPT) and 6 (150M) unless STEPS_BENCH / STEPS_150M say otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, gpt_shape, mean_rank_rss, tokens_per_s, peer_config, peer_run
ROUNDS=${1:-3}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-/tmp/autocast_bench}
PY=.venv/bin/python
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))

# run SYSTEM PREC STAGE ROUND: one run, its output in $OUT/MODEL_SYSTEM_PREC_sSTAGE_rROUND.log.
run() { peer_run "$1" "$(peer_config "$2" "$3")" "$OUT/${MODEL}_$1_$2_s$3_r$4.log"; }

for MODEL in ${MODELS:-bench 150m}; do
  gpt_shape "$MODEL"
  if [ "$MODEL" = bench ]; then STEPS=${STEPS_BENCH:-12}; else STEPS=${STEPS_150M:-6}; fi
  INIT=$OUT/${MODEL}_init.safetensors
  echo '{"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}' >"$OUT/init.json"
  build/dscpp train --config "$OUT/init.json" --data "$DATA" --n_layer $L --n_head $H --n_embd $C \
    --block_size $T --vocab_size 256 --steps 0 --save_final "$INIT" --eval_problems 0 >/dev/null
  for stage in ${STAGES:-0 2}; do
    rows=("dscpp autocast" "dscpp fp32" "dscpp bf16" "deepspeed autocast")
    [ "$stage" = 0 ] && rows+=("ddp autocast")
    for r in $(seq "$ROUNDS"); do
      for row in "${rows[@]}"; do
        set -- $row
        echo "autocast_bench: $MODEL stage $stage round $r: $1 $2" >&2
        run "$1" "$2" "$stage" "$r" >/dev/null
      done
    done
    echo
    echo "### $MODEL GPT ($L x $C, T $T, micro-batch $MB per rank), ZeRO stage $stage, $ROUNDS rounds of $STEPS steps"
    echo
    echo "| system | precision | tokens/s (median) | dscpp torch_autocast / it (median of rounds) | rounds | peak RSS per rank, MiB | loss at step $STEPS |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    for row in "${rows[@]}"; do
      set -- $row
      ts=() ratios=() rs=() l="" failed=""
      for r in $(seq "$ROUNDS"); do
        log=$OUT/${MODEL}_$1_$2_s${stage}_r$r.log
        t=$(tokens_per_s "$log")
        if [ -z "$t" ]; then failed=$(peer_why "$log"); [ -n "$failed" ] || failed="no throughput line ($log)"; continue; fi
        ts+=("$t"); rs+=("$(mean_rank_rss <"$log")"); l=$(peer_loss "$log")
        d=$(tokens_per_s "$OUT/${MODEL}_dscpp_autocast_s${stage}_r$r.log")
        [ -n "$d" ] && ratios+=("$(awk -v a="$d" -v b="$t" 'BEGIN {printf "%.3f", a / b}')")
      done
      if ((${#ts[@]} == 0)); then
        printf '| %s | %s | failed: %s | | | | |\n' "$1" "$2" "$failed"
        continue
      fi
      ratio="" list=""
      if [ "$row" != "dscpp autocast" ] && ((${#ratios[@]})); then
        ratio="**$(median "${ratios[@]}")x**"; list=$(IFS=,; echo "${ratios[*]}" | sed 's/,/, /g')
      fi
      printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$(median "${ts[@]}")" "$ratio" "$list" \
        "$(median "${rs[@]}")" "$l"
    done
  done
done
