#!/usr/bin/env python3
"""Speculative decoding's predicted speed from measured costs (issue 33).

Reads coli-bench TSV records of one model with the tests
  tgN, tgN x2 .. x(K+1)   (--n-verify 1,2,..: a verify step of k tokens)
  tgN draftK               (--draft K: greedy generation with K drafts a round)
per configuration (vram_budget_mb), and prints per configuration:
  - the verify cost of k tokens relative to one token,
  - the MTP layer's cost per drafted row and the round's other cost
    (sampling, rewind, bookkeeping), from the draft records,
  - the measured speed at the synthetic model's acceptance, and
  - the speed predicted at acceptance a = 0.6, 0.75, 0.9:
    E(a, N) = (1 - a^(N+1)) / (1 - a) tokens a round, over
    verify(N + 1) + N * mtp_row + other.

Usage: scripts/mtp_predict.py FILE.tsv [FILE.tsv ...]   (stdlib only)
"""
import csv, re, sys
from collections import defaultdict


def rows_of(paths):
    for p in paths:
        with open(p, newline="") as f:
            for r in csv.DictReader(f, delimiter="\t"):
                if r.get("error"):
                    continue
                yield r


def main(paths):
    cfg = defaultdict(dict)
    for r in rows_of(paths):
        b = r.get("vram_budget_mb") or "0"
        key = r.get("backends", "") + (", whole" if b in ("", "0") else f", {b} MiB budget")
        name = r["test"]
        cfg[key][name] = r
    for key, tests in cfg.items():
        base = next((r for n, r in tests.items() if re.fullmatch(r"tg\d+", n)), None)
        if not base:
            continue
        t1 = 1.0 / float(base["avg_ts"])
        verify = {1: t1}
        for n, r in tests.items():
            m = re.fullmatch(r"tg\d+ x(\d+)", n)
            if m:
                verify[int(m.group(1))] = 1.0 / float(r["avg_ts"])
        print(f"## {key}: one token {1e3 * t1:.3f} ms ({1 / t1:.1f} tok/s)")
        print("verify of k tokens vs 1: " + ", ".join(f"{k}: {verify[k] / t1:.2f}x" for k in sorted(verify)))
        for n, r in sorted(tests.items()):
            m = re.fullmatch(r"tg(\d+) draft(\d+)", n)
            if not m:
                continue
            gen, N = int(m.group(1)), int(m.group(2))
            if N + 1 not in verify:
                print(f"{n}: no verify record of {N + 1} tokens")
                continue
            tps = float(r["draft_tokens_per_step"]) or 1.0
            rounds = gen / tps
            per_round = tps / float(r["avg_ts"])
            mtp_row = float(r["t_mtp_ms"]) / 1e3 / (rounds * N)
            other = max(0.0, per_round - verify[N + 1] - N * mtp_row)
            cells = []
            for a in (0.6, 0.75, 0.9):
                e = (1 - a ** (N + 1)) / (1 - a)
                s = e / (verify[N + 1] + N * mtp_row + other)
                cells.append(f"a={a}: {s:.1f} ({s * t1:.2f}x)")
            print(f"draft {N}: measured {float(r['avg_ts']):.1f} tok/s at acceptance {float(r['draft_accept_rate']):.2f} "
                  f"({tps:.2f} tokens a round); MTP row {1e3 * mtp_row:.3f} ms, other {1e3 * other:.3f} ms a round; predicted " + "; ".join(cells))
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
