#!/usr/bin/env bash
# Builds dscpp against a PyTorch 2.x wheel's libtorch (CUDA) and checks it on a GPU:
# `dscpp train --device cuda` in fp32/bf16/fp16 at ZeRO stages 0-3 (one GPU, so one rank),
# comparing the stages' losses; a checkpoint saved on the GPU and resumed, against the same run
# uninterrupted; then the test suite. Not part of CI (CI has no GPU).
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
el ctest
timeout 170 ctest --test-dir $B -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --timeout 120 -E "multinode|netns|OpenMpi" > "$OUT/ctest.txt" 2>&1
grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest.txt" | head -40
el done
