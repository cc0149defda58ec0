#!/usr/bin/env python3
"""Aggregate decode speed of N concurrent streams against a running
`hearth serve` (standard library only: the GPU machine has no openai SDK).
Each stream is its own session with its own prompt, T=0, `max_tokens`
tokens (`ignore_eos`, which llama-server also takes: every stream runs to
max_tokens; a warm-up round first). Aggregate decode tok/s: every stream's
tokens after its first, over the span from the earliest first token to the
last stream's end; per stream: its tokens after the first over its time
after the first. Prints one JSON line per N.

Usage: batching_gpu.py PORT MODEL_ID N[,N...] [MAX_TOKENS]
"""
import json
import sys
import threading

from sse import stream_chat

PORT, MODEL = int(sys.argv[1]), sys.argv[2]
NS = [int(n) for n in sys.argv[3].split(",")]
MAX_TOKENS = int(sys.argv[4]) if len(sys.argv) > 4 else 128
URL = f"http://127.0.0.1:{PORT}/v1/chat/completions"


def stream(i, tag, out):
    body = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "session_id": f"{tag}-{i}", "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Stream {i}: tell a long story about the number {i * 7 + 3}."}]}
    t0, first, end, usage, chunks = stream_chat(URL, body)
    usage = usage["completion_tokens"] if usage else None
    out[i] = (t0, first or end, end, usage if usage is not None else chunks)


for n in NS:
    for warm in (True, False):
        out = [None] * n
        threads = [threading.Thread(target=stream, args=(i, f"n{n}{'w' if warm else ''}", out)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if warm:
            continue
        starts = [o[1] for o in out]
        ends = [o[2] for o in out]
        decode_tokens = sum(max(o[3] - 1, 0) for o in out)
        span = max(ends) - min(starts)
        per_stream = [max(o[3] - 1, 0) / max(o[2] - o[1], 1e-9) for o in out]
        print(json.dumps({"streams": n, "max_tokens": MAX_TOKENS, "chunks": [o[3] for o in out],
                          "aggregate_decode_tok_s": round(decode_tokens / span, 1),
                          "mean_stream_decode_tok_s": round(sum(per_stream) / n, 1),
                          "ttft_s_max": round(max(o[1] - o[0] for o in out), 3)}), flush=True)
