#!/usr/bin/env python3
"""Issue 18's time-to-first-token goals against a running `hearth serve`
(standard library only; vision-gpu.sh's `ttft-prefix` phase runs it against
`--device cuda`):

1. Shared prefix: session "donor" answers a ~1,400-token prompt (a long
   system message + a question); session "taker" then sends the same system
   message with another question, so all but its last ~50 tokens are the
   donor's. Its TTFT against the same prompt sent cold (anonymous requests
   never reuse KV), best of 3 each.
2. A short request during a long prefill: a ~3,000-token prompt starts, a
   2-token-ish "hi" from another session follows 0.1 s later; the "hi"'s
   TTFT against the long prompt's.

Prints one JSON line per part. Usage: prefix_ttft.py PORT MODEL_ID
"""
import json
import sys
import threading
import time

from sse import stream_chat

PORT, MODEL = int(sys.argv[1]), sys.argv[2]
URL = f"http://127.0.0.1:{PORT}/v1/chat/completions"


def ttft(messages, session=None, max_tokens=4):
    """(seconds to the first content chunk, usage) of a streamed request."""
    body = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "messages": messages}
    if session:
        body["session_id"] = session
    t0, first, _, usage, _ = stream_chat(URL, body)
    first = None if first is None else first - t0
    return first, usage


system = {"role": "system", "content": "You are a careful assistant. " + " ".join(
    f"Rule {i}: when asked about item {i}, answer with the colour {['red', 'green', 'blue'][i % 3]} "
    f"and the number {i * 17 % 101}." for i in range(60))}
ask = lambda q: [system, {"role": "user", "content": q}]
q_donor = "Which colour belongs to item 5?"
q_taker = ("Now think about item 12 and item 31 together, compare their colours and numbers, and tell me "
           "in one sentence which of the two has the larger number and whether their colours match.")

# Warm-up (kernels, graphs), then the donor.
ttft(ask("Warm-up question."), max_tokens=2)
_, u_donor = ttft(ask(q_donor), session="donor")
colds = [ttft(ask(q_taker)) for _ in range(3)]
cold = min(c[0] for c in colds)
shared, u_shared = ttft(ask(q_taker), session="taker")
print(json.dumps({"part": "shared prefix", "donor_prompt_tokens": u_donor["prompt_tokens"],
                  "prompt_tokens": u_shared["prompt_tokens"],
                  "cached_tokens": u_shared.get("prompt_tokens_details", {}).get("cached_tokens"),
                  "ttft_cold_s": round(cold, 4), "ttft_cold_all_s": [round(c[0], 4) for c in colds],
                  "ttft_shared_s": round(shared, 4), "ratio": round(shared / cold, 4)}), flush=True)

long_msgs = [{"role": "user", "content": " ".join(
    f"Paragraph {i}: the river bends {i % 7} times before it reaches town {i * 3}." for i in range(150))}]
out = {}


def long_run():
    out["long"] = ttft(long_msgs, session="long")


th = threading.Thread(target=long_run)
t0 = time.perf_counter()
th.start()
time.sleep(0.1)
hi_t, hi_u = ttft([{"role": "user", "content": "hi"}], session="hi")
hi_done = time.perf_counter() - t0
th.join()
long_t, long_u = out["long"]
print(json.dumps({"part": "short request during a long prefill", "long_prompt_tokens": long_u["prompt_tokens"],
                  "long_ttft_s": round(long_t, 4), "hi_prompt_tokens": hi_u["prompt_tokens"],
                  "hi_ttft_s": round(hi_t, 4), "hi_sent_at_s": 0.1,
                  "hi_first_token_before_long_prefill_ended": hi_t + 0.1 < long_t,
                  "hi_done_at_s": round(hi_done, 4)}), flush=True)
