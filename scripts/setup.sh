#!/usr/bin/env bash
# Installs what dscpp needs from Debian 12's archive (only the packages that are missing),
# then configures and builds into ./build: the targets given as arguments (scripts/main.sh builds
# only the dscpp command), else everything, tests included. Run as root, or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ ccache pkg-config
  libtorch-dev libgloo-dev          # libtorch and the c10d/Gloo headers it needs
  libopenblas0-openmp               # without it libtorch uses reference BLAS (~16x slower matmul)
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev liburing-dev
  libgtest-dev libbenchmark-dev
  openmpi-bin iproute2 procps       # mpirun launcher; ip netns for the two-host test; ps/pgrep
  protobuf-compiler libprotobuf-dev # TensorBoard event files (the tensorboard monitor)
  gnuplot-nox                       # dscpp plot
  python3-torch python3-numpy       # tests/golden/gpt_reference.py, the PyTorch golden reference
  clang-14 libclang-rt-14-dev       # the parsers under ASan, UBSan and libFuzzer (tests/faults)
  e2fsprogs mount                   # the fault suite's small ext4 file system for nvme_path
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${DSCPP_CMAKE_ARGS:-}
fi
ninja -C build -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" "$@"  # nproc obeys OMP_NUM_THREADS
