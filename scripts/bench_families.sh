#!/usr/bin/env bash
# Issue 31's acceptance table in one run: 8-layer synthetic models of each
# family (4.5 bits a weight, coli-pin mirror), whole GPU and at about a
# quarter and half of the experts resident, pp512 and tg128, each with its
# ratio to its bound (docs/perf/families.md):
#   pp512: the run's expert uploads over PCIe (pcie_bytes_per_token x 512
#          at PCIE_GBS, default 55);
#   tg128: the whole GPU's token plus the slower of the misses' two paths,
#          which run at once: the host's expert bytes a token
#          (host_bytes_per_token) at HOST_GBS (default 95, the H200
#          machine's measured read bandwidth) and the GPU's reads of the
#          others over PCIe (pcie_bytes_per_token) at PCIE_GBS. (Until
#          session 21 the host's bytes alone: written when every miss was
#          the host's; column "host only".)
# Usage: scripts/bench_families.sh WORKDIR [BIN] [ROUNDS]
#   env FAMILIES ("family:budget,budget ..."), PP (prompt length, default
#   512; 0 runs the decode rows alone, for more rounds in one call).
# Records in WORKDIR/families.tsv; prints the table last.
set -euo pipefail
work=${1:?usage: bench_families.sh WORKDIR [BIN] [ROUNDS]}
bin=${2:-build/bin}
rounds=${3:-2}
pp=${PP:-512}
families=${FAMILIES:-"qwen3_5_moe:1.75G,2.7G qwen3_moe:1.2G,1.86G qwen3_next:3.1G,4.8G"}
mkdir -p "$work"
out="$work/families.tsv"
rm -f "$out.tmp"
for fb in $families; do
  f=${fb%%:*}
  m="$work/$f.coli"
  [ -f "$m" ] || "$bin/coli-convert" synth -o "$m" --family "$f" --layers 8 --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
  "$bin/coli-pin" start --model "$m" --heat none >/dev/null
done
bench() {  # FAMILY BUDGET(whole: none) ARGS...
  local f=$1 b=$2; shift 2
  local budget=(--vram-budget "$b")
  [ "$b" = whole ] && budget=()
  "$bin/coli-bench" --device cuda -m "$work/$f.coli" --no-swap --heat none "${budget[@]}" -o tsv "$@" |
    awk -v f="$f" -v b="$b" -v r="$round" 'NR == 1 { print "family\tbudget\tround\t" $0; next } { print f "\t" b "\t" r "\t" $0 }' >>"$out.tmp"
}
for round in $(seq 1 "$rounds"); do
  for fb in $families; do
    f=${fb%%:*}
    budgets=${fb#*:}
    bench "$f" whole -p "$pp" -n 128 -r 2
    for one in ${budgets//,/ }; do
      [ "$pp" = 0 ] || bench "$f" "$one" -p "$pp" -n 0 -r 4
      bench "$f" "$one" -p 0 -n 128 -r 2
    done
  done
done
awk 'NR == 1 || $1 != "family"' "$out.tmp" >"$out" && rm -f "$out.tmp"
PCIE_GBS=${PCIE_GBS:-55} HOST_GBS=${HOST_GBS:-95} python3 - "$out" <<'PY'
import csv, os, sys
pcie, host = float(os.environ['PCIE_GBS']) * 1e9, float(os.environ['HOST_GBS']) * 1e9
rows = [r for r in csv.DictReader(open(sys.argv[1]), delimiter='\t') if r.get('avg_ts')]
whole_tg = {}
for r in rows:
    if r['budget'] == 'whole' and r['test'].startswith('tg'):
        whole_tg.setdefault(r['family'], []).append(float(r['avg_ts']))
print(f"{'family':12} {'budget':6} {'round':>5} {'test':6} {'tok/s':>9} {'bound':>9} {'ratio':>6} {'host only':>9}")
for r in rows:
    ts, bound, host_only = float(r['avg_ts']), 0.0, ''
    if r['budget'] != 'whole' and r['test'].startswith('pp') and float(r['pcie_bytes_per_token'] or 0) > 0:
        bound = pcie / float(r['pcie_bytes_per_token'])
    elif r['budget'] != 'whole' and r['test'].startswith('tg') and whole_tg.get(r['family']):
        serial = 1 / max(whole_tg[r['family']])
        h, p = float(r['host_bytes_per_token'] or 0) / host, float(r['pcie_bytes_per_token'] or 0) / pcie
        bound = 1 / (serial + max(h, p))
        host_only = f"{ts * (serial + h):9.3f}"
    ratio = f"{ts / bound:6.3f}" if bound else ''
    print(f"{r['family']:12} {r['budget']:6} {r['round']:>5} {r['test']:6} {ts:9.0f} {bound:9.0f} {ratio:>6} {host_only:>9}")
PY
