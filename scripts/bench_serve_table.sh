#!/usr/bin/env bash
# Issue 32's concurrency table in one run: coli-serve on the 8-layer
# synthetic model (int4-g32, a coli-pin mirror, the Qwen3 tokenizer of
# tests/data) with --parallel 16, whole GPU and at each budget, with the
# rows step on and off (COLI_CUDA_ROWS), loaded by scripts/bench_serve.py
# with 1, 4 and 16 streaming clients (docs/perf/serve.md).
# Usage: scripts/bench_serve_table.sh WORKDIR [BIN]
#   env BUDGETS="whole 1.75G 3.3G"  ROWS="1 0"  CLIENTS=1,4,16  REQUESTS=2  TOKENS=128  PARALLEL=16
# Rows in WORKDIR/serve.tsv (config columns, then bench_serve.py's); prints the table last.
set -euo pipefail
work=${1:?usage: bench_serve_table.sh WORKDIR [BIN]}
bin=${2:-build/bin}
here=$(cd "$(dirname "$0")" && pwd)
budgets=${BUDGETS:-"whole 1.75G 3.3G"}
rows_modes=${ROWS:-"1 0"}
clients=${CLIENTS:-1,4,16}
requests=${REQUESTS:-2}
tokens=${TOKENS:-128}
parallel=${PARALLEL:-16}
port=${PORT:-18431}
mkdir -p "$work"
m="$work/q4.coli"
[ -f "$m" ] || "$bin/coli-convert" synth -o "$m" --layers 8 --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
"$bin/coli-pin" start --model "$m" --heat none >/dev/null
out="$work/serve.tsv"
: >"$out"
for b in $budgets; do
  for rows in $rows_modes; do
    budget=()
    [ "$b" = whole ] || budget=(--vram-budget "$b" --no-swap)
    COLI_CUDA_ROWS=$rows "$bin/coli-serve" -m "$m" --tokenizer "$here/../tests/data/qwen3-tokenizer" --port "$port" --device cuda \
      --parallel "$parallel" -c 4096 "${budget[@]}" 2>"$work/serve-$b-$rows.log" &
    pid=$!
    python3 - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(600):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1).status == 200: sys.exit(0)
    except Exception: pass
    time.sleep(0.2)
sys.exit("coli-serve did not come up")
PY
    python3 "$here/bench_serve.py" --url "http://127.0.0.1:$port" --clients "$clients" --requests "$requests" --max-tokens "$tokens" --prompt-words 32 |
      awk -v b="$b" -v r="$rows" -v p="$parallel" -v hdr="$([ -s "$out" ] && echo 1 || echo 0)" \
        'NR == 1 { if (!hdr) print "budget\trows_step\tparallel\t" $0; next } { print b "\t" r "\t" p "\t" $0 }' >>"$out"
    kill "$pid"
    wait "$pid" || true
  done
done
python3 - "$out" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
one = {}
for r in rows:
    if r['clients'] == '1': one[(r['budget'], r['rows_step'])] = float(r['agg_tok_s'])
print(f"{'budget':6} {'rows':>4} {'clients':>7} {'agg tok/s':>9} {'x one':>6} {'ttft p50/p99 ms':>16} {'itl p50/p99 ms':>15}")
for r in rows:
    x = float(r['agg_tok_s']) / one.get((r['budget'], r['rows_step']), float('nan'))
    print(f"{r['budget']:6} {r['rows_step']:>4} {r['clients']:>7} {float(r['agg_tok_s']):9.1f} {x:6.2f} "
          f"{float(r['ttft_p50_ms']):7.0f}/{float(r['ttft_p99_ms']):<8.0f} {float(r['itl_p50_ms']):6.1f}/{float(r['itl_p99_ms']):<8.1f}")
PY
