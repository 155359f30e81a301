#!/usr/bin/env bash
# Tokens/s of `dscpp train` under two environments, side by side: A B A B ... on 2 ranks x 1
# thread, the ratio A/B of each round and its median, and the last step's loss of each (the two
# should train the same). For choices the code makes from an environment variable, e.g.
#   bench/env_ab.sh DSCPP_GPT_ATTENTION=sdpa DSCPP_GPT_ATTENTION=math 5 30
#   MODEL=150m BF16=1 bench/env_ab.sh DSCPP_GPT_KERNELS=auto DSCPP_GPT_KERNELS=torch 3 8
#   bench/env_ab.sh "" BIN=/tmp/before 5 30     (this build against a copy of an earlier one)
# MODEL=bench (default: 6 x 384, 6 heads, T 256, micro-batch 4) or 150m (12 x 1024, 16 heads,
# T 256, micro-batch 1); BF16=1 trains in bf16; STAGE=0..3. Data: tinyshakespeare's bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, gpt_shape, tokens_per_s
A=${1?usage: bench/env_ab.sh 'VAR=a ...' 'VAR=b ...' [ROUNDS] [STEPS]}
B=${2:?usage: bench/env_ab.sh 'VAR=a ...' 'VAR=b ...' [ROUNDS] [STEPS]}
ROUNDS=${3:-5}
STEPS=${4:-30}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
gpt_shape "${MODEL:-bench}"
prec=""
[ "${BF16:-0}" = 1 ] && prec=', "bf16": {"enabled": true}'
CFG=$(mktemp /tmp/env_ab_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT
cat >"$CFG" <<JSON
{"train_batch_size": $((MB * 2)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": ${STAGE:-0}},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))
# run 'VAR=value ... [BIN=DIR]': BIN names a folder with a copy of dscpp and its libdscpp*.so (a
# build from before a change), run with LD_LIBRARY_PATH pointing there.
run() {
  local bin=build vars=()
  for w in $1; do
    case $w in
      BIN=*) bin=${w#BIN=}; vars+=("LD_LIBRARY_PATH=$bin") ;;
      *) vars+=("$w") ;;
    esac
  done
  env "${vars[@]}" "$bin/dscpp" launch --num_procs 2 --master_port $((port++)) "$bin/dscpp" train \
    --config "$CFG" --data "$DATA" --n_layer $L --n_head $H --n_embd $C --block_size $T \
    --steps "$STEPS" --no_shuffle 2>&1
}
loss() { grep -o "step $STEPS/$STEPS | loss [0-9.]*" | awk '{print $5}'; }
printf '| round | A tokens/s | B tokens/s | A / B | loss A | loss B |\n|---|---|---|---|---|---|\n'
ratios=()
for r in $(seq "$ROUNDS"); do
  a=$(run "$A"); b=$(run "$B")
  ta=$(tokens_per_s <<<"$a"); tb=$(tokens_per_s <<<"$b")
  ratios+=("$(awk -v a="$ta" -v b="$tb" 'BEGIN {printf "%.3f", a / b}')")
  printf '| %s | %s | %s | %s | %s | %s |\n' "$r" "$ta" "$tb" "${ratios[-1]}" "$(loss <<<"$a")" "$(loss <<<"$b")"
done
printf '| median | | | **%s** | | |\n' "$(median "${ratios[@]}")"
echo "A: $A; B: $B; MODEL=${MODEL:-bench} BF16=${BF16:-0} STAGE=${STAGE:-0}, $ROUNDS rounds of $STEPS steps"
