#!/usr/bin/env python3
"""Aggregate decode throughput of `hearth serve` (or any OpenAI-compatible
server) with N concurrent streams, and the time to first token of a short
request sent during a long prefill. Used by bench/batching.sh.

  python3 bench/batching.py --base http://127.0.0.1:PORT/v1 --streams 1,4,8 --tokens 64
  python3 bench/batching.py --base ... --ttft-during-prefill 3000

Throughput: N streams start together (a barrier), each asks for --tokens
tokens of a long code answer at T=0; per stream the client records the
arrival of the first and the last token. Aggregate decode tok/s =
sum(tokens - 1) / (last token of all - first token of the last stream to
start), i.e. the rate while all streams decode (the prefill is excluded).
"""
import argparse
import json
import threading
import time

import openai

PROMPTS = [
    "Write a Python module that implements a binary search tree with insert, delete, search and in-order traversal. Include docstrings.",
    "Write a Python class for an LRU cache with get and put, and a small test suite for it.",
    "Write a Python script that parses a CSV file of sales records and prints totals per region and per month.",
    "Write a Python implementation of Dijkstra's shortest path algorithm with a priority queue, with comments.",
    "Write a Python command-line tool that counts words, lines and characters in files, like wc.",
    "Write a Python function that validates email addresses and a set of unit tests for it.",
    "Write a Python module for a simple bank account system with deposits, withdrawals and transfers.",
    "Write a Python program that solves Sudoku puzzles with backtracking, with comments.",
]


def stream(client, model, i, tokens, barrier, out):
    barrier.wait()
    t0 = time.monotonic()
    first = last = None
    n = 0
    s = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        max_tokens=tokens, temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in s:
        now = time.monotonic()
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or now
            last = now
        if chunk.usage:
            n = chunk.usage.completion_tokens
    out[i] = (t0, first, last, n)


def throughput(client, model, n_streams, tokens):
    out = [None] * n_streams
    barrier = threading.Barrier(n_streams)
    ts = [threading.Thread(target=stream, args=(client, model, i, tokens, barrier, out)) for i in range(n_streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    start = max(o[1] for o in out)
    end = max(o[2] for o in out)
    toks = sum(o[3] - 1 for o in out)
    short = [o[3] for o in out if o[3] < tokens]
    return toks / (end - start), sum(o[3] for o in out), short


def ttft_during_prefill(client, model, n_lines):
    long_prompt = "Summarize this log:\n" + "".join(
        f"2026-12-01 10:{i // 60:02d}:{i % 60:02d} worker-{i % 7} processed batch {i} in {i % 13 + 1} ms\n"
        for i in range(n_lines))
    res = {}

    def long_one():
        t = time.monotonic()
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": long_prompt}],
                                           max_tokens=1, temperature=0)
        res["long_s"] = time.monotonic() - t
        res["long_tokens"] = r.usage.prompt_tokens

    th = threading.Thread(target=long_one)
    th.start()
    time.sleep(0.5)
    t = time.monotonic()
    s = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=2, temperature=0, stream=True)
    for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            res.setdefault("short_ttft_s", time.monotonic() - t)
    th.join()
    return res


def shared_prefix_ttft(client, model, prompt_tokens):
    """Cold TTFT of a ~prompt_tokens prompt in session A, then TTFT of
    session B whose prompt differs only in its last ~50 tokens."""
    body = "".join(f"def helper_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(prompt_tokens // 16))

    def ttft(session, tail):
        t = time.monotonic()
        s = client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": "You review Python code.\n" + body},
                                   {"role": "user", "content": tail}],
            max_tokens=2, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"session_id": session})
        first = None
        usage = None
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.monotonic() - t
            if chunk.usage:
                usage = chunk.usage
        return first, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens

    cold = ttft("prefix-a", "Which helper returns the largest value for x = 3? Answer with its name only, "
                            "and explain nothing else at all please.")
    warm = ttft("prefix-b", "Name one helper whose result is odd for x = 1. Answer with the name only, "
                            "nothing else, and be quick about it.")
    return {"cold_ttft_s": cold[0], "cold_prompt": cold[1], "shared_ttft_s": warm[0], "shared_prompt": warm[1],
            "shared_cached": warm[2], "ratio": warm[0] / cold[0]}


def save_restore(base, model, client, prompt_tokens, reps=1):
    """Prefill a ~prompt_tokens session, then time POST save and restore,
    `reps` times (each save writes the file anew); best and median totals."""
    import urllib.request
    body = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i % 97}\n" for i in range(prompt_tokens * 16 // 19 // 16))
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": body + "Summarize."}],
                                       max_tokens=4, temperature=0, extra_body={"session_id": "big"})
    root = base[:-3] if base.endswith("/v1") else base

    def post(path):
        t = time.monotonic()
        req = urllib.request.Request(root + path, data=b"{}", headers={"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req))
        return time.monotonic() - t, out

    runs = []
    for _ in range(reps):
        save_s, saved = post("/v1/sessions/big/save")
        restore_s, restored = post("/v1/sessions/big/restore")
        runs.append((save_s, restore_s))
    totals = sorted(a + b for a, b in runs)
    return {"prompt_tokens": r.usage.prompt_tokens, "runs": [[round(a, 3), round(b, 3)] for a, b in runs],
            "best_total_s": round(totals[0], 3), "median_total_s": round(totals[len(totals) // 2], 3),
            "file_bytes": saved.get("bytes"), "restored_tokens": restored.get("tokens")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", default="bench")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ttft-during-prefill", type=int, default=0, metavar="LINES")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS")
    ap.add_argument("--save-restore", type=int, default=0, metavar="TOKENS")
    ap.add_argument("--reps", type=int, default=1, help="save/restore repetitions")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base, api_key="unused", max_retries=0, timeout=3600)
    # Warm-up (page in the weights).
    client.chat.completions.create(model=a.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    results = {}
    for n in [int(x) for x in a.streams.split(",") if x]:
        rate, total, short = throughput(client, a.model, n, a.tokens)
        results[n] = rate
        note = f" ({len(short)} streams ended early: {short})" if short else ""
        print(f"{a.label}streams={n} aggregate_decode_tok_s={rate:.2f} tokens={total}{note}", flush=True)
    if 1 in results:
        for n, r in results.items():
            if n != 1:
                print(f"{a.label}streams={n} vs 1: {r / results[1]:.2f}x")
    if a.ttft_during_prefill:
        r = ttft_during_prefill(client, a.model, a.ttft_during_prefill)
        print(f"{a.label}ttft_during_prefill {json.dumps(r)}")
    if a.shared_prefix:
        print(f"{a.label}shared_prefix {json.dumps(shared_prefix_ttft(client, a.model, a.shared_prefix))}")
    if a.save_restore:
        print(f"{a.label}save_restore {json.dumps(save_restore(a.base, a.model, client, a.save_restore, a.reps))}")


if __name__ == "__main__":
    main()
