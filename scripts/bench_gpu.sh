#!/usr/bin/env bash
# CUDA backend benchmark (issue 7): tg128 and pp512 on the 8-layer
# Qwen3.6-35B-A3B-shaped synthetic model, whole model on the GPU, int4-g32
# everywhere (Q4_0's 4.5 bits per weight) and int8 (Q8_0's size class).
# Usage: scripts/bench_gpu.sh WORKDIR [OUTDIR]   (env BIN=build/bin)
set -euo pipefail
work=${1:?usage: bench_gpu.sh WORKDIR [OUTDIR]}
out=${2:-$work}
bin=${BIN:-build/bin}
mkdir -p "$work" "$out"
[ -d "$work/synth8" ] || "$bin/coli-convert" synth -o "$work/synth8" --layers 8 --seed 0 >/dev/null
[ -f "$work/q4.coli" ] || "$bin/coli-convert" "$work/synth8" -o "$work/q4.coli" --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
[ -f "$work/q8.coli" ] || "$bin/coli-convert" "$work/synth8" -o "$work/q8.coli" --experts int8 --trunk int8 --lm-head int8 >/dev/null
"$bin/coli-bench" --device cuda -m "$work/q4.coli,$work/q8.coli" -p 512 -n 128 -r 3 -o tsv | tee "$out/gpu-bench.tsv" |
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
              { printf "%-14s %-8s %-6s %10.1f t/s  %8.1f MB/token %s\n",
                $c["model_type"], $c["test"], $c["backends"], $c["avg_ts"], $c["bytes_read_per_token"] / 1e6, $c["error"] }'
