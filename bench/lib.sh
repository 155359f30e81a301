# Shell functions the bench scripts share; source it from the repository root (`. bench/lib.sh`).

# median V1 V2 ...: the median of the numbers given (the mean of the middle two for an even
# count).
median() {
  printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}

# gpt_shape NAME: sets L H C T MB (layers, heads, width, sequence length, micro-batch per rank) of
# the two GPTs every comparison runs: bench (the benchmark GPT, 6 x 384, 10.8M parameters) and
# 150m (12 x 1024, 151.7M parameters).
gpt_shape() {
  case "$1" in
    bench) L=6 H=6 C=384 T=256 MB=4 ;;
    150m) L=12 H=16 C=1024 T=256 MB=1 ;;
    *) echo "unknown model '$1': bench or 150m" >&2; return 2 ;;
  esac
}

# mean_rank_rss: the mean of the ranks' peak RSS, MiB, from the "rank R: peak RSS M MiB" line each
# rank prints last (dscpp train and the Python peers alike) on stdin; not the progress lines' or
# set-up's "peak RSS so far".
mean_rank_rss() {
  grep -oE 'rank [0-9]+: peak RSS [0-9.]+' | awk '{s += $5; n++} END {if (n) printf "%.0f", s / n}'
}

# tokens_per_s [FILE]: X of a run's "throughput: X tokens/s" line (dscpp train and the Python
# peers alike), from FILE or stdin; nothing when the run printed none.
tokens_per_s() { grep -o 'throughput: [0-9.]*' "$@" 2>/dev/null | awk '{print $2}'; }

# The side-by-side runs of bench/peers.sh and bench/autocast_bench.sh: the same GPT, initial
# weights, data and DeepSpeed config file for dscpp and each peer (bench/peers/train_gpt.py),
# 2 ranks. They read the caller's L H C T MB (gpt_shape), OUT, DATA, INIT, STEPS and PY, and
# advance its `port`.

# peer_config PREC STAGE: writes and prints the config file every system of a row reads (PREC:
# fp32, bf16, or autocast for torch_autocast in bf16).
peer_config() {
  local f=$OUT/ds_$1_s$2.json prec=""
  [ "$1" = bf16 ] && prec=', "bf16": {"enabled": true}'
  [ "$1" = autocast ] && prec=', "torch_autocast": {"enabled": true, "dtype": "bfloat16"}'
  cat >"$f" <<JSON
{"train_batch_size": $((MB * 2)), "train_micro_batch_size_per_gpu": $MB, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $2},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}}$prec}
JSON
  echo "$f"
}

# peer_run SYSTEM CONFIG LOG: one run of dscpp or a peer with CONFIG, its output in LOG (a
# failure is in the log, for the table's row, not the script's exit status).
peer_run() {
  if [ "$1" = dscpp ]; then
    build/dscpp launch --num_procs 2 --master_port $((port++)) build/dscpp train --config "$2" \
      --data "$DATA" --init "$INIT" --n_layer $L --n_head $H --n_embd $C --block_size $T \
      --steps "$STEPS" --no_shuffle --eval_problems 0 >"$3" 2>&1 || true
  else
    timeout 1800 build/dscpp launch --num_procs 2 --master_port $((port++)) $PY \
      bench/peers/train_gpt.py --system "$1" --config "$2" --data "$DATA" --init "$INIT" \
      --n_layer $L --n_head $H --n_embd $C --block_size $T --steps "$STEPS" >"$3" 2>&1 || true
  fi
}

# peer_loss LOG: the loss at step STEPS (dscpp's and the peers' lines alike); peer_why LOG: the
# error a failed run printed.
peer_loss() { grep -oE "step $STEPS(/$STEPS \|)? loss [0-9.]*" "$1" 2>/dev/null | awk '{print $NF}' | tail -1; }
peer_why() { grep -oE 'peer failed: .*|[A-Za-z]*Error: .*' "$1" 2>/dev/null | head -1 | cut -c1-160; }
