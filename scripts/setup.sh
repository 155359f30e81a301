#!/usr/bin/env bash
# Installs what dscpp needs, then configures and builds into ./build: the targets given as
# arguments (scripts/main.sh builds only the dscpp command), else everything, tests included.
# Run as root, or as a user with sudo.
#   1. Debian 12's packages that are missing (compilers, the non-torch libraries, tools).
#   2. A project-local virtual environment, .venv (ignored by git), holding the pinned PyTorch
#      wheel: its libtorch (with CUDA and NCCL) is the libtorch dscpp builds against, and its
#      python runs the golden reference and the peers in bench/.
#   3. CMake against that libtorch (torch.utils.cmake_prefix_path), CUDA required: a machine
#      without the CUDA toolkit stops here with the reason, it never builds a CPU-only dscpp
#      instead. DSCPP_CMAKE_ARGS adds configure options (e.g. -DDSCPP_CUDA=OFF for a machine
#      without the toolkit, which then says so in every build's configure output).
set -euo pipefail
cd "$(dirname "$0")/.."

# NOTE [pinned torch]: the newest PyTorch on the package index on 2026-12-03, checked to install
# and pass the suite here. Its default Linux wheel is built with CUDA 13 (libtorch_cuda, NCCL);
# the CPU-only wheels live on download.pytorch.org, which these machines do not reach.
TORCH_VERSION=2.15.0

packages=(
  cmake ninja-build g++ ccache pkg-config
  python3 python3-venv              # the virtual environment that holds the PyTorch wheel
  libgloo-dev                       # c10d's ProcessGroupGloo.hpp includes gloo headers the wheel lacks
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev liburing-dev
  libgtest-dev libbenchmark-dev
  openmpi-bin iproute2 procps       # mpirun launcher; ip netns for the two-host test; ps/pgrep
  protobuf-compiler libprotobuf-dev # TensorBoard event files (the tensorboard monitor)
  gnuplot-nox                       # dscpp plot
  zlib1g-dev                        # the plot test reads its PNG back
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

# Debian's interpreter, not whichever python3 is first on PATH: the venv must not depend on a
# user's pyenv or conda.
venv=.venv
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION into $venv (about 3 GB with its CUDA libraries)"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check \
    "torch==$TORCH_VERSION" numpy
fi
torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DDSCPP_PYTHON="$PWD/$venv/bin/python" \
    -DDSCPP_CUDA=ON ${DSCPP_CMAKE_ARGS:-}
fi
ninja -C build -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" "$@"  # nproc obeys OMP_NUM_THREADS
