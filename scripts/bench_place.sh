#!/usr/bin/env bash
# coli-place's predictions against measurements (issue 19, docs/perf/place.md):
# a routing-skewed model, its heat recorded by a first benchmark run, this
# machine probed, then at each VRAM budget a plan (coli-place --explain) and
# the measured tg128 and pp512 of coli-bench following it (experts from a
# coli-pin mirror), with the error of each prediction. Prints one table last.
# Usage: scripts/bench_place.sh WORKDIR [LAYERS] [BUDGETS] [PCIE_READ]   (env BIN=build/bin)
#   BUDGETS: space-separated --vram-budget values (default "6G 8G 10G 12G 16G")
#   PCIE_READ: --pcie-read of both the plan and the runs (default auto: on with the mirror)
set -uo pipefail
work=${1:?usage: bench_place.sh WORKDIR [LAYERS] [BUDGETS]}
layers=${2:-40}
budgets=${3:-6G 8G 10G 12G 16G}
pcie=${4:-auto}
bin=${BIN:-build/bin}
model="$work/q4-L$layers-skew.coli"
export XDG_CACHE_HOME="$work/cache"  # this run's heat and rates only
mkdir -p "$work" "$XDG_CACHE_HOME"
[ -f "$model" ] || "$bin/coli-convert" synth -o "$model" --layers "$layers" --seed 1 --routing-skew 1.0 \
  --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null || exit 1
# Heat: a first run records the routing of 2 x (512 + 128) tokens (from
# the container: the mirror below is not up yet).
"$bin/coli-bench" -m "$model" -p 512 -n 128 -r 1 --no-warmup --vram-budget 16G >/dev/null 2>&1
"$bin/coli-place" heat -m "$model" | awk 'NR > 1 { n += $3 } END { print "heat: " n " routings recorded" }'
"$bin/coli-place" probe -m "$model" --seconds 2 -o "$work/rates.txt" || exit 1
# The experts in a locked shared-memory mirror (coli-pin), as a hybrid
# setup runs: prefill uploads copy from it at the pinned rate the probe
# measured (from the container's pageable mapping they go through a
# bounce buffer at a fraction of it).
ulimit -l unlimited 2>/dev/null || echo "note: RLIMIT_MEMLOCK stays $(ulimit -l) KiB: coli-pin may refuse to lock"
"$bin/coli-pin" start --model "$model" --heat none || exit 1
trap '"$bin/coli-pin" stop --model "$model" >/dev/null 2>&1' EXIT
ctx=641  # coli-bench's context for pp512 + tg128
rows=()
for b in $budgets; do
  plan="$work/plan-$b.txt"
  "$bin/coli-place" -m "$model" --vram "$b" --rates "$work/rates.txt" --ctx $ctx --chunks 512 --prefill-upload --pcie-read "$pcie" -o "$plan" --explain \
    > "$work/explain-$b.txt" || exit 1
  pred_tg=$(awk '/^decode:/ { print $2 }' "$work/explain-$b.txt")
  pred_pp=$(awk '/^prefill/ { print $3 }' "$work/explain-$b.txt")
  # The GPU's pairs: VRAM hits and PCIe reads (tier_hit_rate counts both).
  pred_hit=$(awk '/^hit rate:/ { h = $3 } /^PCIe reads:/ { r = $3 } END { print h + r }' "$work/explain-$b.txt")
  "$bin/coli-bench" -m "$model" --plan "$plan" --vram-budget "$b" -p 512 -n 128 -r 3 --no-swap --prefill-upload --pcie-read "$pcie" --heat none \
    > "$work/bench-$b.tsv" 2>"$work/bench-$b.err"
  read -r meas_pp meas_tg meas_hit < <(python3 - "$work/bench-$b.tsv" <<'PY'
import csv, sys
pp = tg = hit = "nan"
for r in csv.DictReader(open(sys.argv[1]), delimiter="\t"):
    if r.get("error"): continue
    if r["n_prompt"] == "512": pp = r["avg_ts"]
    if r["n_gen"] == "128": tg, hit = r["avg_ts"], r["tier_hit_rate"]
print(pp, tg, hit)
PY
)
  rows+=("$(awk -v b="$b" -v pt="$pred_tg" -v mt="$meas_tg" -v pp="$pred_pp" -v mp="$meas_pp" -v ph="$pred_hit" -v mh="$meas_hit" 'BEGIN {
    printf "%-6s %9.1f %9.1f %+7.1f%% %9.0f %9.0f %+7.1f%% %6.3f %6.3f", b, pt, mt, 100 * (pt - mt) / mt, pp, mp, 100 * (pp - mp) / mp, ph, mh }')")
done
echo "budget  tg128 pred  measured   error  pp512 pred  measured   error  GPU pairs pred  measured   (--pcie-read $pcie)"
printf '%s\n' "${rows[@]}"
