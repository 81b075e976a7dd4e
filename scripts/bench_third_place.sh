#!/usr/bin/env bash
# The prefill's third place, by id against by routing (COLI_CUDA_PREFILL_ORDER),
# on 8-layer synthetic models of each family at about a quarter and half of
# their experts resident, with a coli-pin mirror (issue 31; docs/perf/families.md).
# Per (family, budget): id, routed, routed on prompts it has not seen
# (--vary-prompt), id the same, ROUNDS times alternating; then one
# COLI_CUDA_PROFILE=prefill run by routing at the first budget of each
# family (its third-place line per chunk: host experts, pairs expected and
# come, the GPU's wait, time per pair, bias).
# Usage: scripts/bench_third_place.sh WORKDIR [BIN] [ROUNDS] [FAMILIES]
#   FAMILIES: "family:budget,budget ..." (default the session-12 budgets of
#   qwen3_5_moe, qwen3_moe and qwen3_next)
# Records in WORKDIR/third-place.tsv; prints one line per run last: pp512,
# host experts a prompt, the GPU's wait, and the ratio to the upload bound
# of the run's own uploaded bytes (55 GB/s) and of every non-resident's.
set -euo pipefail
work=${1:?usage: bench_third_place.sh WORKDIR [BIN] [ROUNDS] [FAMILIES]}
bin=${2:-build/bin}
rounds=${3:-2}
families=${4:-"qwen3_5_moe:1.75G,2.7G qwen3_moe:1.2G,1.86G qwen3_next:3.1G,4.8G"}
mkdir -p "$work"
out="$work/third-place.tsv"
rm -f "$out.tmp"
for fb in $families; do
  f=${fb%%:*}
  m="$work/$f.coli"
  [ -f "$m" ] || "$bin/coli-convert" synth -o "$m" --family "$f" --layers 8 --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
  "$bin/coli-pin" start --model "$m" --heat none >/dev/null
done
bench() {  # CASE MODEL BUDGET ORDER [ARGS...]
  local c=$1 m=$2 b=$3 o=$4; shift 4
  COLI_CUDA_PREFILL_ORDER=$o "$bin/coli-bench" --device cuda -m "$m" -p 512 -n 0 -r 5 --no-swap --heat none --vram-budget "$b" -o tsv "$@" |
    awk -v c="$c" -v o="$o$*" -v r="$round" 'NR == 1 { print "case\torder\tround\t" $0; next } { print c "\t" o "\t" r "\t" $0 }' >>"$out.tmp"
}
for round in $(seq 1 "$rounds"); do
  for fb in $families; do
    f=${fb%%:*}
    budgets=${fb#*:}
    for one in ${budgets//,/ }; do
      bench "$f-$one" "$work/$f.coli" "$one" id
      bench "$f-$one" "$work/$f.coli" "$one" routed
      bench "$f-$one" "$work/$f.coli" "$one" routed --vary-prompt
      bench "$f-$one" "$work/$f.coli" "$one" id --vary-prompt
    done
  done
done
for fb in $families; do
  f=${fb%%:*}
  b=${fb#*:}
  echo "## $f ${b%%,*} routed" >&2
  COLI_CUDA_PROFILE=prefill COLI_CUDA_PREFILL_ORDER=routed "$bin/coli-bench" --device cuda -m "$work/$f.coli" -p 512 -n 0 -r 3 --no-swap --heat none \
    --vram-budget "${b%%,*}" -o tsv 2>&1 >/dev/null | grep -E "third place|copies busy" >&2 || true
done
# One header, then the records.
awk 'NR == 1 || $1 != "case"' "$out.tmp" >"$out" && rm -f "$out.tmp"
python3 - "$out" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1]), delimiter='\t'):
    if not r.get('avg_ts'):
        print(r['case'], r['order'], r['round'], 'error:', r.get('error', ''))
        continue
    ts, pb = float(r['avg_ts']), float(r['pcie_bytes_per_token'] or 0)
    up, cpu = float(r['prompt_experts_uploaded'] or 0), float(r['prompt_experts_cpu'] or 0)
    allb = pb * (up + cpu) / up if up else pb  # every non-resident uploaded
    own = ts / (55e9 / pb) if pb else 0
    every = ts / (55e9 / allb) if allb else 0
    print(f"{r['case']:18} {r['order']:22} {r['round']:>2} pp512 {ts:8.0f}  host experts {cpu:6.1f}  wait {float(r['t_wait_ms'] or 0):5.2f} ms  ratio own {own:.3f} every {every:.3f}")
PY
