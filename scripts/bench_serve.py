#!/usr/bin/env python3
"""Load a running coli-serve (or any OpenAI-compatible server) with streaming clients.

Usage:
  bench_serve.py --url http://127.0.0.1:8080 [--clients 1,4,16] [--requests 4]
                 [--max-tokens 128] [--prompt-words 64] [--api-key KEY]
  bench_serve.py --url ... --reuse 1000,8000     second-turn TTFT after a
                                                  first turn of N prompt words

Concurrency mode: for each client count C, C threads each send --requests
streaming completions back to back (temperature 0, ignore nothing) and
time every server-sent event. One TSV row per C on stdout:
  clients  requests  gen_tokens  seconds  agg_tok_s  ttft_p50_ms  ttft_p99_ms  itl_p50_ms  itl_p99_ms
gen_tokens is the servers' completion_tokens (the last chunk's usage); the
inter-token latency is the gap between content events of one stream.

Reuse mode: per N, a first request of an N-word prompt (max_tokens 1), then
the same prompt extended by a sentence; the row gives both TTFTs and the
second request's cached / computed prompt tokens (usage, timings).

Python standard library only (http.client, threads). Logs on stderr.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def stream_completion(url, key, prompt, max_tokens):
    """One streaming completion: (ttft_s, [inter-token gaps], usage dict, timings dict)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    # TTFT: the first chunk with text; a reply whose only token has no text
    # of its own (a special id, part of a UTF-8 character) counts its first chunk.
    ttft, last, gaps, usage, timings, first = None, None, [], {}, {}, None
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                conn.close()
                return (ttft if ttft is not None else first), gaps, usage, timings
            j = json.loads(data)
            if first is None:
                first = time.perf_counter() - t0
            if j.get("usage"):
                usage, timings = j["usage"], j.get("timings", {})
            if j.get("choices") and j["choices"][0].get("text"):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
    conn.close()
    return (ttft if ttft is not None else first), gaps, usage, timings


def words(n, seed=0):
    base = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    return " ".join(base[(i * 7 + seed) % len(base)] for i in range(n))


def concurrency(args):
    print("clients\trequests\tgen_tokens\tseconds\tagg_tok_s\tttft_p50_ms\tttft_p99_ms\titl_p50_ms\titl_p99_ms")
    for c in [int(x) for x in args.clients.split(",")]:
        ttfts, gaps, tokens, errors = [], [], [0], []
        lock = threading.Lock()

        def client(i):
            for r in range(args.requests):
                try:
                    t, g, usage, _ = stream_completion(args.url, args.api_key, words(args.prompt_words, seed=i * 31 + r), args.max_tokens)
                except Exception as e:  # noqa: BLE001 - reported, the others go on
                    with lock:
                        errors.append(str(e))
                    continue
                with lock:
                    if t is not None:
                        ttfts.append(t)
                    gaps.extend(g)
                    tokens[0] += usage.get("completion_tokens", 0)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(c)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
        if errors:
            print(f"bench_serve: {len(errors)} failed requests at {c} clients, first: {errors[0]}", file=sys.stderr)
        ms = lambda v: f"{1000 * v:.1f}"  # noqa: E731
        print(f"{c}\t{c * args.requests - len(errors)}\t{tokens[0]}\t{secs:.2f}\t{tokens[0] / secs:.1f}\t{ms(percentile(ttfts, 50))}\t"
              f"{ms(percentile(ttfts, 99))}\t{ms(percentile(gaps, 50))}\t{ms(percentile(gaps, 99))}", flush=True)


def reuse(args):
    print("history_words\tfirst_ttft_ms\tsecond_ttft_ms\tsecond_cached\tsecond_computed")
    for n in [int(x) for x in args.reuse.split(",")]:
        first = words(n) + "\n"
        t1, _, _, _ = stream_completion(args.url, args.api_key, first, 1)
        t2, _, usage, timings = stream_completion(args.url, args.api_key, first + "and then the story went on", 8)
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        print(f"{n}\t{1000 * t1:.1f}\t{1000 * t2:.1f}\t{cached}\t{timings.get('prompt_n', '')}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--reuse", default="")
    args = ap.parse_args()
    if args.reuse:
        reuse(args)
    else:
        concurrency(args)


if __name__ == "__main__":
    main()
