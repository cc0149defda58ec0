"""A streamed chat completion over plain urllib (the GPU machine has no
openai SDK), for batching_gpu.py and prefix_ttft.py."""
import json
import time
import urllib.request


def stream_chat(url, body, timeout=600):
    """POSTs `body` (stream: true) to `url`; returns (t0, time of the first
    content chunk or None, end time, usage or None, content chunks), times
    from time.perf_counter()."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            if d.get("choices") and d["choices"][0].get("delta", {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    return t0, first, time.perf_counter(), usage, chunks
