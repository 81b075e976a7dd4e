#!/usr/bin/env python3
"""Put coli-bench and llama-bench results side by side.

Usage: compare_llama_bench.py COLI_RESULTS LLAMA_RESULTS
  COLI_RESULTS   coli-bench output: TSV (default), CSV or JSONL
  LLAMA_RESULTS  llama-bench output: -o json, -o jsonl, -o csv (or md is not parsed)
Rows are matched on (n_prompt, n_gen, n_depth); prints a Markdown table with
both tokens/s and their ratio. Stdlib only.
"""
import csv, io, json, sys


def load(path):
    text = open(path, encoding="utf-8").read()
    s = text.lstrip()
    if s.startswith("["):
        return json.loads(s)
    if s.startswith("{"):
        return [json.loads(l) for l in text.splitlines() if l.strip()]
    first = text.splitlines()[0] if text else ""
    dialect = "excel-tab" if "\t" in first else "excel"
    return list(csv.DictReader(io.StringIO(text), dialect=dialect))


def key(r):
    return tuple(int(float(r.get(k) or 0)) for k in ("n_prompt", "n_gen", "n_depth"))


def name(k):
    p, g, d = k
    s = f"pp{p}" if g == 0 else f"tg{g}" if p == 0 else f"pp{p}+tg{g}"
    return s + (f" @ d{d}" if d else "")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    coli = [r for r in load(sys.argv[1]) if not r.get("error")]
    llama = load(sys.argv[2])
    by_key = {}
    for r in llama:
        by_key.setdefault(key(r), r)
    print("| test | coli model | coli t/s | llama.cpp model | llama.cpp t/s | coli / llama.cpp |")
    print("|---|---|---:|---|---:|---:|")
    for r in coli:
        k = key(r)
        c = float(r["avg_ts"])
        l = by_key.get(k)
        if l is None:
            print(f"| {name(k)} | {r.get('model_type','')} | {c:.1f} | - | - | - |")
            continue
        lt = float(l["avg_ts"])
        print(f"| {name(k)} | {r.get('model_type','')} | {c:.1f} | {l.get('model_type','')} | {lt:.1f} | {c / lt:.2f}x |")


if __name__ == "__main__":
    main()
