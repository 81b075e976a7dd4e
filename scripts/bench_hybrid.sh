#!/usr/bin/env bash
# Hybrid decode benchmark (issue 16): the 8-layer Qwen3.6-35B-A3B-shaped
# synthetic model at int4-g32 everywhere (Q4_0's size class), whole on the
# GPU and under VRAM budgets that hold fewer experts (the rest computed on
# the CPU at the same time). One coli-bench record per budget, then one
# coli-run line per budget saying how many experts were resident.
# Usage: scripts/bench_hybrid.sh WORKDIR [OUTDIR] [BUDGETS]   (env BIN=build/bin, LAYERS=8)
set -euo pipefail
work=${1:?usage: bench_hybrid.sh WORKDIR [OUTDIR] [BUDGETS]}
out=${2:-$work}
budgets=${3:-2G,2.5G,3G,3.5G,4G,5G}
bin=${BIN:-build/bin}
layers=${LAYERS:-8}
mkdir -p "$work" "$out"
model="$work/q4-L$layers.coli"
[ -f "$model" ] || "$bin/coli-convert" synth -o "$model" --layers "$layers" --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
for b in ${budgets//,/ }; do
  "$bin/coli-run" -m "$model" --device cuda --vram-budget "$b" --prompt-ids 1,2,3,4 -n 32 --temp 0 --ignore-eos 2>&1 >/dev/null | grep -E "expert tier|error|coli-run:" | sed "s/^/budget $b: /" || true
done | tee "$out/hybrid-residency.txt"
"$bin/coli-bench" --device cuda -m "$model" -p 512 -n 128 -r 3 -o tsv | tee "$out/hybrid-bench-whole.tsv" >/dev/null
"$bin/coli-bench" --device cuda -m "$model" -p 512 -n 128 -r 3 --vram-budget "$budgets" -o tsv | tee "$out/hybrid-bench.tsv" >/dev/null
cat "$out/hybrid-bench-whole.tsv" <(tail -n +2 "$out/hybrid-bench.tsv") |
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
              { printf "%-8s budget %8s MiB  %10.1f t/s  hit %6s  peak %8s MiB  cpu-experts %8s ms  wait %8s ms  host %8s MB/tok %s\n",
                $c["test"], $c["vram_budget_mb"], $c["avg_ts"], $c["tier_hit_rate"], $c["peak_vram_mb"], $c["t_cpu_experts_ms"], $c["t_wait_ms"],
                $c["host_bytes_per_token"] / 1e6, $c["error"] }'
