#!/usr/bin/env bash
# The moonshot (docs/moonshot.md): a GPT of 2 billion parameters trained on this machine (24 GiB,
# 2 cores, no GPU) with ZeRO stage 3, its parameter shards and its optimizer state (with the fp32
# weights) on disk, activations recomputed (zero::checkpoint), 2 ranks. First the same model at
# stage 0 and at stage 2 without offload, which the pre-flight check must refuse in under 10 s
# with the bytes they would need; then the training run, sampling the swap folder's used space;
# then the table: step time, bytes read and written per step and their bandwidth (both ranks),
# peak RSS per rank, disk used, and the losses.
#   bench/moonshot.sh [STEPS]    SWAP=/work/swap  LAYERS=40 WIDTH=2048 HEADS=16 BLOCK=256
#                                NPROCS=2 MICRO=1  LR=3e-6
# Issue 35's 3B run: LAYERS=32 WIDTH=2816 HEADS=22 BLOCK=128 NPROCS=1 MICRO=4 (and NPROCS=2
# MICRO=2: the same 512 tokens per step).
# The learning rate is small on purpose: a fresh GPT this wide and deep takes sign-like first
# AdamW steps, and at 1e-5 or more its loss jumps up before it falls (so does a 463M GPT trained
# in memory at 1e-4; docs/moonshot.md).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
SWAP=${SWAP:-/work/swap}
LAYERS=${LAYERS:-40}
WIDTH=${WIDTH:-2048}
HEADS=${HEADS:-16}
BLOCK=${BLOCK:-256}
NPROCS=${NPROCS:-2}
MICRO=${MICRO:-1}  # sequences per rank per step (GAS 1)
LR=${LR:-3e-6}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
LOG=${LOG:-/tmp/moonshot_run.log}  # the run's whole log is kept here
export OMP_NUM_THREADS=1
mkdir -p "$SWAP"
WORK=$(mktemp -d /tmp/moonshot_XXXXXX)
trap 'kill "$sampler" 2>/dev/null || true; rm -rf "$WORK"' EXIT
sampler=
port=$((21000 + RANDOM % 9000))
model=(--n_layer "$LAYERS" --n_embd "$WIDTH" --n_head "$HEADS" --vocab_size 256
       --block_size "$BLOCK" --data "$DATA" --eval_problems 0)

config() {  # $1: zero_optimization JSON
  cat <<JSON
{"train_batch_size": $((NPROCS * MICRO)), "train_micro_batch_size_per_gpu": $MICRO, "steps_per_print": 1,
 "wall_clock_breakdown": true, "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "zero_optimization": $1,
 "optimizer": {"type": "AdamW", "params": {"lr": $LR, "weight_decay": 0.01}}}
JSON
}
launch() {  # $1: config file; the rest: dscpp train's extra flags
  port=$((port + 1))
  local cfg=$1
  shift
  build/dscpp launch --num_procs "$NPROCS" --master_port "$port" build/dscpp train --config "$cfg" \
    "${model[@]}" --steps "$STEPS" "$@" 2>&1
}

echo "## the refusals: the same GPT without offload"
for zero in '{"stage": 0}' '{"stage": 2}'; do
  config "$zero" >"$WORK/refused.json"
  t0=$(date +%s.%N)
  out=$(launch "$WORK/refused.json" || true)
  t1=$(date +%s.%N)
  msg=$(grep -o 'training [0-9]* trainable parameters at .* is available ([^)]*)' <<<"$out" | head -1 || true)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
  if [ -z "$msg" ]; then
    echo "zero_optimization $zero was NOT refused by the pre-flight check:"
    tail -20 <<<"$out"
    exit 1
  fi
  echo "- zero_optimization $zero: refused in $secs s: $msg"
done

echo
echo "## ZeRO stage 3, parameters and optimizer on nvme ($SWAP), $LAYERS x $WIDTH, $NPROCS rank(s)"
# The disk it needs, per dscpp estimate (the swap files, and zero::Init's spill at set-up), and
# its bound on the peak RSS per rank.
config '{"stage": 3, "sub_group_size": 10000000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "'"$SWAP"'", "pipeline_read": true,
                         "pipeline_write": true},
   "offload_param": {"device": "nvme", "nvme_path": "'"$SWAP"'", "max_in_cpu": 0}}' >"$WORK/est.json"
build/dscpp estimate --config "$WORK/est.json" --model gpt --n_layer "$LAYERS" --n_embd "$WIDTH" \
  --n_head "$HEADS" --vocab_size 256 --block_size "$BLOCK" --num_procs "$NPROCS" \
  --checkpoint_activations 2>&1 |
  grep -E "optimizer and parameters on nvme|swap|disk" | head -5 || true
config '{"stage": 3, "sub_group_size": 10000000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "'"$SWAP"'", "pipeline_read": true,
                         "pipeline_write": true},
   "offload_param": {"device": "nvme", "nvme_path": "'"$SWAP"'", "max_in_cpu": 0}}' >"$WORK/run.json"
# The swap files are unlinked while open: df sees them, ls does not. Sample the folder's used
# space every 2 s during the run.
used() { df -B1 --output=used "$SWAP" | tail -1; }
before=$(used)
(while true; do used; sleep 2; done) >"$WORK/df.txt" &
sampler=$!
t0=$(date +%s)
launch "$WORK/run.json" --checkpoint_activations --no_shuffle | tee "$WORK/run.log" |
  grep -E 'step +[0-9]+/|peak RSS|throughput|error|Error' || true
t1=$(date +%s)
kill "$sampler" 2>/dev/null || true
peak_disk=$(sort -n "$WORK/df.txt" | tail -1)

echo
echo "| step | loss | step s | forward+data s | backward s | optimizer s | params read GiB | params written GiB | optimizer read GiB | optimizer written GiB | gradients written GiB | gradients read GiB | disk MiB/s (all ranks) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
grep -o 'info\] step [0-9]* | loss .*' "$WORK/run.log" | awk -v nprocs="$NPROCS" '
  function num(pattern,   m) { if (match($0, pattern)) { m = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", m); return m + 0 } return 0 }
  {
    step = num("step [0-9]+"); loss = num("loss [0-9.]+")
    win = num("window [0-9.]+") / 1000; fwd = num("forward\\+data [0-9.]+") / 1000
    bwd = num("backward [0-9.]+") / 1000; opt = num("optimizer [0-9.]+ ms") / 1000
    ow = 0; orr = 0
    if (match($0, /offloaded optimizer [0-9.]+ ms: read [0-9.]+ MiB, wrote [0-9.]+ MiB/)) {
      s = substr($0, RSTART, RLENGTH); split(s, f, " "); orr = f[6]; ow = f[9]
    }
    pr = 0; pw = 0
    if (match($0, /parameters on disk: read [0-9]+ shards \([0-9]+ ahead of their request, [0-9.]+ MiB\), wrote [0-9.]+ MiB/)) {
      s = substr($0, RSTART, RLENGTH); gsub(/[(),]/, "", s); split(s, f, " ")
      pr = f[12]; pw = f[15]
    }
    gw = 0; gr = 0
    if (match($0, /gradients on disk: wrote [0-9.]+ MiB, read [0-9.]+ MiB/)) {
      s = substr($0, RSTART, RLENGTH); split(s, f, " "); gw = f[5]; gr = f[8]
    }
    mib = nprocs * (pr + pw + orr + ow + gw + gr)  # every rank moves the same bytes
    printf "| %d | %.4f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |\n",
      step, loss, win, fwd, bwd, opt, pr / 1024, pw / 1024, orr / 1024, ow / 1024, gw / 1024, gr / 1024, mib / win
  }'
echo
grep -o 'rank [0-9]: peak RSS [0-9.]* MiB' "$WORK/run.log" | sort | awk '{printf "- %s %s peak RSS %.2f GiB\n", $1, $2, $5 / 1024}'
awk -v a="$before" -v b="$peak_disk" 'BEGIN {printf "- swap folder used at most %.2f GiB beyond the %.2f GiB it held before\n", (b - a) / 2^30, a / 2^30}'
echo "- wall time of the run (build, set-up, $STEPS steps): $((t1 - t0)) s"
grep -o 'offloaded optimizer [0-9.]* ms: .*stepped [0-9.]* ms' "$WORK/run.log" | tail -1 | sed 's/^/- last step, rank 0: /'
grep -o 'parameters on disk: read [0-9]* shards ([0-9]* ahead of their request.*' "$WORK/run.log" | tail -1 | sed 's/^/- last step, rank 0: /'
cp "$WORK/run.log" "$LOG"
echo "- the whole log: $LOG"
