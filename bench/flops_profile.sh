#!/usr/bin/env bash
# The flops profiler's reading of dscpp train on the benchmark GPT (6 x 384, 6 heads, block 256,
# vocab 256, micro-batch 4) in fp32 and bf16, and on a 150M GPT (12 x 1024, 16 heads, block 256,
# micro-batch 1) in bf16: 2 ranks x 1 thread, stage 0, AdamW; the profiled step is step
# PROFILE_STEP + 1. Prints each report's summary lines (docs/benchmarks.md, "The flops profiler").
set -euo pipefail
cd "$(dirname "$0")/.."
DSCPP=${DSCPP:-build/dscpp}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1

run() {  # name, dtype json, micro-batch, GPT args...
  local name=$1 dtype=$2 mb=$3
  shift 3
  cat >"$WORK/$name.json" <<JSON
{"train_batch_size": $((mb * 2)), "train_micro_batch_size_per_gpu": $mb, "steps_per_print": 1000,
 "gradient_clipping": 1.0, $dtype "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
 "flops_profiler": {"enabled": true, "profile_step": ${PROFILE_STEP:-5}, "module_depth": 3,
                    "detailed": true, "output_file": "$WORK/$name.txt"}}
JSON
  "$DSCPP" launch --num_procs 2 "$DSCPP" train --config "$WORK/$name.json" --data "$DATA" \
    --steps $((${PROFILE_STEP:-5} + 2)) --eval_problems 0 "$@" >"$WORK/$name.log" 2>&1
  echo "== $name"
  grep -E "matmul-like FLOPs|tokens on this rank|window latency|time in matmul|achieved|matmul peak|utilization|aten::" "$WORK/$name.txt"
}

gpt_small=(--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --vocab_size 256)
run small_fp32 "" 4 "${gpt_small[@]}"
run small_bf16 '"bf16": {"enabled": true},' 4 "${gpt_small[@]}"
run gpt150m_bf16 '"bf16": {"enabled": true},' 1 --n_layer 12 --n_head 16 --n_embd 1024 \
  --block_size 256 --vocab_size 256
