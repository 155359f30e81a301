#!/usr/bin/env bash
# ZeRO memory and speed on the built-in GPT (default: 16 layers x 512 wide, 50.4M parameters),
# through `dscpp train` on local processes, one intra-op thread each.
#   bench/zero_bench.sh memory [STEPS]        stages 0/1/2 x fp32/bf16 x worlds 2 and 4: each
#                                             rank's model-state bytes (the engine's accounting)
#                                             and peak RSS, beside the ZeRO formulas
#   bench/zero_bench.sh speed [ROUNDS] [STEPS] stages 0/1/2 at 2 ranks in fp32, alternated per
#                                             round; median steady throughput and the ratio to
#                                             stage 0 in each round
# Model shape: L=16 H=8 C=512 MB=2 (micro-batch per rank); needs build/.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-memory}
L=${L:-16} H=${H:-8} C=${C:-512} MB=${MB:-2}
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))
CFG=$(mktemp /tmp/zero_bench_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT

# write_config STAGE PRECISION WORLD
write_config() {
  local prec=""
  [ "$2" = bf16 ] && prec=', "bf16": {"enabled": true}'
  cat >"$CFG" <<JSON
{"train_batch_size": $((MB * $3)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $1, "overlap_comm": true,
 "reduce_bucket_size": 5000000, "allgather_bucket_size": 5000000},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
}

# run WORLD STEPS: prints dscpp train's output
run() {
  build/dscpp launch --num_procs "$1" --master_port $((port++)) build/dscpp train --config "$CFG" \
    --n_layer "$L" --n_head "$H" --n_embd "$C" --steps "$2" --no_shuffle --eval_problems 10 2>&1
}

if [ "$MODE" = memory ]; then
  STEPS=${2:-2}
  printf '| precision | world | stage | formula bytes/param | formula MiB | model states MiB (rank 0) | measured / formula | peak RSS MiB (max rank) |\n'
  printf '|---|---|---|---|---|---|---|---|\n'
  for prec in fp32 bf16; do
    for world in 2 4; do
      for stage in 0 1 2; do
        write_config "$stage" "$prec" "$world"
        out=$(run "$world" "$STEPS")
        params=$(grep -o '; [0-9]* parameters' <<<"$out" | head -1 | grep -o '[0-9]*')
        states=$(grep -o 'rank 0: peak RSS [0-9.]* MiB; model states [0-9.]*' <<<"$out" | awk '{print $NF}')
        rss=$(grep -o 'peak RSS [0-9.]*' <<<"$out" | awk '{if ($3 > m) m = $3} END {print m}')
        # bytes per parameter: fp32 Adam 16, 8 + 8/N, 4 + 12/N; bf16 + fp32 master 16, 4 + 12/N, 2 + 14/N
        awk -v p="$prec" -v n="$world" -v s="$stage" -v P="$params" -v m="$states" -v r="$rss" 'BEGIN {
          if (p == "fp32") k = (s == 0) ? 16 : (s == 1) ? 8 + 8 / n : 4 + 12 / n;
          else k = (s == 0) ? 16 : (s == 1) ? 4 + 12 / n : 2 + 14 / n;
          f = k * P / 1048576;
          printf "| %s | %d | %d | %.2f | %.1f | %.1f | %.4f | %.0f |\n", p, n, s, k, f, m, m / f, r }'
      done
    done
  done
  exit 0
fi

ROUNDS=${2:-5}
STEPS=${3:-12}
tput() { grep -o 'throughput: [0-9.]*' | awk '{print $2}'; }
printf '| round | stage 0 tokens/s | stage 1 tokens/s | stage 2 tokens/s | stage 1 time / stage 0 | stage 2 time / stage 0 |\n'
printf '|---|---|---|---|---|---|\n'
results=()
for r in $(seq "$ROUNDS"); do
  t=()
  for stage in 0 1 2; do
    write_config "$stage" fp32 2
    t+=("$(run 2 "$STEPS" | tput)")
  done
  r1=$(awk -v a="${t[0]}" -v b="${t[1]}" 'BEGIN {printf "%.3f", a / b}')
  r2=$(awk -v a="${t[0]}" -v b="${t[2]}" 'BEGIN {printf "%.3f", a / b}')
  printf '| %s | %s | %s | %s | %s | %s |\n' "$r" "${t[0]}" "${t[1]}" "${t[2]}" "$r1" "$r2"
  results+=("$r1 $r2")
done
printf '%s\n' "${results[@]}" | sort -n -k1 | awk '{a[NR] = $1} END {printf "median stage 1 / stage 0 time per step: %s\n", a[int((NR + 1) / 2)]}'
printf '%s\n' "${results[@]}" | sort -n -k2 | awk '{a[NR] = $2} END {printf "median stage 2 / stage 0 time per step: %s\n", a[int((NR + 1) / 2)]}'
