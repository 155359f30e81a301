#!/usr/bin/env bash
# The step-time model (`dscpp estimate --net_gbit`, NOTE [step-time model]) against the runs
# bench/multihost.sh measured across simulated hosts, and its table at 8 to 1,024 hosts.
#   bench/step_time_model.sh            prints both tables (markdown), from build/dscpp
# The scaling table assumes hosts of 8 ranks, each rank 4 cores of this machine (4 x 90 = 360
# GFLOP/s, as measured at 4 ranks on its 2 cores), links of 10 Gbit/s with 0.2 ms per message
# (and, for the 150M GPT, 1 Gbit/s with 1 ms):
# the 150M GPT in fp32 at micro-batch 4 (T 256) and a 6.6B GPT (32 x 4096, 32 heads, the shape
# of LLaMA-7B; vocabulary 32000, T 2048) in bf16 at micro-batch 1.
# Each row below is one measured variant: the model, the layout, the config, the variant as the
# estimate names it, the compute floor (the same training with the links unshaped, s/step) and
# the measured s/step at 1 Gbit/s; the estimate predicts the latter from the former. The
# measurements are docs/benchmarks.md's ("A step-time model across hosts"); rerun
# bench/multihost.sh (the commands there) to refresh them.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

# predict MODEL HOSTS PER_HOST CONFIG VARIANT COMPUTE: the estimate's s/step for VARIANT.
predict() {
  gpt_shape "$1"
  build/dscpp estimate --model gpt --n_layer "$L" --n_head "$H" --n_embd "$C" --block_size "$T" \
    --num_procs $(($2 * $3)) --num_nodes "$2" --config "$4" --net_gbit 1 --compute_s "$6" |
    awk -F' [|] ' -v v="$5" '$1 == "| " v {print $4}'
}

reuse0='"stage3_max_reuse_distance": 0'
printf '| model | hosts x ranks | stage | variant | compute floor (s) | measured (s) | predicted (s) | error |\n'
printf '|---|---|---|---|---|---|---|---|\n'
while IFS=';' read -r model hosts per stage zero variant floor measured; do
  [ -z "$model" ] && continue
  config="{\"train_micro_batch_size_per_gpu\": $( [ "$model" = bench ] && echo 4 || echo 1), \"zero_optimization\": {\"stage\": $stage${zero:+, $zero}}}"
  p=$(predict "$model" "$hosts" "$per" "$config" "stage $stage, $variant" "$floor")
  [ -n "$p" ] || { echo "no prediction for $model $variant" >&2; exit 1; }
  awk -v m="$model" -v h="$hosts" -v r="$per" -v s="$stage" -v z="${zero:+, reuse 0}" -v v="$variant" \
    -v f="$floor" -v x="$measured" -v p="$p" \
    'BEGIN { printf "| %s | %d x %d | %d%s | %s | %.2f | %.2f | %.2f | %+.0f%% |\n", m, h, r, s, z, v, f, x, p, (p / x - 1) * 100 }'
done <<ROWS
bench;2;2;2;;flat;1.35;1.60
bench;2;2;2;;hierarchy;1.35;1.56
bench;4;2;2;;flat;2.60;3.18
bench;4;2;2;;hierarchy;2.60;2.95
150m;2;2;2;;flat;5.43;12.96
150m;2;2;2;;hierarchy;5.43;11.45
bench;2;2;3;$reuse0;flat;1.38;1.44
bench;2;2;3;$reuse0;hierarchy;1.38;1.45
bench;2;2;3;$reuse0;hierarchy + hpZ;1.36;1.41
bench;2;2;3;$reuse0;hierarchy + qwZ;1.38;1.39
bench;4;2;3;;hierarchy;2.76;2.76
bench;4;2;3;;hierarchy + qwZ + qgZ;2.76;2.50
150m;2;2;3;;hierarchy;5.77;8.03
150m;2;2;3;;hierarchy + qwZ + qgZ;5.77;5.82
ROWS

for m in "150M GPT, fp32, 10 Gbit/s;--n_layer 12 --n_embd 1024 --n_head 16 --block_size 256;{\"train_micro_batch_size_per_gpu\": 4};10;0.2" \
         "150M GPT, fp32, 1 Gbit/s;--n_layer 12 --n_embd 1024 --n_head 16 --block_size 256;{\"train_micro_batch_size_per_gpu\": 4};1;1" \
         "6.6B GPT, bf16, 10 Gbit/s;--n_layer 32 --n_embd 4096 --n_head 32 --block_size 2048 --vocab_size 32000;{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}};10;0.2"; do
  IFS=';' read -r name shape config gbit latency <<<"$m"
  printf '\n%s, %s ms:\n\n' "$name" "$latency"
  # shellcheck disable=SC2086
  build/dscpp estimate --model gpt $shape --num_procs 16 --num_nodes 2 --config "$config" \
    --net_gbit "$gbit" --net_latency_ms "$latency" --rank_gflops 360 \
    --scaling 8,32,128,512,1024 | sed -n '/^scaling/,$p' | grep '^|'
done
