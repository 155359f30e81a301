#!/usr/bin/env bash
# Installs into the project's virtual environment (.venv, made by scripts/setup.sh with the pinned
# torch) what a user would pick instead of dscpp today, for bench/peers.sh: PyTorch's own DDP,
# torch.compile and FSDP2 come with that torch; this adds DeepSpeed, pinned to the newest release
# on the package index that installs and runs here (2026-12-03: 0.19.8). Its C++ ops are built
# by DeepSpeed itself the first time a run needs them (its CPU Adam, a minute on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEEPSPEED_VERSION=0.19.8
[ -x .venv/bin/python ] || scripts/setup.sh dscpp_cli
# DeepSpeed's offload to nvme (bench/seed_tables.sh, table C) builds its async_io op against libaio
if ! dpkg-query -W -f='${Status}' libaio-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "peers: installing libaio-dev (DeepSpeed's async_io, for its offload to nvme)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libaio-dev >/dev/null
fi
if ! .venv/bin/python -c "import deepspeed, sys; sys.exit(deepspeed.__version__ != '$DEEPSPEED_VERSION')" 2>/dev/null; then
  echo "peers: installing deepspeed==$DEEPSPEED_VERSION into .venv"
  DS_BUILD_OPS=0 .venv/bin/pip install --quiet --disable-pip-version-check \
    wheel "deepspeed==$DEEPSPEED_VERSION"
fi
.venv/bin/python - <<'PY'
import torch, deepspeed
print("peers: torch %s, deepspeed %s" % (torch.__version__, deepspeed.__version__))
PY
