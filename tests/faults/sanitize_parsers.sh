#!/usr/bin/env bash
# Builds dscpp's parsers of untrusted bytes (the DeepSpeed config and its JSON reader, the
# checkpoint manifest, the safetensors header: none needs libtorch) with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer, into two programs (tests/faults/parsers_fuzz.cpp):
#   OUT/parsers_replay   generated configs and given files through the parsers
#   OUT/parsers_fuzzer   the same entry point under libFuzzer
# The fault suite (tests/faults/fault_suite.py, cases fuzz_configs and libfuzzer) runs them.
# Usage: sanitize_parsers.sh OUT     (needs clang-14 and libclang-rt-14-dev: scripts/setup.sh)
set -euo pipefail
OUT=${1:?usage: sanitize_parsers.sh OUT}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${DSCPP_SANITIZE_CXX:-clang++-14}
command -v "$CXX" >/dev/null || {
  echo "sanitize_parsers: $CXX not found. HINT: apt-get install clang-14 libclang-rt-14-dev" \
    "(scripts/setup.sh installs them)" >&2
  exit 2
}
command -v ccache >/dev/null && CXX="ccache $CXX"
mkdir -p "$OUT/obj"
OUT=$(cd "$OUT" && pwd)

# The parsers and what they call: a new dependency of these files shows up as a link error here.
SOURCES=(src/config/config.cpp src/config/json_reader.cpp src/config/keys.cpp
  src/config/key_verdicts.cpp src/config/batch.cpp src/config/elasticity.cpp src/checkpoint/manifest.cpp src/io/safetensors_header.cpp src/util/strings.cpp src/util/log.cpp)
FLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -I"$ROOT/include" -I"$ROOT/src"
  -fsanitize=address,undefined -fno-sanitize-recover=all)

# A small ninja file: parallel and incremental builds for free.
{
  echo "cxx = $CXX"
  echo "flags = ${FLAGS[*]}"
  echo "libs = -lspdlog -lfmt -pthread"
  echo "rule cc"
  echo "  command = \$cxx \$flags \$extra -MD -MF \$out.d -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "rule link"
  echo "  command = \$cxx \$flags \$extra \$in \$libs -o \$out"
  objects=()
  for s in "${SOURCES[@]}"; do
    o="obj/$(basename "${s%.cpp}").o"
    # Coverage for libFuzzer's search; it does not change what the code does.
    echo "build $o: cc $ROOT/$s"
    echo "  extra = -fsanitize=fuzzer-no-link"
    objects+=("$o")
  done
  echo "build obj/replay.o: cc $ROOT/tests/faults/parsers_fuzz.cpp"
  echo "  extra = -fsanitize=fuzzer-no-link"
  echo "build obj/fuzzer.o: cc $ROOT/tests/faults/parsers_fuzz.cpp"
  echo "  extra = -fsanitize=fuzzer-no-link -DDSCPP_LIBFUZZER"
  echo "build parsers_replay: link ${objects[*]} obj/replay.o"
  echo "build parsers_fuzzer: link ${objects[*]} obj/fuzzer.o"
  echo "  extra = -fsanitize=fuzzer"
} >"$OUT/build.ninja.new"
mv "$OUT/build.ninja.new" "$OUT/build.ninja"
ninja -C "$OUT" -j2 --quiet
echo "sanitize_parsers: built $OUT/parsers_replay and $OUT/parsers_fuzzer"
