#!/usr/bin/env bash
# CUDA decode against context depth (issue 7's split-KV attention): tg64
# after D prefilled tokens on the 8-layer Qwen3.6-35B-A3B-shaped int4-g32
# synthetic model (scripts/bench_gpu.sh makes it), with the split-KV
# attention kernel (the default) and with the score-buffer kernel
# (COLI_CUDA_SPLIT_KV=0). Prints "depth kernel t/s" and keeps the records.
# Usage: scripts/bench_gpu_depth.sh WORKDIR [OUTDIR]   (env BIN=build/bin, DEPTHS)
set -euo pipefail
work=${1:?usage: bench_gpu_depth.sh WORKDIR [OUTDIR]}
out=${2:-$work}
bin=${BIN:-build/bin}
depths=${DEPTHS:-512,4096,16384}
[ -f "$work/q4.coli" ] || { echo "bench_gpu_depth.sh: $work/q4.coli missing: run scripts/bench_gpu.sh $work first" >&2; exit 1; }
mkdir -p "$out"
for k in split:1 scores:0; do
  COLI_CUDA_SPLIT_KV=${k#*:} "$bin/coli-bench" --device cuda -m "$work/q4.coli" -p 0 -n 64 --n-depth "$depths" -r 3 -o tsv >"$out/gpu-depth-${k%%:*}.tsv"
  awk -F'\t' -v k="${k%%:*}" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
       { printf "%6s  %-7s %8.1f t/s %s\n", $c["n_depth"], k, $c["avg_ts"], $c["error"] }' "$out/gpu-depth-${k%%:*}.tsv"
done
