#!/usr/bin/env bash
# ZeRO memory and speed on the built-in GPT through `dscpp train` on local processes, one
# intra-op thread each.
#   bench/zero_bench.sh memory [STEPS]         stages 0-3 x fp32/bf16 x worlds 2 and 4: each
#                                              rank's model-state bytes (the engine's accounting)
#                                              and peak RSS, beside the ZeRO formulas
#   bench/zero_bench.sh speed [ROUNDS] [STEPS]  stages 0/1/2 at 2 ranks in fp32 (and PyTorch DDP
#                                              with DDP=1), alternated per round: steady tokens/s,
#                                              peak RSS, and each stage's time per step over stage
#                                              0's in the same round; medians at the end
#   bench/zero_bench.sh stage3 [ROUNDS] [STEPS] stage 3 against stage 0 at 2 ranks: its defaults,
#                                              release after use with and without prefetch, and
#                                              the share of the all-gather wait prefetch hides
#   bench/zero_bench.sh scale [ROUNDS] [STEPS]  `speed` on the 150M GPT with PyTorch DDP beside
#                                              it, once with DeepSpeed's default zero settings and
#                                              once with 25M-element buckets
# Environment:
#   MODEL=small (default): 16 layers x 512 wide, 8 heads, 50.4M parameters, the built-in task,
#         micro-batch 2 per rank;
#   MODEL=150m: 12 layers x 1024 wide, 16 heads, block 256, vocab 256, 151.7M parameters, on
#         ../shared/data/tinyshakespeare.txt, micro-batch 1 per rank.
#   L H C T MB DATA override the model's layers, heads, width, block size, micro-batch, data.
#   BUCKETS=N (default 5000000): "overlap_comm": true and reduce/allgather_bucket_size N;
#   BUCKETS=default: the zero_optimization section names the stage alone, so DeepSpeed's
#         defaults apply (5e8-element buckets, overlap_comm false at stages 1-2).
# Needs build/ (and, for DDP, .venv with torch: scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, tokens_per_s
MODE=${1:-memory}
MODEL=${MODEL:-small}
if [ "$MODEL" = 150m ]; then
  L=${L:-12} H=${H:-16} C=${C:-1024} T=${T:-256} MB=${MB:-1} DATA=${DATA:-../shared/data/tinyshakespeare.txt}
  S3_AHEAD=${S3_AHEAD:-15000000} S3_LIVE=${S3_LIVE:-30000000}
else
  L=${L:-16} H=${H:-8} C=${C:-512} T=${T:-} MB=${MB:-2} DATA=${DATA:-}
  S3_AHEAD=${S3_AHEAD:-5000000} S3_LIVE=${S3_LIVE:-10000000}
fi
BUCKETS=${BUCKETS:-5000000}
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))
# A new master port for each launch, counted in this shell (not in a $(...) subshell).
next_port() { port=$((port + 1)); }
CFG=$(mktemp /tmp/zero_bench_XXXXXX.json)
trap 'rm -f "$CFG"' EXIT

# write_config STAGE PRECISION WORLD [EXTRA_ZERO_KEYS]: EXTRA_ZERO_KEYS (", \"k\": v, ...") go into
# zero_optimization; stage 3 runs log every step with the wall-clock breakdown (gather waits).
write_config() {
  local prec="" zero="\"stage\": $1" print=1000 breakdown=false
  [ "$2" = bf16 ] && prec=', "bf16": {"enabled": true}'
  [ "$BUCKETS" != default ] &&
    zero+=", \"overlap_comm\": true, \"reduce_bucket_size\": $BUCKETS, \"allgather_bucket_size\": $BUCKETS"
  zero+="${4:-}"
  [ "$1" = 3 ] && print=1 breakdown=true
  cat >"$CFG" <<JSON
{"train_batch_size": $((MB * $3)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": $print,
 "wall_clock_breakdown": $breakdown, "gradient_clipping": 1.0, "zero_optimization": {$zero},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
}

# Stage 3 in the memory table: one unit live at a time (no prefetch, released after each use).
S3_LEAN=', "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0'
# The mean over steps 6.. of rank 0's wait for stage-3 parameter gathers, in ms per step.
gather_wait() {
  grep -o 'step [0-9]* |.*waiting for stage-3 parameter gathers [0-9.]*' |
    awk '{s = $2; w = $NF; if (s > 5) {t += w; n++}} END {printf "%.1f", n ? t / n : 0}'
}

data_args=()
[ -n "$DATA" ] && data_args=(--data "$DATA" --block_size "$T")

# run WORLD STEPS: prints dscpp train's output (call next_port first)
run() {
  build/dscpp launch --num_procs "$1" --master_port "$port" build/dscpp train --config "$CFG" \
    --n_layer "$L" --n_head "$H" --n_embd "$C" "${data_args[@]}" --steps "$2" --no_shuffle \
    --eval_problems 10 2>&1
}
# ddp STEPS: the same GPT under PyTorch DDP (bench/ddp_gpt.py) at 2 ranks, its default buckets
ddp() {
  build/dscpp launch --num_procs 2 --master_port "$port" .venv/bin/python bench/ddp_gpt.py \
    --data "$DATA" --n_layer "$L" --n_head "$H" --n_embd "$C" --block_size "$T" \
    --micro_batch "$MB" --steps "$1" 2>&1
}
if [ "${DDP:-0}" = 1 ] && [ -z "$DATA" ]; then
  echo "zero_bench: DDP=1 needs DATA and T (the DDP twin trains on a text file)" >&2; exit 2
fi
peak_rss() { grep -o 'peak RSS [0-9.]*' | awk '{if ($3 > m) m = $3} END {printf "%.0f", m}'; }

if [ "$MODE" = memory ]; then
  STEPS=${2:-2}
  printf '| precision | world | stage | formula bytes/param | formula MiB | model states MiB (rank 0) | measured / formula | staging MiB | gathered MiB | peak RSS MiB (max rank) |\n'
  printf '|---|---|---|---|---|---|---|---|---|---|\n'
  for prec in fp32 bf16; do
    for world in 2 4; do
      for stage in 0 1 2 3; do
        write_config "$stage" "$prec" "$world" "$([ "$stage" = 3 ] && echo "$S3_LEAN")"
        next_port
        out=$(run "$world" "$STEPS")
        params=$(grep -o '; [0-9]* parameters' <<<"$out" | head -1 | grep -o '[0-9]*')
        states=$(grep -o 'rank 0: peak RSS [0-9.]* MiB; model states [0-9.]*' <<<"$out" | awk '{print $NF}')
        staging=$(grep -o 'rank 0: .*gradient staging [0-9.]*' <<<"$out" | awk '{print $NF}')
        rss=$(peak_rss <<<"$out")
        live=$(grep -o 'rank 0: ZeRO stage 3 held at most [0-9.]*' <<<"$out" | awk '{print $NF}' || true)
        # bytes per parameter: fp32 Adam 16, 8 + 8/N, 4 + 12/N, 16/N; bf16 + fp32 master 16,
        # 4 + 12/N, 2 + 14/N, 16/N
        awk -v p="$prec" -v n="$world" -v s="$stage" -v P="$params" -v m="$states" -v g="$staging" -v l="${live:-0}" -v r="$rss" 'BEGIN {
          if (s == 3) k = 16 / n;
          else if (p == "fp32") k = (s == 0) ? 16 : (s == 1) ? 8 + 8 / n : 4 + 12 / n;
          else k = (s == 0) ? 16 : (s == 1) ? 4 + 12 / n : 2 + 14 / n;
          f = k * P / 1048576;
          printf "| %s | %d | %d | %.2f | %.1f | %.1f | %.4f | %.1f | %.1f | %.0f |\n", p, n, s, k, f, m, m / f, g, l, r }'
      done
    done
  done
  exit 0
fi

# speed ROUNDS STEPS: one table, stages alternated (and DDP) in every round.
speed() {
  local rounds=$1 steps=$2 r stage out
  local -a r1 r2 t0 t1 t2 td m0 m1 m2 md
  printf '| round | stage 0 tokens/s | stage 1 tokens/s | stage 2 tokens/s |%s stage 1 time / stage 0 | stage 2 time / stage 0 | peak RSS MiB stage 0 / 1 / 2%s |\n' \
    "$([ "${DDP:-0}" = 1 ] && echo ' DDP tokens/s |')" "$([ "${DDP:-0}" = 1 ] && echo ' / DDP')"
  printf '|---|---|---|---|%s---|---|---|\n' "$([ "${DDP:-0}" = 1 ] && echo '---|')"
  for r in $(seq "$rounds"); do
    local -a t=() m=()
    for stage in 0 1 2; do
      write_config "$stage" fp32 2
      next_port
      out=$(run 2 "$steps")
      t+=("$(tokens_per_s <<<"$out")") m+=("$(peak_rss <<<"$out")")
    done
    t0+=("${t[0]}") t1+=("${t[1]}") t2+=("${t[2]}") m0+=("${m[0]}") m1+=("${m[1]}") m2+=("${m[2]}")
    r1+=("$(awk -v a="${t[0]}" -v b="${t[1]}" 'BEGIN {printf "%.3f", a / b}')")
    r2+=("$(awk -v a="${t[0]}" -v b="${t[2]}" 'BEGIN {printf "%.3f", a / b}')")
    local dcol="" dmem=""
    if [ "${DDP:-0}" = 1 ]; then
      next_port
      out=$(ddp "$steps")
      td+=("$(tokens_per_s <<<"$out")") md+=("$(peak_rss <<<"$out")")
      dcol=" ${td[-1]} |" dmem=" / ${md[-1]}"
    fi
    printf '| %s | %s | %s | %s |%s %s | %s | %s / %s / %s%s |\n' "$r" "${t[0]}" "${t[1]}" "${t[2]}" \
      "$dcol" "${r1[-1]}" "${r2[-1]}" "${m[0]}" "${m[1]}" "${m[2]}" "$dmem"
  done
  local dcol="" dmem=""
  if [ "${DDP:-0}" = 1 ]; then dcol=" $(median "${td[@]}") |" dmem=" / $(median "${md[@]}")"; fi
  printf '| median | %s | %s | %s |%s %s | %s | %s / %s / %s%s |\n' "$(median "${t0[@]}")" \
    "$(median "${t1[@]}")" "$(median "${t2[@]}")" "$dcol" "$(median "${r1[@]}")" "$(median "${r2[@]}")" \
    "$(median "${m0[@]}")" "$(median "${m1[@]}")" "$(median "${m2[@]}")" "$dmem"
}

# stage3 ROUNDS STEPS: at 2 ranks in fp32, each round runs stage 0, then stage 3 three ways:
# DeepSpeed's defaults (units kept once gathered in a pass); released after each use with a
# bounded prefetch (S3_PREFETCH); released after each use without prefetch, so every gather is
# waited for. Rank 0's wait for gathers per step, and the fraction of the no-prefetch wait that
# prefetch hides (1 - wait / wait without prefetch).
S3_PREFETCH=", \"stage3_max_reuse_distance\": 0, \"stage3_prefetch_bucket_size\": $S3_AHEAD, \"stage3_max_live_parameters\": $S3_LIVE"
stage3_speed() {
  local rounds=$1 steps=$2 r out
  local -a t0 td tp tn rd rp rn wd wp wn hd hp m0 md mp mn
  printf '| round | stage 0 tokens/s | stage 3 defaults | stage 3 release + prefetch | stage 3 release, no prefetch | time / stage 0: defaults, prefetch, none | gather wait ms/step: defaults, prefetch, none | hidden: defaults, prefetch | peak RSS MiB: stage 0, defaults, prefetch, none |\n'
  printf '|---|---|---|---|---|---|---|---|---|\n'
  for r in $(seq "$rounds"); do
    write_config 0 fp32 2; next_port; out=$(run 2 "$steps")
    t0+=("$(tokens_per_s <<<"$out")") m0+=("$(peak_rss <<<"$out")")
    write_config 3 fp32 2; next_port; out=$(run 2 "$steps")
    td+=("$(tokens_per_s <<<"$out")") wd+=("$(gather_wait <<<"$out")") md+=("$(peak_rss <<<"$out")")
    write_config 3 fp32 2 "$S3_PREFETCH"; next_port; out=$(run 2 "$steps")
    tp+=("$(tokens_per_s <<<"$out")") wp+=("$(gather_wait <<<"$out")") mp+=("$(peak_rss <<<"$out")")
    write_config 3 fp32 2 "$S3_LEAN"; next_port; out=$(run 2 "$steps")
    tn+=("$(tokens_per_s <<<"$out")") wn+=("$(gather_wait <<<"$out")") mn+=("$(peak_rss <<<"$out")")
    rd+=("$(awk -v a="${t0[-1]}" -v b="${td[-1]}" 'BEGIN {printf "%.3f", a / b}')")
    rp+=("$(awk -v a="${t0[-1]}" -v b="${tp[-1]}" 'BEGIN {printf "%.3f", a / b}')")
    rn+=("$(awk -v a="${t0[-1]}" -v b="${tn[-1]}" 'BEGIN {printf "%.3f", a / b}')")
    hd+=("$(awk -v a="${wd[-1]}" -v b="${wn[-1]}" 'BEGIN {printf "%.2f", (b > 0 ? 1 - a / b : 0)}')")
    hp+=("$(awk -v a="${wp[-1]}" -v b="${wn[-1]}" 'BEGIN {printf "%.2f", (b > 0 ? 1 - a / b : 0)}')")
    printf '| %s | %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s / %s | %s / %s / %s / %s |\n' "$r" \
      "${t0[-1]}" "${td[-1]}" "${tp[-1]}" "${tn[-1]}" "${rd[-1]}" "${rp[-1]}" "${rn[-1]}" \
      "${wd[-1]}" "${wp[-1]}" "${wn[-1]}" "${hd[-1]}" "${hp[-1]}" "${m0[-1]}" "${md[-1]}" \
      "${mp[-1]}" "${mn[-1]}"
  done
  printf '| median | %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s / %s | %s / %s / %s / %s |\n' \
    "$(median "${t0[@]}")" "$(median "${td[@]}")" "$(median "${tp[@]}")" "$(median "${tn[@]}")" \
    "$(median "${rd[@]}")" "$(median "${rp[@]}")" "$(median "${rn[@]}")" "$(median "${wd[@]}")" \
    "$(median "${wp[@]}")" "$(median "${wn[@]}")" "$(median "${hd[@]}")" "$(median "${hp[@]}")" \
    "$(median "${m0[@]}")" "$(median "${md[@]}")" "$(median "${mp[@]}")" "$(median "${mn[@]}")"
}

case "$MODE" in
  speed) speed "${2:-5}" "${3:-40}" ;;
  stage3) stage3_speed "${2:-5}" "${3:-40}" ;;
  scale)
    if [ "$MODEL" != 150m ]; then exec env MODEL=150m "$0" "$@"; fi
    for BUCKETS in default 25000000; do
      echo; echo "150M GPT, zero_optimization buckets: $BUCKETS"; echo
      DDP=1 speed "${2:-3}" "${3:-10}"
    done
    ;;
  *) echo "usage: bench/zero_bench.sh memory|speed|scale|stage3 [...]" >&2; exit 2 ;;
esac
