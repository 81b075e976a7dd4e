#!/usr/bin/env bash
# coli-pin benchmarks (issue 17, docs/perf/mirror.md): host-to-device copy
# rates (pageable, cudaMallocHost, registered shared memory, a registered
# coli-pin mirror) and coli-run's wall time to the first token with the
# weights from the container (warm page cache; cold when the machine lets us
# drop it) and from a ready mirror, whole on the GPU and under a budget.
# Usage: scripts/bench_mirror.sh WORKDIR [LAYERS] [BUDGET]   (env BIN=build/bin)
set -uo pipefail
work=${1:?usage: bench_mirror.sh WORKDIR [LAYERS] [BUDGET]}
layers=${2:-8}
budget=${3:-3.3G}
bin=${BIN:-build/bin}
model="$work/q4-L$layers.coli"
mkdir -p "$work"
ulimit -l unlimited 2>/dev/null || echo "note: RLIMIT_MEMLOCK stays $(ulimit -l) KiB: coli-pin may refuse to lock"
[ -f "$model" ] || "$bin/coli-convert" synth -o "$model" --layers "$layers" --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
run=("$bin/coli-run" -m "$model" --device cuda --heat none --prompt-ids 1,2,3,4 -n 1 --temp 0)
ttft() {  # label, extra args...
  local label=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "${run[@]}" "$@" >/dev/null 2>"$work/ttft.err"
  local rc=$?
  t1=$(date +%s.%N)
  printf '%-44s %6.2f s  rc %d %s\n' "$label" "$(awk "BEGIN{print $t1 - $t0}")" "$rc" "$(grep -m1 -E 'rror' "$work/ttft.err")"
}
echo "== host-to-device copy rates"
"$bin/coli-microbench" --benchmark_filter=H2D 2>/dev/null | grep BM_
echo "== coli-run -n 1 wall time, $layers layers"
for i in 1 2; do ttft "container, warm, whole" --mirror off; done
for i in 1 2; do ttft "container, warm, --vram-budget $budget" --mirror off --vram-budget "$budget"; done
if (sync && echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then ttft "container, cold page cache, whole" --mirror off; fi
t0=$(date +%s.%N)
"$bin/coli-pin" start --model "$model" --trunk --heat none || exit 1
printf '%-44s %6.2f s\n' "coli-pin start --trunk" "$(awk "BEGIN{print $(date +%s.%N) - $t0}")"
for i in 1 2; do ttft "mirror, whole"; done
for i in 1 2; do ttft "mirror, --vram-budget $budget" --vram-budget "$budget"; done
name=$("$bin/coli-pin" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["name"])')
echo "== copy rate from the mirror ($name)"
COLI_BENCH_MIRROR=$name "$bin/coli-microbench" --benchmark_filter=H2D/2 2>/dev/null | grep BM_
"$bin/coli-pin" stop --model "$model"
