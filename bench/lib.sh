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
