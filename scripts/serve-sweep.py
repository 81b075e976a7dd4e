#!/usr/bin/env python3
"""serve-sweep.py: coli-serve against hostile clients (issue 32's bad-input sweep), re-runnable.

Usage:
  BIN=build/bin scripts/serve-sweep.py [--model tests/data/tiny-qwen35moe-text]
                                       [--tokenizer tests/data/tiny-tokenizer] [--parallel 2]

Starts coli-serve on a free port (CPU backend, --parallel N, --queue 4,
--max-body 65536, -c 256) and runs each case: oversized and malformed
bodies, invalid UTF-8, wrong types and ranges, an unknown model, a prompt
longer than the context, a huge max_tokens, 1,000 simultaneous idle
connections, clients that disconnect mid-stream, a client that never
reads its stream, more requests at once than slots and queue. A case
states the status it expects; after every case the server must still
answer (GET /health) and a greedy completion must be the one it gave
before the sweep (no slot lost, no state leaked). The last check: every
slot serves at once (N concurrent completions), no request is left in
progress (/metrics), and SIGTERM ends the server with status 0.

Prints one line per case (good / bad) and a summary; exit status 1 when a
case is bad. Python standard library only.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time


def request(port, method, path, body=b"", headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, body, h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def complete(port, prompt="Once upon a time", n=8, stream=False):
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream}).encode()
    return request(port, "POST", "/v1/completions", body)


def text_of(data):
    return json.loads(data)["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tests/data/tiny-qwen35moe-text")
    ap.add_argument("--tokenizer", default="tests/data/tiny-tokenizer")
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    binary = os.path.join(os.environ.get("BIN", "build/bin"), "coli-serve")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [binary, "-m", args.model, "--tokenizer", args.tokenizer, "--device", "cpu", "--port", str(port), "--parallel", str(args.parallel),
           "--queue", "4", "--max-body", "65536", "-c", "256"]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for _ in range(600):  # 30 s: a sanitizer build starts slowly
        try:
            if request(port, "GET", "/health")[0] == 200:
                break
        except OSError:
            time.sleep(0.05)
    else:
        print("serve-sweep: coli-serve did not start", file=sys.stderr)
        server.kill()
        return 1
    baseline = text_of(complete(port)[1])
    results = []

    def case(name, expect, fn):
        t0 = time.time()
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - a case that raises is a finding
            got = f"raised {type(e).__name__}: {e}"
        alive, same = False, False
        try:
            alive = request(port, "GET", "/health", timeout=10)[0] == 200
            same = text_of(complete(port)[1]) == baseline
        except Exception:  # noqa: BLE001
            pass
        ok = got == expect and alive and same and server.poll() is None
        results.append(ok)
        note = "" if alive and same else (" server not answering" if not alive else " greedy reply changed")
        print(f"{'good' if ok else 'BAD '}  {name:58s} expected {expect!s:10s} got {got!s:10s} {time.time() - t0:5.1f} s{note}", flush=True)

    post = lambda body, path="/v1/completions": request(port, "POST", path, body)[0]  # noqa: E731
    case("body over --max-body (1 MiB)", 413, lambda: post(b'{"prompt":"' + b"a" * (1 << 20) + b'"}'))
    case("malformed JSON", 400, lambda: post(b'{"prompt": "x",'))
    case("not an object", 400, lambda: post(b'[1,2,3]'))
    case("invalid UTF-8 in the prompt", 400, lambda: post(b'{"prompt":"\xff\xfe bad","max_tokens":2}'))
    case("max_tokens a string", 400, lambda: post(b'{"prompt":"x","max_tokens":"many"}'))
    case("max_tokens 10^12", 400, lambda: post(b'{"prompt":"x","max_tokens":1000000000000}'))
    case("max_tokens 10^9 (cut to the context)", 200, lambda: post(b'{"prompt":"x","max_tokens":1000000000,"temperature":0}'))
    case("negative temperature", 400, lambda: post(b'{"prompt":"x","temperature":-1}'))
    case("temperature NaN (not JSON)", 400, lambda: post(b'{"prompt":"x","temperature":NaN}'))
    case("top_p 2", 400, lambda: post(b'{"prompt":"x","top_p":2}'))
    case("n 2", 400, lambda: post(b'{"prompt":"x","n":2}'))
    case("unknown model", 404, lambda: post(b'{"model":"gpt-17","prompt":"x"}'))
    case("messages not a list", 400, lambda: post(b'{"messages":"hi"}', "/v1/chat/completions"))
    case("a message without content", 400, lambda: post(b'{"messages":[{"role":"user"}]}', "/v1/chat/completions"))
    case("prompt longer than the context", 400, lambda: post(json.dumps({"prompt": "word " * 2000}).encode()))
    case("unknown path", 404, lambda: request(port, "GET", "/v2/everything")[0])
    case("/detokenize of ids outside the vocabulary", 400, lambda: post(b'{"tokens":[-1, 99999999]}', "/detokenize"))

    def idle_connections():
        socks = []
        for _ in range(1000):
            s = socket.socket()
            s.connect(("127.0.0.1", port))
            socks.append(s)
        status = complete(port)[0]  # served beside them
        for s in socks:
            s.close()
        return status
    case("1,000 idle connections, a request beside them", 200, idle_connections)

    def disconnects():
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port))
            body = json.dumps({"prompt": "Once", "max_tokens": 200, "temperature": 0, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            s.recv(64)
            s.close()  # mid-stream
        return 200
    case("8 clients gone mid-stream", 200, disconnects)

    def never_reads():
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps({"prompt": "Once", "max_tokens": 250, "temperature": 0, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        status = complete(port)[0]  # another slot serves meanwhile
        s.close()
        return status
    case("a stream never read, a request beside it", 200, never_reads)

    def flood():
        statuses = []
        lock = threading.Lock()

        def one():
            st = complete(port, n=30)[0]
            with lock:
                statuses.append(st)
        ts = [threading.Thread(target=one) for _ in range(args.parallel + 4 + 6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        ok = statuses.count(200) >= args.parallel + 4 and set(statuses) <= {200, 503}
        return "200/503" if ok else str(sorted(statuses))
    case(f"{args.parallel + 10} requests at once ({args.parallel} slots, queue 4)", "200/503", flood)

    # Every slot still serves: N concurrent completions, each the baseline.
    replies = [None] * args.parallel

    def slot(i):
        replies[i] = text_of(complete(port)[1])
    ts = [threading.Thread(target=slot, args=(i,)) for i in range(args.parallel)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    metrics = request(port, "GET", "/metrics")[1].decode()
    processing = [line for line in metrics.splitlines() if line.startswith("coli_requests_processing ")]
    slots_ok = all(r == baseline for r in replies) and processing == ["coli_requests_processing 0"]
    results.append(slots_ok)
    print(f"{'good' if slots_ok else 'BAD '}  every slot serves at once, none left in progress: {processing}", flush=True)
    server.terminate()
    try:
        rc = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        rc = "hang"
    stderr = server.stderr.read()
    term_ok = rc == 0 and "SIGTERM" in stderr
    results.append(term_ok)
    print(f"{'good' if term_ok else 'BAD '}  SIGTERM: exit {rc}", flush=True)
    bad = results.count(False)
    print(f"serve-sweep: {len(results)} checks, {len(results) - bad} good, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
