#!/usr/bin/env bash
# dscpp against what a user would pick instead today, on identical work: the same GPT, initial
# weights, data order, optimizer (AdamW, lr 3e-4, weight decay 0.01), clipping (1.0), batch and
# DeepSpeed config file, 2 ranks x 1 intra-op thread:
#   dscpp train at ZeRO stages 0-3;  PyTorch DDP eager and under torch.compile (stage 0's
#   analogue);  FSDP2 fully_shard per block (stage 3's);  DeepSpeed at stages 0-3
# (bench/peers/train_gpt.py; bf16 there is autocast for DDP, MixedPrecisionPolicy for FSDP2 and
# DeepSpeed's own bf16, whose model states are dscpp's). Each round runs every row once, in the
# same order; a row's cells are medians over the rounds, and each ratio is dscpp's tokens/s over
# the row's in the same round (dscpp at the row's stage: 0 for DDP, 3 for FSDP2), then the median.
#   bench/peers/setup.sh     (once: DeepSpeed into .venv)
#   [MODEL=bench|150m] [DTYPES="fp32 bf16 autocast"] [ONLY="dscpp ddp ..."] bench/peers.sh [ROUNDS] [STEPS]
# (autocast: torch_autocast in the file, which dscpp and DeepSpeed read; DDP runs its bf16,
# autocast, and FSDP2 its bf16 MixedPrecisionPolicy.)
# Prints one markdown table per dtype; keeps every run's output under $OUT (default
# /tmp/peers_MODEL). A peer that fails is a row with its error, never a missing row.
# REPORT=1 with the same arguments prints the tables again from $OUT's logs, running nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, gpt_shape, mean_rank_rss, tokens_per_s, peer_config, peer_run
ROUNDS=${1:-3}
STEPS=${2:-30}
MODEL=${MODEL:-bench}
gpt_shape "$MODEL"
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-/tmp/peers_$MODEL}
mkdir -p "$OUT"
PY=.venv/bin/python
[ -n "${REPORT:-}" ] || $PY -c "import deepspeed" >/dev/null 2>&1 || { echo "peers: no deepspeed in .venv; run bench/peers/setup.sh" >&2; exit 2; }
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))

# The initial weights every system starts from: dscpp's seeded init of this GPT.
INIT=$OUT/init.safetensors
echo '{"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}' >"$OUT/init.json"
[ -n "${REPORT:-}" ] || build/dscpp train --config "$OUT/init.json" --data "$DATA" --n_layer $L --n_head $H --n_embd $C \
  --block_size $T --vocab_size 256 --steps 0 --save_final "$INIT" --eval_problems 0 >/dev/null

# run SYSTEM STAGE DTYPE ROUND: one run; its output in $OUT/SYSTEM_sSTAGE_DTYPE_rROUND.log.
run() { peer_run "$1" "$(peer_config "$3" "$2")" "$OUT/$1_s$2_$3_r$4.log"; }
rss() { mean_rank_rss <"$1"; }

# Rows: SYSTEM STAGE [the dscpp stage it is compared with].
ROWS=(
  "dscpp 0" "ddp 0" "ddp_compile 0" "deepspeed 0"
  "dscpp 1" "deepspeed 1"
  "dscpp 2" "deepspeed 2"
  "dscpp 3" "fsdp2 3" "deepspeed 3"
)
for dtype in ${DTYPES:-fp32 bf16}; do
  for r in $(seq "$ROUNDS"); do
    [ -n "${REPORT:-}" ] && break
    for row in "${ROWS[@]}"; do
      set -- $row
      if [ -n "${ONLY:-}" ] && ! grep -qw "$1" <<<"$ONLY dscpp"; then continue; fi
      echo "peers: $MODEL $dtype round $r: $1 stage $2" >&2
      run "$1" "$2" "$dtype" "$r"
    done
  done
  echo
  echo "### $MODEL GPT ($L x $C, $H heads, T $T, micro-batch $MB per rank), $dtype, $ROUNDS rounds of $STEPS steps"
  echo
  echo "| system | ZeRO stage | tokens/s (median) | dscpp / it (median of rounds) | rounds | peak RSS per rank, MiB | loss at step $STEPS |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for row in "${ROWS[@]}"; do
    set -- $row
    if [ -n "${ONLY:-}" ] && ! grep -qw "$1" <<<"$ONLY dscpp"; then continue; fi
    ts=() ratios=() rs=() l="" failed=""
    for r in $(seq "$ROUNDS"); do
      log=$OUT/$1_s$2_${dtype}_r$r.log
      t=$(tokens_per_s "$log")
      if [ -z "$t" ]; then failed=$(peer_why "$log"); [ -n "$failed" ] || failed="no throughput line ($log)"; continue; fi
      ts+=("$t"); rs+=("$(rss "$log")"); l=$(peer_loss "$log")
      d=$(tokens_per_s "$OUT/dscpp_s$2_${dtype}_r$r.log")
      [ -n "$d" ] && ratios+=("$(awk -v a="$d" -v b="$t" 'BEGIN {printf "%.3f", a / b}')")
    done
    if ((${#ts[@]} == 0)); then
      printf '| %s | %s | failed: %s | | | | |\n' "$1" "$2" "$failed"
      continue
    fi
    ratio="" list=""
    if [ "$1" != dscpp ] && ((${#ratios[@]})); then
      ratio="**$(median "${ratios[@]}")x**"; list=$(IFS=,; echo "${ratios[*]}" | sed 's/,/, /g')
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$(median "${ts[@]}")" "$ratio" "$list" \
      "$(median "${rs[@]}")" "$l"
  done
done
