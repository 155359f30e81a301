#!/usr/bin/env bash
# Training across simulated hosts on one machine: HOSTS network namespaces joined by a bridge,
# each host's link shaped with tc (netem: a rate and a one-way delay on every host's egress),
# PER_HOST ranks in each, `dscpp launch --launcher ssh` with 'ip netns exec' standing in for
# ssh. Each round runs the same training once per variant (TRANSPORTS), alternated:
#   flat  DSCPP_COMM_HIERARCHY=off: every collective on Gloo over TCP, ranks in one ring
#   hier  shared memory inside each host, Gloo between hosts (NOTE [hierarchical collectives])
#   +qwz, +qgz, +hpz (after either): ZeRO++'s zero_quantized_weights /
#         zero_quantized_gradients / zero_hpz_partition_size = PER_HOST (stage 3)
#   fsdp2, hsdp, deepspeed  the peers: PyTorch's FSDP2 over all ranks; FSDP2 sharded inside each
#         host and replicated across hosts (HSDP); DeepSpeed with the variant's config (+qwz and
#         +qgz apply to it too), by bench/peers/train_gpt.py (.venv, bench/peers/setup.sh; the
#         same GPT, initial weights, data order and optimizer; a peer reports its last loss)
# and reports, per variant, the bytes that crossed between hosts per training step (exact: the
# hosts' interface counters, TCP/IP headers included, over STEPS - 2 steps, from two runs of the
# first round), the median tokens/s and time per step over the rounds, each against the first
# variant's, and the loss the last round printed at its last step.
#   bench/multihost.sh [ROUNDS] [STEPS]      (as root; needs iproute2 with tc/netem)
# Environment:
#   MODEL=bench (default; the benchmark GPT 6 x 384, T 256, micro-batch 4) or 150m (12 x 1024,
#         micro-batch 1), on ../shared/data/tinyshakespeare.txt (DATA overrides)
#   HOSTS=2 PER_HOST=2   the layout; STAGE=2; PREC=fp32 or bf16
#   RATE=1gbit DELAY=1ms  each host's link (RATE=none: unshaped veth); the delay needs netem
#   in the kernel, else only the rate is shaped (tbf), which the report says
#   PLOT=FILE.svg  the loss curves of the last round and their difference from the first variant
#   TRANSPORTS="flat hier" (e.g. "hier hier+qwz hier+qwz+qgz" with STAGE=3); BUCKETS=N sets reduce/allgather_bucket_size (default: the config's
#   defaults, as a user would run); ZERO='"key": value, ...' adds zero_optimization keys (e.g.
#   '"stage3_max_reuse_distance": 0', so that stage 3 gathers every unit again in backward);
#   LOGGER=1 turns the comms_logger on and prints rank 0's table
#   (the bytes each collective sent to the own host and to other hosts)
# The machine's 2 cores are oversubscribed beyond 2 ranks: compare times only between the
# transports of one run; the bytes do not depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${1:-3}
STEPS=${2:-8}
MODEL=${MODEL:-bench}
HOSTS=${HOSTS:-2}
PER_HOST=${PER_HOST:-2}
STAGE=${STAGE:-2}
PREC=${PREC:-fp32}
RATE=${RATE:-1gbit}
DELAY=${DELAY:-1ms}
TRANSPORTS=${TRANSPORTS:-flat hier}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
gpt_shape "$MODEL"
WORLD=$((HOSTS * PER_HOST))
STEPS1=2

ID="$$"
BR="dsbr$ID"
X=$((($$ % 200) + 20))
WORK=$(mktemp -d /tmp/dscpp_multihost_XXXXXX)
cleanup() {
  for h in $(seq "$HOSTS"); do ip netns del "dscpp_h${h}_$ID" 2>/dev/null || true; done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- the hosts -----------------------------------------------------------------------------
# netem (rate and delay) where the kernel has it; else tbf, a rate without added delay (this
# development machine's kernel is built without CONFIG_NET_SCH_NETEM).
NETEM=0
ip netns add "dscpp_probe_$ID"
ip netns exec "dscpp_probe_$ID" tc qdisc add dev lo root netem delay 1ms 2>/dev/null && NETEM=1
ip netns del "dscpp_probe_$ID"
[ "$NETEM" = 1 ] || DELAY="none (no netem in this kernel: tbf shapes the rate only)"
ip link add "$BR" type bridge && ip link set "$BR" up
: >"$WORK/hostfile"
for h in $(seq "$HOSTS"); do
  ns="dscpp_h${h}_$ID"
  ip netns add "$ns"
  ip link add "dsh${h}_$ID" type veth peer name "dsb${h}_$ID"
  ip link set "dsh${h}_$ID" netns "$ns"
  # The same name on every host, so that the peers' Gloo can be told which one to use.
  ip -n "$ns" link set "dsh${h}_$ID" name hostlink
  ip link set "dsb${h}_$ID" master "$BR" up
  ip -n "$ns" addr add "10.232.$X.$h/24" dev hostlink
  ip -n "$ns" link set lo up
  ip -n "$ns" link set hostlink up
  if [ "$RATE" != none ] && [ "$NETEM" = 1 ]; then
    # netem's queue must hold a window of packets at this rate, or it drops them.
    ip netns exec "$ns" tc qdisc add dev hostlink root netem rate "$RATE" delay "$DELAY" \
      limit 100000
  elif [ "$RATE" != none ]; then
    ip netns exec "$ns" tc qdisc add dev hostlink root tbf rate "$RATE" burst 1mb latency 200ms
  fi
  echo "$ns slots=$PER_HOST" >>"$WORK/hostfile"
done
MASTER="10.232.$X.1"

# Bytes sent by all hosts on their links so far.
sent_between_hosts() {
  local total=0 h
  for h in $(seq "$HOSTS"); do
    total=$((total + $(ip netns exec "dscpp_h${h}_$ID" cat /sys/class/net/hostlink/statistics/tx_bytes)))
  done
  echo "$total"
}

prec=""
[ "$PREC" = bf16 ] && prec=', "bf16": {"enabled": true}'
logger=""
[ "${LOGGER:-0}" = 1 ] && logger=', "comms_logger": {"enabled": true}'
buckets=""
[ -n "${BUCKETS:-}" ] && buckets=", \"reduce_bucket_size\": $BUCKETS, \"allgather_bucket_size\": $BUCKETS"
[ -n "${ZERO:-}" ] && buckets+=", $ZERO"
# write_config VARIANT: the config of a variant (flat, hier, hier+qwz, hier+qgz, ...) to
# $WORK/VARIANT.json; +qwz and +qgz turn on zero_quantized_weights / zero_quantized_gradients,
# +hpz sets zero_hpz_partition_size to the ranks per host.
write_config() {
  local zpp=""
  case "$1" in *+qwz*) zpp+=', "zero_quantized_weights": true' ;; esac
  case "$1" in *+qgz*) zpp+=', "zero_quantized_gradients": true' ;; esac
  case "$1" in *+hpz*) zpp+=", \"zero_hpz_partition_size\": $PER_HOST" ;; esac
  cat >"$WORK/$1.json" <<JSON
{"train_batch_size": $((MB * WORLD)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $STAGE$buckets$zpp},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec$logger}
JSON
}
for t in $TRANSPORTS; do write_config "$t"; done
# The peers start from dscpp's seeded initial weights, as dscpp train does.
INIT=$WORK/init.safetensors
case " $TRANSPORTS " in *" fsdp2 "* | *" hsdp "* | *" deepspeed"*)
  echo '{"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}' >"$WORK/init.json"
  build/dscpp train --config "$WORK/init.json" --data "$DATA" --n_layer "$L" --n_head "$H" \
    --n_embd "$C" --block_size "$T" --vocab_size 256 --steps 0 --save_final "$INIT" \
    --eval_problems 0 >/dev/null ;;
esac

port=$((20000 + RANDOM % 10000))
# run VARIANT STEPS: dscpp train's output; the bytes the hosts sent go to $WORK/bytes.
run() {
  local hier=auto before
  local -a cmd
  [ "${1%%+*}" = flat ] && hier=off
  port=$((port + 1))
  case "$1" in
    fsdp2 | hsdp | deepspeed*)
      # Gloo in Python binds to the host name's address (loopback in a namespace) unless told.
      cmd=(env GLOO_SOCKET_IFNAME=hostlink "$PWD/.venv/bin/python" "$PWD/bench/peers/train_gpt.py"
        --system "${1%%+*}"
        --config "$WORK/$1.json" --data "$DATA" --init "$INIT" --n_layer "$L" --n_head "$H"
        --n_embd "$C" --block_size "$T" --steps "$2" --warmup 1) ;;
    *)
      cmd=("$PWD/build/dscpp" train --config "$WORK/$1.json" --n_layer "$L" --n_head "$H"
        --n_embd "$C" --block_size "$T" --data "$DATA" --steps "$2" --no_shuffle --eval_problems 0
        --metrics "$WORK/$1.jsonl") ;;
  esac
  before=$(sent_between_hosts)
  local rc=0
  OMP_NUM_THREADS=1 DSCPP_COMM_HIERARCHY=$hier timeout 3600 build/dscpp launch \
    --hostfile "$WORK/hostfile" --launcher ssh \
    --remote_cmd 'ip netns exec {host} env DSCPP_HOST_ID={host} {command}' \
    --master_addr "$MASTER" --master_port "$port" "${cmd[@]}" 2>&1 || rc=$?
  echo $(($(sent_between_hosts) - before)) >"$WORK/bytes"
  return "$rc"
}

echo "multihost: $HOSTS hosts x $PER_HOST ranks, links $RATE, delay $DELAY, model $MODEL" \
  "(L $L, C $C, T $T, micro-batch $MB), stage $STAGE, $PREC, $ROUNDS rounds of $STEPS steps"
declare -A tps bytes_per_step loss last failed
for round in $(seq "$ROUNDS"); do
  for t in $TRANSPORTS; do
    [ -n "${failed[$t]:-}" ] && continue
    if ! out=$(run "$t" "$STEPS"); then
      # A peer that cannot run is a row that says why; dscpp failing is an error.
      why=$(echo "$out" | grep -m1 -o 'peer failed: .*' || true)
      [ -n "$why" ] || { echo "$out" | tail -30; echo "multihost: $t failed" >&2; exit 1; }
      failed[$t]=$why
      echo "round $round $t: $why"
      continue
    fi
    long=$(cat "$WORK/bytes")
    v=$(echo "$out" | tokens_per_s || true)
    [ -n "$v" ] || { echo "$out" | tail -30; echo "multihost: no throughput line" >&2; exit 1; }
    tps[$t]="${tps[$t]:-} $v"
    # The mean loss of the last 20 steps (every variant trains on the same batches); a peer's
    # last step's.
    if [ -f "$WORK/$t.jsonl" ]; then
      loss[$t]=$(grep -o '"loss": [0-9.eE+-]*' "$WORK/$t.jsonl" | tail -20 |
        awk '{s += $2; n++} END {printf "%.4f", s / n}')
      last[$t]=$(grep -o '"loss": [0-9.eE+-]*' "$WORK/$t.jsonl" | tail -1 | awk '{printf "%.4f", $2}')
      cp "$WORK/$t.jsonl" "$WORK/$t.last.jsonl"
    else
      last[$t]=$(echo "$out" | grep -o 'step [0-9]* loss [0-9.]*' | tail -1 | awk '{print $4}')
      loss[$t]=-
    fi
    if [ "$round" = 1 ]; then
      echo "$out" | grep -m1 -E "collectives (on CPU tensors|use flat)" || true
      # LOGGER=1: rank 0's comms_logger table (its bytes sent to its own host and to others).
      [ "${LOGGER:-0}" = 1 ] && echo "$out" | grep -A12 "comms_logger summary" | grep -E "^\[rank 0\]" || true
      run "$t" "$STEPS1" >/dev/null || { echo "multihost: $t failed" >&2; exit 1; }
      bytes_per_step[$t]=$(((long - $(cat "$WORK/bytes")) / (STEPS - STEPS1)))
    fi
    echo "round $round $t: $v tokens/s"
  done
done

tokens_per_step=$((MB * WORLD * T))
base=${TRANSPORTS%% *}
printf '\n| variant | between hosts per step (MiB) | vs %s | tokens/s (median) | s/step | speed-up vs %s | mean loss, last 20 steps | vs %s | loss, last step |\n' "$base" "$base" "$base"
printf '|---|---|---|---|---|---|---|---|---|\n'
base_tps=$(median ${tps[$base]})
base_bytes=${bytes_per_step[$base]}
for t in $TRANSPORTS; do
  if [ -n "${failed[$t]:-}" ]; then
    echo "| $t | ${failed[$t]} | | | | | | | |"
    continue
  fi
  m=$(median ${tps[$t]})
  awk -v b="${bytes_per_step[$t]}" -v fb="$base_bytes" -v m="$m" -v fm="$base_tps" -v n="$tokens_per_step" -v t="$t" -v l="${loss[$t]}" -v fl="${loss[$base]}" -v e="${last[$t]}" \
    'BEGIN { d = (l == "-" || fl == "-") ? "-" : sprintf("%+.2f%%", (l / fl - 1) * 100)
             printf "| %s | %.1f | %.2f | %.0f | %.2f | %.2fx | %s | %s | %s |\n", t, b / 1048576, b / fb, m,
             n / m, m / fm, l, d, e }'
done

# PLOT=FILE.svg: the loss of every variant's last run by step, and each one's difference from
# the first variant's (the same batches at every step).
if [ -n "${PLOT:-}" ]; then
  for t in $TRANSPORTS; do
    grep -o '"step": [0-9]*, "loss": [0-9.eE+-]*' "$WORK/$t.last.jsonl" | awk '{print $2, $4}' |
      tr -d ',' >"$WORK/$t.dat"
  done
  plots="" diffs=""
  for t in $TRANSPORTS; do
    plots+="${plots:+, }'$WORK/$t.dat' using 1:2 with lines title '$t'"
    [ "$t" = "$base" ] && continue
    paste "$WORK/$t.dat" "$WORK/$base.dat" | awk '{print $1, ($2 - $4) / $4 * 100}' >"$WORK/$t.diff"
    diffs+="${diffs:+, }'$WORK/$t.diff' using 1:2 with lines title '$t'"
  done
  gnuplot <<GP
set terminal svg size 900,600
set output '$PLOT'
set multiplot layout 2,1 title "$MODEL GPT, stage $STAGE, $HOSTS hosts x $PER_HOST ranks"
set ylabel 'loss'
plot $plots
set xlabel 'step'
set ylabel 'loss vs $base (%)'
plot ${diffs:-0 notitle}
unset multiplot
GP
  echo "plot: $PLOT"
fi
