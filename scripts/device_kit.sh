#!/usr/bin/env bash
# Downloads Debian's packages of dscpp's non-torch dependencies into .devkit/debs (ignored by
# git), for scripts/device_check.sh on a machine with no package manager of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devkit/debs && cd .devkit/debs
apt-get download nlohmann-json3-dev libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 \
  libgtest-dev libgmock-dev liburing-dev liburing2 libgloo-dev libgloo0
