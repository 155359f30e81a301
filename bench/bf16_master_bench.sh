#!/usr/bin/env bash
# bf16.bf16_master_weights_and_grads, alone and with bf16.bf16_optimizer_states, against the
# default bf16 (fp32 master weights) on the same work: the model-state bytes per rank the engine
# holds beside the ZeRO paper's formula, the peak RSS, tokens/s after warm-up and the loss at the
# last step. 2 ranks x 1 thread, bf16, AdamW, clipping 1.0, tinyshakespeare, config defaults
# otherwise. Each round runs the three in turn per stage; the last row of each table holds the
# medians over the rounds.
#   bench/bf16_master_bench.sh [ROUNDS, default 3]
#   MODELS="bench 150m" STAGES="1 2 3" STEPS_BENCH=12 STEPS_150M=6
# bench: the benchmark GPT (6 x 384, 6 heads, T 256, vocab 256, micro-batch 4);
# 150m: 12 x 1024, 16 heads, T 256, vocab 256, micro-batch 1.
# Needs build/ and ../shared/data/tinyshakespeare.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
CFG=$(mktemp /tmp/bf16_master_bench_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT
export OMP_NUM_THREADS=1

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# run MODEL STAGE VARIANT (fp32: fp32 master weights; master: bf16 master weights; states: and
# bf16 optimizer states) -> "tokens/s model_states_MiB formula_MiB peak_rss_MiB last_loss"
run() {
  local model=$1 stage=$2 variant=$3 shape micro steps master=false bstates=false
  [ "$variant" != fp32 ] && master=true
  [ "$variant" = states ] && bstates=true
  if [ "$model" = bench ]; then
    shape="--n_layer 6 --n_embd 384 --n_head 6"; micro=4; steps=${STEPS_BENCH:-12}
  else
    shape="--n_layer 12 --n_embd 1024 --n_head 16"; micro=1; steps=${STEPS_150M:-6}
  fi
  cat >"$CFG" <<JSON
{"train_batch_size": $((2 * micro)), "train_micro_batch_size_per_gpu": $micro,
 "gradient_clipping": 1.0, "steps_per_print": $steps, "dump_state": true,
 "bf16": {"enabled": true, "bf16_master_weights_and_grads": $master,
          "bf16_optimizer_states": $bstates},
 "zero_optimization": {"stage": $stage}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}
JSON
  local out
  out=$(build/dscpp launch --num_procs 2 --master_port $((21000 + RANDOM % 9000)) build/dscpp train \
    --config "$CFG" --data "$DATA" $shape --block_size 256 --steps "$steps" 2>&1)
  local tps states psi rss loss
  tps=$(grep -o "throughput: [0-9.]* tokens/s" <<<"$out" | awk '{print $2}')
  states=$(grep -o "model states [0-9]* bytes" <<<"$out" | head -1 | awk '{printf "%.1f", $3 / 1048576}')
  psi=$(grep -o "ZeRO stage [0-9], [0-9]* trainable" <<<"$out" | head -1 | awk '{print $4}')
  rss=$(grep -o "peak RSS [0-9.]* MiB" <<<"$out" | tail -1 | awk '{print $3}')
  loss=$(grep -o "loss [0-9.]*" <<<"$out" | tail -1 | awk '{print $2}')
  # ZeRO's formula per rank at N = 2 (bytes per element): parameters 2 (stage 3: 2/N), gradients
  # 2 (stages 2-3: 2/N), then K/N with K = 12 (fp32 master + Adam), 8 (Adam alone) or 4 (Adam
  # in bf16).
  local formula
  formula=$(awk -v p="$psi" -v s="$stage" -v v="$variant" 'BEGIN {
    n = 2; par = (s == 3) ? 2 / n : 2; gr = (s >= 2) ? 2 / n : 2;
    k = (v == "fp32") ? 12 : (v == "master") ? 8 : 4;
    printf "%.1f", p * (par + gr + k / n) / 1048576 }')
  echo "$tps $states $formula $rss $loss"
}

for model in ${MODELS:-bench 150m}; do
  for stage in ${STAGES:-1 2 3}; do
    echo "### $model, stage $stage"
    echo
    echo "| round | tokens/s fp32 master / bf16 master / + bf16 states | model states MiB/rank (ZeRO formula) fp32 master | bf16 master | + bf16 states | peak RSS MiB fp32 / bf16 master / + bf16 states | loss at the last step fp32 / bf16 master / + bf16 states |"
    echo "|---|---|---|---|---|---|---|"
    ta=() tb=() tc=() ra=() rb=() rc=()
    for r in $(seq 1 "$ROUNDS"); do
      read -r a_tps a_st a_f a_rss a_loss < <(run "$model" "$stage" fp32)
      read -r b_tps b_st b_f b_rss b_loss < <(run "$model" "$stage" master)
      read -r c_tps c_st c_f c_rss c_loss < <(run "$model" "$stage" states)
      echo "| $r | $a_tps / $b_tps / $c_tps | $a_st ($a_f) | $b_st ($b_f) | $c_st ($c_f) | $a_rss / $b_rss / $c_rss | $a_loss / $b_loss / $c_loss |"
      ta+=("$a_tps") tb+=("$b_tps") tc+=("$c_tps") ra+=("$a_rss") rb+=("$b_rss") rc+=("$c_rss")
    done
    med() { printf '%s\n' "$@" | median; }
    echo "| median | $(med "${ta[@]}") / $(med "${tb[@]}") / $(med "${tc[@]}") | | | | $(med "${ra[@]}") / $(med "${rb[@]}") / $(med "${rc[@]}") | |"
    echo
  done
done
