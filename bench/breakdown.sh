#!/usr/bin/env bash
# wall_clock_breakdown of the benchmark GPT (6 layers, 384 wide, 6 heads, block 256, vocab 256,
# micro-batch 4, 2 ranks x 1 thread, AdamW, clipping 1.0, tinyshakespeare) in fp32 and bf16 at
# ZeRO stages 0-2 with the config's defaults: rank 0's step line at step STEPS (the phases of that
# step's window) and the op table over the STEPS/2 steps before it, per run.
#   bench/breakdown.sh [STEPS, default 20]        (DTYPES="fp32 bf16" STAGES="0 1 2" ROWS=12)
# Needs build/ and ../shared/data/tinyshakespeare.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-20}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
CFG=$(mktemp /tmp/breakdown_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT
export OMP_NUM_THREADS=1
for dtype in ${DTYPES:-fp32 bf16}; do
  for stage in ${STAGES:-0 1 2}; do
    prec=""
    [ "$dtype" = bf16 ] && prec=', "bf16": {"enabled": true}'
    cat >"$CFG" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
 "steps_per_print": $((STEPS / 2)), "wall_clock_breakdown": true, "zero_optimization": {"stage": $stage},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}$prec}
JSON
    out=$(build/dscpp launch --num_procs 2 --master_port $((21000 + RANDOM % 9000)) build/dscpp train \
      --config "$CFG" --data "$DATA" --n_layer 6 --n_embd 384 --n_head 6 --block_size 256 \
      --steps "$STEPS" 2>&1)
    echo "### $dtype, stage $stage"
    echo '```'
    grep -o "throughput: .*" <<<"$out"
    grep -o "window [0-9.]* ms: .*" <<<"$out" | tail -1
    awk -v rows="${ROWS:-12}" '/ops by self time/ {n = 0; block = ""} /ops by self time/ || (n > 0 && n <= rows + 1) {sub(/^\[rank 0\] /, ""); sub(/^.*ops by self time/, "ops by self time"); block = block $0 "\n"; n++} END {printf "%s", block}' <<<"$out"
    echo '```'
  done
done
