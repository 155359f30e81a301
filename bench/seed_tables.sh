#!/usr/bin/env bash
# The seeds' tables on this machine (docs/seed_tables.md): a per-rank memory cap stands in for a
# GPU's memory, each system's largest micro-batch under it is found by real runs, and then every
# system trains the same samples in the same optimizer steps, each at its own micro-batch.
#   bench/seed_tables.sh [--cap GIB] [--rounds N] [--batch B] [--samples S] [--tables ABC]
#                        [--max_mb M] [--probes FILE]
#   --cap GIB     per-rank cap on measured peak RSS (default 4)
#   --rounds N    timed rounds, the systems alternated within each (default 3)
#   --batch B     samples per rank per optimizer step in the timed runs (default 12)
#   --samples S   global samples each timed run trains on, a multiple of 2 B (default 48)
#   --tables ABC  which tables: A (fp32), B (bf16), C (a model too large for stage 0)
#   --max_mb M    the largest micro-batch tried (default 16; table C: 4)
#   --probes FILE keep each probe's peak RSS in FILE and reuse those already there (a later run
#                 with the same models skips them)
# Tables A and B: the 150M GPT (12 x 1024, 16 heads, block 256, vocab 256) on 2 ranks x 1 thread
# on ../shared/data/tinyshakespeare.txt, AdamW lr 3e-4, clipping 1.0: PyTorch 2.15's DDP and FSDP2
# and DeepSpeed 0.19.8 at ZeRO stages 1-3 (bench/peers/train_gpt.py from the same config file;
# autocast for DDP's bf16, MixedPrecisionPolicy for FSDP2's, DeepSpeed's own; all starting from
# dscpp's initial weights) and dscpp train at ZeRO stages 0-3 with DeepSpeed's default zero
# settings (a config that names the stage alone), and in table B also stage 3 releasing each unit
# after use (RELEASE below; the defaults keep this model's units gathered).
# Max micro-batch: micro-batches 1 and 2 are run (2 steps each, every rank's peak RSS measured),
# the line through them guesses the largest that fits, and further runs narrow it (each guess on
# the line through the nearest run that fits and the nearest that does not) until micro-batch m
# fits and m + 1 does not: every number in the table is a run's.
# Timed rounds: each system trains S samples in optimizer steps of B samples per rank, as micro-
# batch u (the largest divisor of B not above its max) x B / u accumulation steps, so all train
# the same steps on the same data: steady tokens/s (after the first step), the training loop's
# wall time, the last step's loss (the mean over both ranks), the peak RSS, and per round each
# system's speed-up over DDP (DDP's time / its time); medians over the rounds.
# Table C: a 24 x 1408 GPT (571M) in bf16: PyTorch DDP at micro-batch 1 (its peak RSS against
# the cap; one rank, as its per-rank memory does not depend on the number of ranks), dscpp stages
# 0 and 3 in memory against the pre-flight check (DSCPP_MEMORY_LIMIT = 2 x cap, the host of two
# capped devices), then FSDP2, DeepSpeed's stage 3 and dscpp's stage 3 with the optimizer, then
# also the parameters, on nvme (SWAP, default /work/swap; the same zero_optimization section for
# both), units released after use: max micro-batch and one timed round of 16 samples in steps of
# 4 per rank.
# L H C and CL CH CC in the environment change the models.
# Needs build/dscpp and .venv (scripts/setup.sh, bench/peers/setup.sh). Table B alone with one
# round took 27 minutes on the 2-core machine (2026-12-03); all three with the defaults, hours.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, tokens_per_s
CAP=4 ROUNDS=3 BATCH=12 SAMPLES=48 TABLES=ABC MAX_MB=16 PROBES=
while [ $# -gt 0 ]; do
  case $1 in
    --cap) CAP=$2 ;;
    --rounds) ROUNDS=$2 ;;
    --batch) BATCH=$2 ;;
    --samples) SAMPLES=$2 ;;
    --probes) PROBES=$2 ;;
    --tables) TABLES=$2 ;;
    --max_mb) MAX_MB=$2 ;;
    *) echo "seed_tables.sh: unknown argument '$1' (see the header for the flags)" >&2; exit 2 ;;
  esac
  shift 2
done
CAP_MIB=$(awk -v c="$CAP" 'BEGIN {printf "%d", c * 1024}')
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
SWAP=${SWAP:-/work/swap}
PROBE_STEPS=2
export OMP_NUM_THREADS=1
WORK=$(mktemp -d /tmp/seed_tables_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
port=$((21000 + RANDOM % 9000))
T=256
# The model of tables A and B (L layers x C wide, H heads) and of table C (CL x CC, CH heads)
L=${L:-12} C=${C:-1024} H=${H:-16} CL=${CL:-24} CC=${CC:-1408} CH=${CH:-22}
# Stage 3 releasing each unit after use, with a bounded prefetch (DeepSpeed's defaults keep every
# unit gathered once used, up to stage3_max_live_parameters = 1e9 elements: the whole model here)
RELEASE=', "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 15000000, "stage3_max_live_parameters": 30000000'

# pipeline SYSTEM: dscpp overlaps the optimizer's swap reads and writes with its update;
# DeepSpeed 0.19.8's pipelined swapper fails at table C's size (AssertionError: new_alloc_buffers
# is not None, in pipelined_optimizer_swapper.py, when the first sub-group is swapped out), so its
# rows run with its defaults, pipeline_read and pipeline_write false: the same arithmetic.
pipeline() {
  case $1 in
    ds*) echo '' ;;
    *) echo ', "pipeline_read": true, "pipeline_write": true' ;;
  esac
}
# zero_json SYSTEM: the zero_optimization section of a dscpp system (and of DeepSpeed's offload rows)
zero_json() {
  case $1 in
    s0) echo '{"stage": 0}' ;;
    s1) echo '{"stage": 1}' ;;
    s2) echo '{"stage": 2}' ;;
    s3) echo '{"stage": 3}' ;;
    s3r) echo '{"stage": 3'"$RELEASE"'}' ;;
    s3_opt_nvme | ds3_opt_nvme)
      echo '{"stage": 3, "sub_group_size": 10000000, "offload_optimizer": {"device": "nvme",
        "nvme_path": "'"$SWAP"'"'"$(pipeline "$1")"'}'"$RELEASE"'}' ;;
    s3_all_nvme | ds3_all_nvme)
      echo '{"stage": 3, "sub_group_size": 10000000, "offload_optimizer": {"device": "nvme",
        "nvme_path": "'"$SWAP"'"'"$(pipeline "$1")"'},
        "offload_param": {"device": "nvme", "nvme_path": "'"$SWAP"'", "max_in_cpu": 0}'"$RELEASE"'}' ;;
  esac
}
label() {
  case $1 in
    ddp) echo "PyTorch DDP" ;;
    fsdp2) echo "PyTorch FSDP2 (fully_shard per block)" ;;
    ds1 | ds2 | ds3) echo "DeepSpeed ZeRO stage ${1#ds}" ;;
    ds3_opt_nvme) echo "DeepSpeed ZeRO stage 3, optimizer on nvme" ;;
    ds3_all_nvme) echo "DeepSpeed ZeRO stage 3, optimizer and parameters on nvme" ;;
    s0 | s1 | s2 | s3) echo "dscpp ZeRO stage ${1#s}" ;;
    s3r) echo "dscpp ZeRO stage 3, released after use" ;;
    s3_opt_nvme) echo "dscpp ZeRO stage 3, optimizer on nvme" ;;
    s3_all_nvme) echo "dscpp ZeRO stage 3, optimizer and parameters on nvme" ;;
  esac
}

# run SYSTEM PREC MB STEPS: the run's output (exit status kept). Call it as out=$(run ...) after
# next_port (a subshell's port would not count). DDP_PROCS: DDP's number of ranks.
next_port() { port=$((port + 1)); }
run() {
  local sys=$1 prec=$2 mb=$3 steps=$4 gas=${5:-1} procs=${DDP_PROCS:-2} zero
  local precision=""
  [ "$prec" = bf16 ] && precision=', "bf16": {"enabled": true}'
  case $sys in
    ddp) zero='{"stage": 0}' ;;
    fsdp2) zero='{"stage": 3}' ;;
    ds[123]) zero='{"stage": '"${sys#ds}"'}' ;;
    ds3_*) zero=$(zero_json "$sys") ;;
    *) zero=$(zero_json "$sys") procs=2 ;;
  esac
  cat >"$WORK/config.json" <<JSON
{"train_batch_size": $((mb * procs * gas)), "train_micro_batch_size_per_gpu": $mb, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": $zero,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$precision}
JSON
  case $sys in
    ddp | fsdp2 | ds*)
      local flag=()
      [ -n "${INIT:-}" ] && flag+=(--init "$INIT")
      build/dscpp launch --num_procs "$procs" --master_port "$port" .venv/bin/python \
        bench/peers/train_gpt.py --system "$(sed 's/^ds[0-9].*$/deepspeed/' <<<"$sys")" \
        --config "$WORK/config.json" --data "$DATA" --n_layer $L --n_head $H --n_embd $C \
        --block_size $T --steps "$steps" --warmup 1 "${flag[@]}" 2>&1
      return
      ;;
  esac
  build/dscpp launch --num_procs 2 --master_port "$port" build/dscpp train --config "$WORK/config.json" \
    --data "$DATA" --n_layer $L --n_head $H --n_embd $C --block_size $T --vocab_size 256 \
    --steps "$steps" --no_shuffle --eval_problems 0 2>&1
}

peak_of() { grep -o 'rank [0-9]*: peak RSS [0-9.]*' | awk '{if ($5 > m) m = $5} END {printf "%.0f", m}'; }
train_time_of() { grep -o 'train time: [0-9.]*' | awk '{print $3}'; }
loss_of() { grep -oE '(step +[0-9]+/[0-9]+ \| loss|step [0-9]+ loss) [0-9.]+' | tail -1 | awk '{print $NF}'; }

declare -A FAILED  # key -> the error of a peer's run that failed
declare -A PEAK  # key SYSTEM PREC MB -> max peak RSS over the ranks, MiB (in this shell: no $(...))
key() { echo "$L/$C/$H/$T/$1/$2/$3"; }  # the model's shape, the system, precision, micro-batch
# measure SYSTEM PREC MB: PEAK[key SYSTEM PREC MB] from a PROBE_STEPS run, once; a failed run stops
# the script
measure() {
  local key out
  key=$(key "$@")
  [ -z "${PEAK[$key]:-}" ] && [ -n "$PROBES" ] && [ -f "$PROBES" ] &&
    PEAK[$key]=$(awk -v k="$key" '$1 == k {p = $2} END {print p}' "$PROBES")
  if [ -z "${PEAK[$key]:-}" ]; then
    next_port
    if ! out=$(run "$1" "$2" "$3" $PROBE_STEPS); then
      echo "seed_tables.sh: $(label "$1") ($2) at micro-batch $3 failed:" >&2
      tail -20 <<<"$out" >&2
      # A peer that fails is a row that says why; dscpp failing is a bug to fix first.
      case $1 in ddp | fsdp2 | ds*) ;; *) exit 1 ;; esac
      FAILED[$key]=$(grep -oE '[A-Za-z]*(Error|Exception)[^|]*' <<<"$out" | tail -1 || true)
      PEAK[$key]=failed
      return
    fi
    PEAK[$key]=$(peak_of <<<"$out")
    echo "  probe: $(label "$1") $2 micro-batch $3: peak RSS ${PEAK[$key]} MiB" >&2
    [ -n "$PROBES" ] && echo "$key ${PEAK[$key]}" >>"$PROBES"
  fi
}
fits() {
  measure "$@"
  [ "${PEAK[$(key "$@")]}" != failed ] && [ "${PEAK[$(key "$@")]}" -le "$CAP_MIB" ]
}

# max_mb SYSTEM PREC: sets MAX to the largest micro-batch (up to MAX_MB) whose runs stay under the
# cap; 0 when micro-batch 1 does not
max_mb() {
  local sys=$1 prec=$2 p1 p2 m lo=2 hi=$((MAX_MB + 1))
  MAX=0
  fits "$sys" "$prec" 1 || return 0
  MAX=1
  fits "$sys" "$prec" 2 || return 0
  p1=${PEAK[$(key "$sys" "$prec" 1)]} p2=${PEAK[$(key "$sys" "$prec" 2)]}
  m=$(awk -v a="$p1" -v b="$p2" -v c="$CAP_MIB" -v x="$MAX_MB" \
    'BEGIN {s = b - a; m = s > 0 ? int(1 + (c - a) / s) : x; if (m < 2) m = 2; if (m > x) m = x; print m}')
  # lo fits and hi does not (MAX_MB + 1: not run). Each next guess is on the line through the
  # peaks at lo and hi once hi was run (the peak grows faster than the first two points say),
  # and lo + 1 before that; the search ends with hi = lo + 1, both run.
  while [ $((hi - lo)) -gt 1 ]; do
    if fits "$sys" "$prec" "$m"; then lo=$m; else hi=$m; fi
    if [ "$hi" -gt "$MAX_MB" ]; then
      m=$((lo + 1))
    else
      m=$(awk -v l="$lo" -v h="$hi" -v pl="${PEAK[$(key "$sys" "$prec" "$lo")]}" \
        -v ph="${PEAK[$(key "$sys" "$prec" "$hi")]}" -v c="$CAP_MIB" \
        'BEGIN {m = ph > pl ? int(l + (c - pl) * (h - l) / (ph - pl)) : l + 1;
                if (m <= l) m = l + 1; if (m >= h) m = h - 1; print m}')
    fi
  done
  MAX=$lo
}

# table PREC BATCH SAMPLES SYSTEM...: the max micro-batches, then ROUNDS alternated timed rounds
# in which every system trains SAMPLES samples in optimizer steps of BATCH samples per rank (the
# same steps on the same data for all: micro-batch u, the largest divisor of BATCH not above the
# system's max, and BATCH / u gradient accumulation steps)
table() {
  local prec=$1 batch=$2 samples=$3
  shift 3
  local systems=("$@") sys r steps=$((samples / (2 * batch)))
  if [ $((steps * 2 * batch)) -ne "$samples" ] || [ "$steps" -lt 1 ]; then
    echo "seed_tables.sh: --samples $samples is not a multiple of 2 x $batch (2 ranks x the batch per rank)" >&2
    exit 2
  fi
  declare -A MB USE TOK TIME LOSS RATIO RUNPEAK
  for sys in "${systems[@]}"; do
    max_mb "$sys" "$prec"
    MB[$sys]=$MAX
    local u=$MAX
    while [ "$u" -gt 0 ] && [ $((batch % u)) -ne 0 ]; do u=$((u - 1)); done
    USE[$sys]=$u
  done
  for r in $(seq "$ROUNDS"); do
    for sys in "${systems[@]}"; do
      local u=${USE[$sys]} out
      [ "$u" -gt 0 ] || continue
      next_port
      out=$(run "$sys" "$prec" "$u" "$steps" $((batch / u))) || { echo "$out" | tail -20 >&2; exit 1; }
      TOK[$sys]+=" $(tokens_per_s <<<"$out")"
      TIME[$sys]+=" $(train_time_of <<<"$out")"
      LOSS[$sys]+=" $(loss_of <<<"$out")"
      RUNPEAK[$sys]+=" $(peak_of <<<"$out")"
      echo "  round $r: $(label "$sys") $prec micro-batch $u x $((batch / u)): $(grep -o 'train time.*' <<<"$out"), loss $(loss_of <<<"$out")" >&2
    done
    # this round's time over DDP's
    local base
    base=$(awk '{print $NF}' <<<"${TIME[ddp]:-}")
    for sys in "${systems[@]}"; do
      [ -n "${TIME[$sys]:-}" ] && [ -n "$base" ] &&
        RATIO[$sys]+=" $(awk -v a="$(awk '{print $NF}' <<<"${TIME[$sys]}")" -v b="$base" 'BEGIN {printf "%.2f", b / a}')"
    done
  done
  printf '| system | max micro-batch under %s GiB | its peak RSS, MiB | max micro-batch / DDP | micro-batch x GAS trained | peak RSS training, MiB | tokens/s | time for %s samples, s | speed-up over DDP (rounds) | loss after %s samples |\n' \
    "$CAP" "$samples" "$samples"
  printf '|---|---|---|---|---|---|---|---|---|---|\n'
  for sys in "${systems[@]}"; do
    local mb=${MB[$sys]}
    if [ "$mb" -eq 0 ] && [ "${PEAK[$(key "$sys" "$prec" 1)]}" = failed ]; then
      printf '| %s | none: micro-batch 1 fails: %s | | | | | | | | |\n' "$(label "$sys")" "${FAILED[$(key "$sys" "$prec" 1)]}"
      continue
    fi
    if [ "$mb" -eq 0 ]; then
      printf '| %s | none: micro-batch 1 peaks at %s MiB | | | | | | | | |\n' "$(label "$sys")" "${PEAK[$(key "$sys" "$prec" 1)]}"
      continue
    fi
    local vs_ddp="" speed="" shown=$mb
    [ "$mb" -eq "$MAX_MB" ] && shown="$mb (the most tried)"
    [ "${MB[ddp]:-0}" -gt 0 ] && vs_ddp=$(awk -v a="$mb" -v b="${MB[ddp]}" 'BEGIN {printf "%.1fx", a / b}')
    [ -n "${RATIO[$sys]:-}" ] && speed="$(printf '%.2f' "$(median ${RATIO[$sys]})")x (${RATIO[$sys]# })"
    local u=${USE[$sys]}
    printf '| %s | %s | %s | %s | %s x %s | %s | %.1f | %.1f | %s | %s |\n' "$(label "$sys")" "$shown" \
      "${PEAK[$(key "$sys" "$prec" "$mb")]}" "$vs_ddp" "$u" $((batch / u)) "$(median ${RUNPEAK[$sys]})" \
      "$(median ${TOK[$sys]})" "$(median ${TIME[$sys]})" "$speed" "$(median ${LOSS[$sys]})"
  done
}

# write_init: INIT = the initial weights of the current model (dscpp's seeded init), for DDP
write_init() {
  INIT=$WORK/init_${L}x${C}.safetensors
  echo '{"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}' >"$WORK/init.json"
  build/dscpp train --config "$WORK/init.json" --data "$DATA" --n_layer $L --n_head $H --n_embd $C \
    --block_size $T --vocab_size 256 --steps 0 --save_final "$INIT" --eval_problems 0 >/dev/null 2>&1 ||
    { echo "seed_tables.sh: could not write the initial weights" >&2; exit 1; }
}

echo "# seed tables: cap $CAP GiB per rank (peak RSS), rounds: $ROUNDS, $(date -u +%Y-%m-%d)"
if [[ $TABLES == *A* ]]; then
  echo
  echo "## Table A: fp32, GPT $L x $C ($H heads, block $T), 2 ranks"
  write_init
  table fp32 "$BATCH" "$SAMPLES" ddp fsdp2 ds1 ds2 ds3 s0 s1 s2 s3
fi
if [[ $TABLES == *B* ]]; then
  echo
  echo "## Table B: bf16 (DDP under autocast), GPT $L x $C ($H heads, block $T), 2 ranks"
  write_init
  table bf16 "$BATCH" "$SAMPLES" ddp fsdp2 ds1 ds2 ds3 s0 s1 s2 s3 s3r
fi
if [[ $TABLES == *C* ]]; then
  L=$CL C=$CC H=$CH
  RELEASE=', "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 25000000, "stage3_max_live_parameters": 50000000'
  mkdir -p "$SWAP"
  echo
  echo "## Table C: bf16, GPT $L x $C ($H heads, block $T), 2 ranks: too large for stage 0"
  # DDP's per-rank memory does not depend on the number of ranks: one rank spares the machine
  # (two of these would fill most of its 24 GiB).
  DDP_PROCS=1 measure ddp bf16 1
  echo "- $(label ddp) at micro-batch 1 (one rank): peak RSS ${PEAK[$(key ddp bf16 1)]} MiB against the cap of $CAP_MIB MiB"
  for sys in s0 s3; do
    next_port
    out=$(DSCPP_MEMORY_LIMIT=$(awk -v c="$CAP" 'BEGIN {printf "%dM", 2 * c * 1024}') run "$sys" bf16 1 $PROBE_STEPS || true)
    msg=$(grep -o 'training [0-9]* trainable parameters at .* is available ([^)]*)' <<<"$out" | head -1 || true)
    if [ -z "$msg" ]; then
      echo "- $(label "$sys"): NOT refused by the pre-flight check; peak RSS $(peak_of <<<"$out") MiB"
    else
      echo "- $(label "$sys"): refused by the pre-flight check: $msg"
    fi
  done
  echo
  write_init
  MAX_MB=$((MAX_MB < 4 ? MAX_MB : 4)) ROUNDS=1 table bf16 4 16 fsdp2 ds3 ds3_opt_nvme ds3_all_nvme \
    s3_opt_nvme s3_all_nvme
fi
