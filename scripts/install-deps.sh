#!/usr/bin/env bash
# Installs the Debian 12 packages coli builds with (run as root or via sudo).
# CUDA is optional: the build uses nvcc when /usr/local/cuda/bin/nvcc or an
# nvcc on PATH exists, and builds a CPU-only toolkit otherwise.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
  g++ make ca-certificates \
  libboost-program-options-dev libboost-dev \
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev libxxhash-dev libbenchmark-dev \
  libgtest-dev \
  clang libclang-rt-14-dev
# The real-client test of coli-serve (ColiServe.TheOpenaiNodeClientTalksToIt):
# node and the official openai npm package in tests/node. Without a network
# the test skips and says why; nothing else needs them.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -q --no-install-recommends nodejs npm || echo "install-deps: nodejs/npm not installed: the openai client test will skip" >&2
fi
if command -v npm >/dev/null 2>&1; then
  (cd "$(dirname "$0")/../tests/node" && npm install --no-audit --no-fund --loglevel=error) ||
    echo "install-deps: npm install in tests/node failed: the openai client test will skip" >&2
fi
