#!/usr/bin/env bash
# Nsight Compute views of the CUDA backend (issue 7): every kernel's duration
# in one decode step and one 512-token prefill chunk (graphs off), summed by
# kernel name, and the detailed sections of the prefill GEMM kernels.
# Usage: scripts/ncu_gpu.sh WORKDIR OUTDIR [MODEL]   (env BIN=build/bin, NCU=ncu)
set -euo pipefail
work=${1:?usage: ncu_gpu.sh WORKDIR OUTDIR [MODEL]}
out=${2:?usage: ncu_gpu.sh WORKDIR OUTDIR [MODEL]}
model=${3:-$work/q4.coli}
bin=${BIN:-build/bin}
ncu=${NCU:-ncu}
mkdir -p "$out"
sum_by_name() {  # ncu --csv rows -> "total_us calls name", largest first
  python3 -c '
import csv, sys, collections
tot = collections.defaultdict(float); n = collections.Counter()
for r in csv.DictReader(l for l in sys.stdin if l.startswith("\"")):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    name = r["Kernel Name"].split("(")[0].split("<")[0]
    tot[name] += float(r["Metric Value"].replace(",", "")) / 1000; n[name] += 1
scale = float(sys.argv[1])
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]): print(f"{v/scale:10.1f} us {n[k]/scale:6.1f}x  {k}")
print(f"{sum(tot.values())/scale:10.1f} us {sum(n.values())/scale:6.1f}x  total")
' "$1"
}
echo "== decode: kernel durations per token (4 tokens, graphs off)"
COLI_CUDA_PROFILE=1 $ncu --metrics gpu__time_duration.sum --csv "$bin/coli-bench" --device cuda -m "$model" -p 0 -n 4 -r 1 -o tsv \
  >"$out/ncu-decode.csv" 2>/dev/null || true
# The warm-up run decodes 4 tokens too: 8 in all.
sum_by_name 8 <"$out/ncu-decode.csv"
echo "== prefill 512: kernel durations per chunk"
COLI_CUDA_PROFILE=1 $ncu --metrics gpu__time_duration.sum --csv "$bin/coli-bench" --device cuda -m "$model" -p 512 -n 0 -r 1 -o tsv \
  >"$out/ncu-prefill.csv" 2>/dev/null || true
sum_by_name 2 <"$out/ncu-prefill.csv"
echo "== prefill GEMM kernels in detail"
$ncu -k regex:'mma_kernel' -c 3 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  "$bin/coli-bench" --device cuda -m "$model" -p 512 -n 0 -r 1 -o tsv >"$out/ncu-gemm.txt" 2>&1 || true
grep -E "mma_kernel|Duration|Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$out/ncu-gemm.txt" | head -80
