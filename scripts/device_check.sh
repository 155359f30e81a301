#!/usr/bin/env bash
# Builds dscpp against a PyTorch 2.x wheel's libtorch (CUDA) and checks it on a GPU:
# `dscpp train --device cuda` in fp32/bf16/fp16 at ZeRO stages 0-3 (one GPU, so one rank),
# comparing the stages' losses; a checkpoint saved on the GPU and resumed, against the same run
# uninterrupted; offload to host memory bit for bit against training in GPU memory, and the
# seeds' headline (a 1.5B GPT on a GPU capped at 24 GB: stage 0 refused, stage 3 with the
# optimizer and the parameters in host memory training, with its step time, the GPU's idle
# fraction and the copies' bandwidth); then the test suite. Not part of CI (CI has no GPU).
#   scripts/device_check.sh [DEPS_PREFIX]
# The wheel's python3 must be on PATH. DEPS_PREFIX holds the other dependencies' headers and
# libraries (usr/include, usr/lib/x86_64-linux-gnu) where the machine has no package manager;
# scripts/device_kit.sh fills .devkit/debs with Debian's packages of them, which this script
# unpacks into DEPS_PREFIX. Writes logs under $OUT (default /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
D=${1:-/tmp/deps}; mkdir -p "$D"
for f in .devkit/debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$D"; done
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMP_NUM_THREADS=1
B=/tmp/b
el configure
# The dependencies' headers with -I (a prefix of their own, not /usr/include). Only log.cpp sees
# spdlog (NOTE [two fmts] in src/util/log.h).
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCPP_BUILD_BENCH=OFF -DDSCPP_CUDA=ON \
  -DDSCPP_PYTHON="$(command -v python3)" \
  -DCMAKE_PREFIX_PATH="$TP;$D/usr;$D/usr/lib/x86_64-linux-gnu/cmake" \
  -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON -DCMAKE_CXX_FLAGS="-I$D/usr/include" 2>&1 | grep -E "dscpp|Error|error"
el build
timeout 300 cmake --build $B -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" -- -k 0 > "$OUT/build.txt" 2>&1; echo "build rc=$?"
grep -E "error|FAILED" "$OUT/build.txt" | head -40
el "cuda train runs"
C=/tmp/cfg; mkdir -p $C
for prec in fp32 bf16 fp16; do for st in 0 1 2 3; do
  p=""; [ $prec = bf16 ] && p=', "bf16": {"enabled": true}'
  [ $prec = fp16 ] && p=', "fp16": {"enabled": true, "initial_scale_power": 12}'
  echo "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 8, \"steps_per_print\": 50, \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": $st, \"overlap_comm\": true, \"reduce_bucket_size\": 20000}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3}}$p}" > $C/$prec$st.json
  timeout 60 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $C/$prec$st.json \
    --steps 150 --no_shuffle --eval_problems 200 --metrics $C/$prec$st.jsonl 2>&1 |
    grep -E "error|Error|held-out|throughput|skipped|peak" | sed "s/^/$prec s$st: /"
done; done
el "cuda save and resume"
# The same run uninterrupted (A), and stopped at step 30 then resumed from its checkpoint (B).
for cfg in fp32s2 bf16s3; do
  f=$C/${cfg%s?}${cfg: -1}.json
  timeout 60 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $f --steps 60 \
    --no_shuffle --metrics $C/$cfg.A.jsonl 2>&1 | grep -E "error|Error"
  timeout 60 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $f --steps 30 \
    --no_shuffle --save_dir $C/ck$cfg --metrics $C/$cfg.B.jsonl 2>&1 | grep -E "error|Error"
  timeout 60 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $f --steps 60 \
    --no_shuffle --save_dir $C/ck$cfg --resume --metrics $C/$cfg.B.jsonl 2>&1 |
    grep -E "error|Error|resum|trained again" | sed "s/^/$cfg resume: /"
done
python3 - <<'PY'
import json
for cfg in ['fp32s2', 'bf16s3']:
    try:
        a = [json.loads(l)['loss'] for l in open(f'/tmp/cfg/{cfg}.A.jsonl')]
        b = [json.loads(l)['loss'] for l in open(f'/tmp/cfg/{cfg}.B.jsonl')]
        print(cfg, 'resumed at 30 vs uninterrupted:', len(a), len(b), 'steps;',
              'bit-identical' if a == b else f'differ, max abs {max(abs(x - y) for x, y in zip(a, b))}')
    except Exception as e: print(cfg, 'no metrics', e)
PY
python3 - <<'PY'
import json
L = {}
for prec in ['fp32', 'bf16', 'fp16']:
    for st in [0, 1, 2, 3]:
        try: L[prec, st] = [json.loads(l)['loss'] for l in open(f'/tmp/cfg/{prec}{st}.jsonl')]
        except Exception as e: print(prec, st, 'no metrics', e)
for prec in ['fp32', 'bf16', 'fp16']:
    for st in [1, 2, 3]:
        if (prec, 0) in L and (prec, st) in L:
            a, b = L[prec, 0], L[prec, st]
            print(prec, 'stage', st, 'vs 0: max rel diff over', len(a), 'steps', max(abs(x - y) / abs(x) for x, y in zip(a, b)))
    if (prec, 0) in L and ('fp32', 0) in L:
        a, b = L['fp32', 0], L[prec, 0]
        print(prec, 'vs fp32 at steps 1,10,50,150:', [(round(a[i], 4), round(b[i], 4)) for i in (0, 9, 49, 149) if i < len(a)])
PY
el "offload to host memory: equivalence on the GPU"
# ZeRO-Offload on the GPU (docs/offload.md): stage 3 bf16 with the optimizer and the parameters
# in host memory against the same run in GPU memory, and stage 2 fp32 with the optimizer there;
# the losses must be bit-identical.
for run in "bf16 3 both" "fp32 2 optimizer"; do
  set -- $run
  p=""; [ $1 = bf16 ] && p=', "bf16": {"enabled": true}'
  off='"offload_optimizer": {"device": "cpu", "pin_memory": true}'
  [ $3 = both ] && off="$off"', "offload_param": {"device": "cpu", "pin_memory": true}'
  base="\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 8, \"steps_per_print\": 50, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3}}$p"
  echo "{$base, \"zero_optimization\": {\"stage\": $2, \"sub_group_size\": 20000}}" > $C/off_ref.json
  echo "{$base, \"zero_optimization\": {\"stage\": $2, \"sub_group_size\": 20000, $off}}" > $C/off_cpu.json
  for v in ref cpu; do
    timeout 90 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $C/off_$v.json \
      --steps 60 --no_shuffle --eval_problems 0 --metrics $C/off_$v.jsonl 2>&1 | grep -E "error|Error"
  done
  python3 -c "
import json
a = [json.loads(l)['loss'] for l in open('$C/off_ref.jsonl')]
b = [json.loads(l)['loss'] for l in open('$C/off_cpu.jsonl')]
print('$1 stage $2, $3 in host memory vs in GPU memory:', len(a), len(b), 'steps;',
      'bit-identical' if a == b and a else 'DIFFER')" 2>&1
done
el "offload to host memory: the seeds' headline, a 1.5B GPT on a 24 GB GPU"
# GPT-XL-shaped (48 x 1600, vocabulary 50257, T 1024, micro-batch 1, bf16), the GPU capped at
# 24e9 bytes (DSCPP_GPU_MEMORY_LIMIT: the pre-flight budget and the caching allocator's cap).
# Stage 0 must be refused by the pre-flight check; stage 3 with the optimizer and the parameters
# in host memory must train with a falling loss. nvidia-smi samples the GPU's utilisation.
# The project's own docs as uint16 tokens (one per byte), so the vocabulary can be GPT-2's size.
cat docs/*.md README.md > $C/text.txt
python3 -c "import array; array.array('H', list(open('$C/text.txt', 'rb').read())).tofile(open('$C/text.bin', 'wb'))"
python3 - <<'PY'
import torch, time
x = torch.empty(1 << 28, dtype=torch.bfloat16).pin_memory(); d = torch.empty_like(x, device='cuda')
for direction in ('host-to-device', 'device-to-host'):
    torch.cuda.synchronize(); t = time.time()
    for _ in range(5):
        (d.copy_(x, non_blocking=True) if direction == 'host-to-device' else x.copy_(d, non_blocking=True))
    torch.cuda.synchronize(); print(f'pinned {direction} copies (torch): {5 * x.numel() * 2 / (time.time() - t) / 1e9:.1f} GB/s')
PY
XL="--n_layer 48 --n_embd 1600 --n_head 25 --vocab_size 50257 --block_size 1024 --data $C/text.bin --eval_problems 0"
xl_cfg() {  # stage, zero extras
  echo "{\"train_batch_size\": 1, \"steps_per_print\": 1, \"wall_clock_breakdown\": true, \"bf16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}, \"zero_optimization\": {\"stage\": $1$2}}"
}
export DSCPP_GPU_MEMORY_LIMIT=24000000000
xl_cfg 0 "" > $C/xl0.json
timeout 120 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $C/xl0.json $XL --steps 5 2>&1 |
  grep -E "error" | cut -c1-400 | sed "s/^/xl stage 0: /"
xl_cfg 3 ', "sub_group_size": 100000000, "stage3_max_reuse_distance": 0, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu", "pin_memory": true}' > $C/xl3.json
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 200 > $OUT/xl_util.csv 2>/dev/null &
SMI=$!
timeout 300 $B/dscpp launch --num_procs 1 $B/dscpp train --device cuda --config $C/xl3.json $XL --steps 8 \
  --metrics $C/xl3.jsonl > $OUT/xl3.log 2>&1; echo "xl stage 3 offloaded: rc=$?"
kill $SMI 2>/dev/null
unset DSCPP_GPU_MEMORY_LIMIT
grep -E "error|pre-flight|offload_param|offload_optimizer" $OUT/xl3.log | cut -c1-300 | head -8
grep -E "^.*step [0-9]+ \|" $OUT/xl3.log | tail -2 | cut -c1-900
python3 - "$OUT" <<'PY'
import json, sys, datetime, re
out = sys.argv[1]
try:
    m = [json.loads(l) for l in open('/tmp/cfg/xl3.jsonl')]
    print('xl stage 3 losses:', [round(x['loss'], 3) for x in m], 'falling' if m and m[-1]['loss'] < m[0]['loss'] else 'NOT falling')
    print('xl stage 3 step times (s):', [round(1 / x['samples_per_s'], 2) for x in m if x['samples_per_s'] > 0])
    # The GPU's idle fraction between the first and the last step line (utilisation samples).
    stamps = [datetime.datetime.strptime(re.match(r'\[([^\]]+)\]', l).group(1), '%Y-%m-%d %H:%M:%S.%f')
              for l in open(out + '/xl3.log') if re.match(r'\[[^\]]+\].*step \d+ \|', l)]
    util = []
    for l in open(out + '/xl_util.csv'):
        t, u = l.strip().split(', ')
        t = datetime.datetime.strptime(t, '%Y/%m/%d %H:%M:%S.%f')
        if len(stamps) > 1 and stamps[0] <= t <= stamps[-1]: util.append(float(u))
    if util: print(f'xl stage 3: GPU busy {sum(util) / len(util):.1f}% of {len(util)} samples between the first and last step line (idle {100 - sum(util) / len(util):.1f}%)')
except Exception as e: print('xl stage 3: no metrics', e)
PY
el ctest
timeout 170 ctest --test-dir $B -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --timeout 120 -E "multinode|netns|OpenMpi" > "$OUT/ctest.txt" 2>&1
grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest.txt" | head -40
el done
