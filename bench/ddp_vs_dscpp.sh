#!/usr/bin/env bash
# Throughput of `dscpp train` (stage 0) against PyTorch DDP (the .venv torch, 2.15.0, gloo,
# torch.optim.AdamW) on the same GPT, batch, sequence length, data and threads: 2 ranks, one
# intra-op thread each, runs alternated A B C A B C ..., and the per-round ratio. A is dscpp as it
# runs by default (shared-memory collectives between ranks on one host), B dscpp with every
# collective on Gloo's TCP transport (DSCPP_COMM_SHM=off, as DDP's), C PyTorch DDP.
#   [MODEL=bench] [BF16=1] [L=4 H=4 C=256 T=128 MB=8 BUCKET=6553600] bench/ddp_vs_dscpp.sh [ROUNDS] [STEPS]
# (model layers/heads/width, sequence length, micro-batch per rank, and the bucket size in fp32
# elements for both: dscpp's reduce_bucket_size and DDP's bucket_cap_mb; the default is DDP's
# 25 MiB. MODEL=bench is the benchmark GPT of docs/benchmarks.md: L=6 H=6 C=384 T=256 MB=4.
# BF16=1 trains in bf16: dscpp's "bf16" section (bf16 model, fp32 master weights) against DDP
# under torch.autocast("cpu", torch.bfloat16) (fp32 weights, bf16 matmuls); both use oneDNN's
# bf16 matmuls. Needs build/ and ../shared/data/tinyshakespeare.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, mean_rank_rss, tokens_per_s
ROUNDS=${1:-3}
STEPS=${2:-40}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
if [ "${MODEL:-}" = bench ]; then
  L=${L:-6} H=${H:-6} C=${C:-384} T=${T:-256} MB=${MB:-4}
fi
L=${L:-4} H=${H:-4} C=${C:-256} T=${T:-128} MB=${MB:-8} BUCKET=${BUCKET:-6553600}
BF16=${BF16:-0}
prec="" ddp_prec=""
if [ "$BF16" = 1 ]; then prec=', "bf16": {"enabled": true}'; ddp_prec=--bf16; fi
CFG=$(mktemp /tmp/ddp_bench_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT
cat >"$CFG" <<JSON
{"train_batch_size": $((MB * 2)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": 0, "reduce_bucket_size": $BUCKET},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))
ra=() rt=()
printf '| round | dscpp tokens/s | dscpp over TCP tokens/s | DDP tokens/s | dscpp / DDP | dscpp over TCP / DDP | dscpp RSS/rank MiB | DDP RSS/rank MiB |\n|---|---|---|---|---|---|---|---|\n'
train() {
  build/dscpp launch --num_procs 2 --master_port $((port++)) build/dscpp train --config "$CFG" \
      --data "$DATA" --n_layer $L --n_head $H --n_embd $C --block_size $T --steps "$STEPS" --no_shuffle 2>&1
}
for r in $(seq "$ROUNDS"); do
  a=$(DSCPP_COMM_SHM=auto train)
  t=$(DSCPP_COMM_SHM=off train)
  b=$(build/dscpp launch --num_procs 2 --master_port $((port++)) .venv/bin/python bench/ddp_gpt.py \
      --data "$DATA" --n_layer $L --n_head $H --n_embd $C --block_size $T --micro_batch $MB --steps "$STEPS" \
      --bucket_cap_mb "$(awk -v b="$BUCKET" 'BEGIN {print b * 4 / 1048576}')" $ddp_prec 2>&1)
  ta=$(tokens_per_s <<<"$a"); tt=$(tokens_per_s <<<"$t"); tb=$(tokens_per_s <<<"$b")
  ra+=("$(awk -v a="$ta" -v b="$tb" 'BEGIN {printf "%.3f", a / b}')")
  rt+=("$(awk -v a="$tt" -v b="$tb" 'BEGIN {printf "%.3f", a / b}')")
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$r" "$ta" "$tt" "$tb" "${ra[-1]}" "${rt[-1]}" "$(mean_rank_rss <<<"$a")" "$(mean_rank_rss <<<"$b")"
done
printf '| median | | | | %s | %s | | |\n' "$(median "${ra[@]}")" "$(median "${rt[@]}")"
