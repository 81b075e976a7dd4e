#!/usr/bin/env bash
# CPU backend benchmark (issue 6): tg128 and pp512 on the 8-layer
# Qwen3.6-35B-A3B-shaped synthetic model, int4-g32 everywhere (4.5 bits per
# weight, Q4_0's size), int4-g64 and int8, plus the machine's read bandwidth
# and the GEMV kernels' bandwidth.
# Usage: scripts/bench_cpu.sh WORKDIR [THREADS] [OUTDIR]   (env BIN=build/bin)
set -euo pipefail
work=${1:?usage: bench_cpu.sh WORKDIR [THREADS] [OUTDIR]}
threads=${2:-$(nproc)}
out=${3:-$work}
bin=${BIN:-build/bin}
mkdir -p "$work" "$out"
[ -d "$work/synth8" ] || "$bin/coli-convert" synth -o "$work/synth8" --layers 8 --seed 0 >/dev/null
[ -f "$work/q4.coli" ] || "$bin/coli-convert" "$work/synth8" -o "$work/q4.coli" --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
[ -f "$work/q4g64.coli" ] || "$bin/coli-convert" "$work/synth8" -o "$work/q4g64.coli" --experts int4-g64 --trunk int4-g64 --lm-head int4-g64 >/dev/null
[ -f "$work/q8.coli" ] || "$bin/coli-convert" "$work/synth8" -o "$work/q8.coli" --experts int8 --trunk int8 --lm-head int8 >/dev/null
"$bin/coli-bench" --device cpu -m "$work/q4.coli,$work/q4g64.coli,$work/q8.coli" -p 512 -n 128 -r 3 -t "$threads" -o tsv | tee "$out/cpu-bench.tsv" |
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
              { printf "%-14s %-8s t=%-3s %10.1f t/s  %8.1f MB/token  trunk %.0f ms, experts %.0f ms, lm_head %.0f ms %s\n",
                $c["model_type"], $c["test"], $c["n_threads"], $c["avg_ts"], $c["bytes_read_per_token"] / 1e6,
                $c["t_trunk_ms"], $c["t_cpu_experts_ms"], $c["t_lm_head_ms"], $c["error"] }'
if [ -x "$bin/coli-microbench" ]; then
  "$bin/coli-microbench" --benchmark_filter="Read|Gemv/.*/$threads/" --benchmark_format=console 2>/dev/null | tee "$out/microbench.txt" | grep -E "Read|Gemv"
fi
