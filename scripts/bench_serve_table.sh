#!/usr/bin/env bash
# Issue 32's concurrency table in one run: coli-serve on the 8-layer
# synthetic model (int4-g32, a coli-pin mirror, the Qwen3 tokenizer of
# tests/data) with --parallel 16, whole GPU and at each budget, with the
# rows step on and off (COLI_CUDA_ROWS), loaded by scripts/bench_serve.py
# with 1, 4 and 16 streaming clients (docs/perf/serve.md).
# Usage: scripts/bench_serve_table.sh WORKDIR [BIN]
#   env BUDGETS="whole 1.75G 3.3G"  ROWS="1 0"  CLIENTS=1,4,16  REQUESTS=2  TOKENS=128  PARALLEL=16
#       DEVICE=cuda  MODEL=WORKDIR/q4.coli (made when missing)  TOKENIZER=tests/data/qwen3-tokenizer
#       SERVE_ARGS="..." (more coli-serve flags, e.g. "-t 12"; logged with each phase line)
#       SERVE_PREFIX / CLIENT_PREFIX="..." (a command before coli-serve / the load, e.g. "taskset -c 0-11")
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
m=${MODEL:-$work/q4.coli}
device=${DEVICE:-cuda}
[ -f "$m" ] || "$bin/coli-convert" synth -o "$m" --layers 8 --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
"$bin/coli-pin" start --model "$m" --heat none >/dev/null
out="$work/serve.tsv"
: >"$out"
: >"$work/phases.txt"
rm -f "$work"/metrics-*.prev
for b in $budgets; do
  for rows in $rows_modes; do
    budget=()
    [ "$b" = whole ] || budget=(--vram-budget "$b" --no-swap)
    COLI_CUDA_ROWS=$rows ${SERVE_PREFIX:-} "$bin/coli-serve" -m "$m" --tokenizer "${TOKENIZER:-$here/../tests/data/qwen3-tokenizer}" --port "$port" --device "$device" \
      --parallel "$parallel" -c 4096 "${budget[@]}" ${SERVE_ARGS:-} 2>"$work/serve-$b-$rows.log" &
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
    for c in ${clients//,/ }; do
      ${CLIENT_PREFIX:-} python3 "$here/bench_serve.py" --url "http://127.0.0.1:$port" --clients "$c" --requests "$requests" --max-tokens "$tokens" --prompt-words 32 |
        awk -v b="$b" -v r="$rows" -v p="$parallel" -v hdr="$([ -s "$out" ] && echo 1 || echo 0)" \
          'NR == 1 { if (!hdr) print "budget\trows_step\tparallel\t" $0; next } { print b "\t" r "\t" p "\t" $0 }' >>"$out"
      # The scheduler's seconds by phase over this load (the counters' growth): where a step's time goes.
      python3 - "$port" "$work/metrics-$b-$rows.prev" "$b rows=$rows clients=$c${SERVE_ARGS:+ ($SERVE_ARGS)}" <<'PY' >>"$work/phases.txt"
import re, sys, time, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
now = {}
for m in re.finditer(r'^(coli_scheduler_seconds_total\{phase="(\w+)"\}|coli_decode_steps_total|coli_generated_tokens_total) (\S+)$', text, re.M):
    now[m.group(2) or m.group(1)] = float(m.group(3))
now["wall"] = time.time()
try:
    prev = dict(l.split() for l in open(sys.argv[2]))
except OSError:
    prev = {}
d = {k: v - float(prev.get(k, 0)) for k, v in now.items()}
open(sys.argv[2], "w").write("".join(f"{k} {v}\n" for k, v in now.items()))
steps = max(d.get("coli_decode_steps_total", 0), 1)
print(f"{sys.argv[3]}: {int(d.get('coli_decode_steps_total', 0))} steps, {d.get('coli_generated_tokens_total', 0) / steps:.1f} rows a step; ms a step: "
      + ", ".join(f"{k} {1000 * d.get(k, 0) / steps:.2f}" for k in ("decode_forward", "decode_sample", "prompt", "admit"))
      + (f"; wall {1000 * d['wall'] / steps:.2f}" if prev else ""))
PY
    done
    kill "$pid"
    wait "$pid" || true
  done
done
cat "$work/phases.txt"
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
