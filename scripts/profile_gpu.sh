#!/usr/bin/env bash
# Where the CUDA backend's time goes (issue 7): kernel time per step kind
# (COLI_CUDA_PROFILE=1, graphs off) for a 512-token prefill chunk and for
# decode, and the decode graph's device time against the host's step time
# (COLI_CUDA_PROFILE=graph). Expects the models scripts/bench_gpu.sh makes.
# Usage: scripts/profile_gpu.sh WORKDIR [MODEL]   (env BIN=build/bin)
set -euo pipefail
work=${1:?usage: profile_gpu.sh WORKDIR [MODEL]}
model=${2:-$work/q4.coli}
bin=${BIN:-build/bin}
echo "== prefill 512, kernel time per step (graphs off)"
COLI_CUDA_PROFILE=1 "$bin/coli-bench" --device cuda -m "$model" -p 512 -n 0 -r 1 -o tsv 2>&1 >/dev/null | grep -v '^coli-bench'
echo "== decode, kernel time per step (graphs off)"
COLI_CUDA_PROFILE=1 "$bin/coli-bench" --device cuda -m "$model" -p 0 -n 32 -r 1 -o tsv 2>&1 >/dev/null | grep -v '^coli-bench'
echo "== decode, graph replay vs host step"
COLI_CUDA_PROFILE=graph "$bin/coli-bench" --device cuda -m "$model" -p 0 -n 128 -r 1 -o tsv 2>&1 >/dev/null | grep -v '^coli-bench'
