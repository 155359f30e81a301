#!/usr/bin/env bash
# Checkpoint save speed: how long a save stops training, synchronous and in the background
# (checkpoint.writer.decoupled), and the bytes per second written, against the disk's own
# sequential write bandwidth measured in the same round (docs/checkpoint.md, "Save speed").
#   bench/checkpoint_bench.sh [ROUNDS]          MODEL=small (16 x 512, 50M), 150m or bench (6 x 384)
#   NPROC=1 bench/checkpoint_bench.sh [ROUNDS]  one rank, so a core is left to the writing thread
#   PEERS=1 MODEL=150m bench/checkpoint_bench.sh [ROUNDS]   adds the peers (needs bench/peers/setup.sh
#          for DeepSpeed): FSDP2 with torch.distributed.checkpoint's save and async_save, and
#          DeepSpeed's save_checkpoint, the same GPT, data, config and saves (bench/peers/train_gpt.py)
# Each round, alternating in this order:
#   sync   dscpp train on NPROC (2) local ranks (one core each), ZeRO stage 2, fp32 AdamW (12 bytes per
#          parameter saved: values, exp_avg, exp_avg_sq), 9 steps with a save after steps 3, 6
#          and 9; the engine logs how long each save_checkpoint blocked. "steady" is the mean of
#          saves 2 and 3 (the first save of a process touches fresh memory).
#   bg     the same run with checkpoint.writer.decoupled: save_checkpoint returns at once and
#          training pays for the write through the steps it overlaps (the writing thread shares
#          the cores with training). The stall of a save is what the steps from the save to its
#          publication took beyond the median step without a save in flight (from --metrics);
#          saves 1 and 2 (the last one is waited for at the end). Its write rate is the bytes of
#          both ranks over the slower rank's write time (show_statistics).
#   peers  (PEERS=1) the same 9 steps and saves by each peer, which reports its synchronous save's
#          time and its background save's stall in the terms above (train_gpt.py's Saver).
#   plain  the same number of bytes written by dd into DIR, NPROC writers at once (as the ranks
#          write), each fsynced at its end, timed from start to both done: once through the page
#          cache in 8 MiB blocks, once with O_DIRECT.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh  # median, gpt_shape
ROUNDS=${1:-3}
MODEL=${MODEL:-small}
NPROC=${NPROC:-2}
case "$MODEL" in
  150m | bench) gpt_shape "$MODEL"
    ARGS="--n_layer $L --n_head $H --n_embd $C --block_size $T --data ../shared/data/tinyshakespeare.txt" ;;
  small) ARGS="--n_layer 16 --n_head 8 --n_embd 512" ;;
  *) echo "MODEL must be small, 150m or bench" >&2; exit 2 ;;
esac
DIR=${DIR:-$(mktemp -d /var/tmp/dscpp_ckpt_bench_XXXXXX)}
SYNC=$(mktemp /tmp/ckpt_bench_XXXXXX.json) BG=$(mktemp /tmp/ckpt_bench_XXXXXX.json)
METRICS=$(mktemp /tmp/ckpt_bench_XXXXXX.jsonl) LOG=$(mktemp /tmp/ckpt_bench_XXXXXX.log)
trap 'rm -rf "$SYNC" "$BG" "$METRICS" "$LOG" "$DIR"' EXIT
common='"train_batch_size": '$NPROC', "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}'
echo "{$common}" >"$SYNC"
echo "{$common, \"checkpoint\": {\"writer\": {\"decoupled\": true, \"show_statistics\": true}}}" >"$BG"
export OMP_NUM_THREADS=1
port=$((21000 + RANDOM % 9000))
train() {  # train CONFIG: a 9-step run saving every 3 steps; its log on stdout
  port=$((port + 1))
  rm -rf "${DIR:?}"/*
  build/dscpp launch --num_procs $NPROC --master_port $port build/dscpp train --config "$1" $ARGS \
    --steps 9 --save_interval 3 --eval_problems 10 --save_dir "$DIR/ckpt" --metrics "$METRICS" 2>&1
}

PEERS=${PEERS:-0}
[ "$PEERS" = 0 ] || [ "$MODEL" != small ] || { echo "PEERS=1 needs MODEL=150m or bench" >&2; exit 2; }
peer() {  # peer SYSTEM MODE: "SYNC STALL" seconds of a 9-step run saving every 3 steps
  port=$((port + 1))
  rm -rf "${DIR:?}"/*
  local out
  out=$(build/dscpp launch --num_procs $NPROC --master_port $port .venv/bin/python \
    bench/peers/train_gpt.py --system "$1" --save_mode "$2" --config "$SYNC" --n_layer $L \
    --n_head $H --n_embd $C --block_size $T --data ../shared/data/tinyshakespeare.txt --steps 9 \
    --warmup 1 --save_dir "$DIR/peer" --save_interval 3 2>&1) || true
  grep -oE "saves: sync [0-9.]+ s, stall [0-9.]+" <<<"$out" | awk '{print $3, $6}' |
    grep . || { echo "$1 $2 failed:" >&2; tail -5 <<<"$out" >&2; echo "- -"; }
}
printf "%-6s %8s %9s %9s %9s %7s %9s %9s %9s %7s\n" round MiB "sync 1st" "sync s" "bg stall" \
  "ratio" "bg MiB/s" "dd MiB/s" "direct" "bg/dd"
stalls=() syncs=() ratios=() bgrates=() ddrates=() directs=()
fsdp_syncs=() fsdp_stalls=() ds_syncs=() ds_stalls=()
for round in $(seq 1 "$ROUNDS"); do
  out=$(train "$SYNC")
  lines=$(grep -o "saved checkpoint .* MiB in [0-9.]* s" <<<"$out" || true)
  [ "$(wc -l <<<"$lines")" = 3 ] || { echo "expected 3 saves:"; echo "$out" | tail -20; exit 1; }
  mib=$(head -1 <<<"$lines" | sed -E 's/.* ([0-9.]+) MiB in ([0-9.]+) s/\1/')
  secs=($(sed -E 's/.* ([0-9.]+) MiB in ([0-9.]+) s/\2/' <<<"$lines"))
  steady=$(awk -v a="${secs[1]}" -v b="${secs[2]}" 'BEGIN {printf "%.3f", (a + b) / 2}')

  out=$(train "$BG")
  # The stall of the saves after steps 3 and 6: the steps from the save to its publication over
  # the median step with no save in flight; the write rate: both ranks' bytes over the slower
  # rank's write time, the mean of the two saves.
  echo "$out" >"$LOG"
  read -r stall bgrate < <(python3 - "$METRICS" "$LOG" "$NPROC" <<'PY'
import json, re, statistics, sys
log = open(sys.argv[2]).read()
pubs = [int(p) for p in re.findall(r"published checkpoint \S+ at optimizer step (\d+)", log)]
if len(pubs) != 3:
    sys.exit(f"expected 3 publications, got {pubs}")
w = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    w[m["step"]] = int(sys.argv[3]) / m["samples_per_s"]  # seconds: train_batch_size NPROC
flight = [range(4, pubs[0] + 1), range(7, pubs[1] + 1)]
base = statistics.median(w[s] for s in range(2, 10) if not any(s in f for f in flight))
stall = statistics.mean(sum(w[s] - base for s in f) for f in flight)
rates = []
for tag in ("global_step3", "global_step6"):
    got = re.findall(tag + r": this rank wrote ([0-9.]+) MiB in ([0-9.]+) s", log)
    rates.append(sum(float(m) for m, _ in got) / max(float(t) for _, t in got))
print(f"{stall:.3f} {statistics.mean(rates):.0f}")
PY
)
  [ -n "$bgrate" ] || { echo "$out" | tail -20; exit 1; }
  if [ "$PEERS" != 0 ]; then
    read -r fs_sync _ < <(peer fsdp2 sync)
    read -r _ fs_stall < <(peer fsdp2 async)
    read -r ds_sync _ < <(peer deepspeed sync)
    read -r _ ds_stall < <(peer deepspeed async)
    echo "round $round peers: FSDP2 dcp.save $fs_sync s, dcp.async_save stall $fs_stall s;" \
      "DeepSpeed save_checkpoint $ds_sync s, decoupled stall $ds_stall s"
    fsdp_syncs+=("$fs_sync") fsdp_stalls+=("$fs_stall") ds_syncs+=("$ds_sync") ds_stalls+=("$ds_stall")
  fi
  rm -rf "${DIR:?}"/*
  sync
  plain() {  # plain FLAG...: MiB/s of NPROC dd writers of mib/NPROC each
    local blocks t0 t1 q
    blocks=$(awk -v m="$mib" -v n="$NPROC" 'BEGIN {print int(m / n / 8 + 0.5)}')
    t0=$(date +%s.%N)
    for q in $(seq 1 "$NPROC"); do
      dd if=/dev/zero of="$DIR/plain$q" bs=8M count="$blocks" conv=fsync status=none "$@" &
    done
    wait
    t1=$(date +%s.%N)
    rm -f "$DIR"/plain*
    awk -v b="$blocks" -v n="$NPROC" -v a="$t0" -v z="$t1" 'BEGIN {printf "%.0f", n * b * 8 / (z - a)}'
  }
  dd_bw=$(plain)
  direct_bw=$(plain oflag=direct)
  ratio=$(awk -v a="$stall" -v b="$steady" 'BEGIN {printf "%.3f", a / b}')
  printf "%-6s %8s %9s %9s %9s %7s %9s %9s %9s %7s\n" "$round" "$mib" "${secs[0]}" "$steady" \
    "$stall" "$ratio" "$bgrate" "$dd_bw" "$direct_bw" \
    "$(awk -v a="$bgrate" -v b="$dd_bw" 'BEGIN {printf "%.2f", a / b}')"
  stalls+=("$stall") syncs+=("$steady") ratios+=("$ratio") bgrates+=("$bgrate")
  ddrates+=("$dd_bw") directs+=("$direct_bw")
done
echo "medians: synchronous save $(median "${syncs[@]}") s; background save's stall" \
  "$(median "${stalls[@]}") s ($(median "${ratios[@]}") of the synchronous save);" \
  "background write $(median "${bgrates[@]}") MiB/s, dd $(median "${ddrates[@]}") MiB/s," \
  "dd O_DIRECT $(median "${directs[@]}") MiB/s"
if [ "$PEERS" != 0 ]; then
  med() { local v=() x; for x in "$@"; do [ "$x" = - ] || v+=("$x"); done; ((${#v[@]})) && median "${v[@]}" || echo -; }
  echo "peers, medians: FSDP2 dcp.save $(med "${fsdp_syncs[@]}") s, dcp.async_save stall" \
    "$(med "${fsdp_stalls[@]}") s; DeepSpeed save_checkpoint $(med "${ds_syncs[@]}") s," \
    "decoupled stall $(med "${ds_stalls[@]}") s"
fi
