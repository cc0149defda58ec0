#!/usr/bin/env python3
"""Continuous batching against the real `hearth serve` (qwen2.5-coder-0.5b):

- with `--batch-invariant`, 16 requests of mixed prompt and output lengths
  sent at once give exactly the replies they give when each runs alone, and
  the server really batched them (`/metrics`: forward passes carried several
  sessions on average);
- in the default mode (smollm2-135m), requests sent at once complete with the replies'
  lengths they were asked for, share passes, and a short request that
  arrives during another's long prefill gets its answer before that prefill
  ends (its rows ride in the long prompt's chunk passes);
- speculating sessions (`--spec ngram`, `--spec dflash` with a synthetic
  drafter that reads the target's hidden states) verify their drafts in the
  same batched passes, and with `--batch-invariant` each reply equals the
  plain server's reply to that request run alone.

Run: python3 tests/server/test_batching.py
"""
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import BIN, MODEL_ID, Server, http, model_path, run_tests

INVARIANT = None
DEFAULT = None
ALONE = {}  # request index -> its reply on INVARIANT, run alone

TOPICS = ["binary search", "a linked list", "quicksort", "a stack", "FizzBuzz", "a queue", "merge sort",
          "a hash map", "Fibonacci numbers", "string reversal", "a binary tree", "bubble sort",
          "prime numbers", "a palindrome check", "matrix multiplication", "a trie"]


def setup():
    global INVARIANT, DEFAULT
    INVARIANT = Server("--batch-invariant", "--max-sessions", "20", ctx=1024)
    DEFAULT = Server("--max-sessions", "8", ctx=4096, model=model_path("smollm2-135m"))


def teardown():
    for s in (INVARIANT, DEFAULT):
        if s is not None:
            assert s.stop() == 0


def request(i):
    """Request i: prompts of mixed lengths, replies of mixed lengths."""
    detail = " Show an example." * (i % 3)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Python code for {TOPICS[i]}.{detail}"}]
    return messages, 3 + (i * 5) % 11


def complete(server, i):
    messages, max_tokens = request(i)
    r = server.client().chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=max_tokens,
                                                temperature=0)
    return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason


def batch_counters(server):
    m = server.metrics()
    return m[("hearth_forward_passes_total", "")], m[("hearth_forward_pass_sequences_total", "")]


def at_once(server, n):
    """Requests 0..n sent together (they are all admitted in the same round)."""
    start = threading.Barrier(n)

    def one(i):
        start.wait()
        return complete(server, i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_batch_invariant_replies_equal_the_requests_run_alone():
    passes0, seqs0 = batch_counters(INVARIANT)
    together = at_once(INVARIANT, 16)
    passes1, seqs1 = batch_counters(INVARIANT)
    mean = (seqs1 - seqs0) / (passes1 - passes0)
    assert mean > 2.0, f"mean sessions per pass {mean:.2f}: the requests were not batched"
    replies = [alone(i) for i in range(16)]
    for i, (a, b) in enumerate(zip(together, replies)):
        assert a == b, (i, a, b)
    assert len({a[0] for a in replies}) > 8, "the requests should differ"


def alone(i):
    if i not in ALONE:
        ALONE[i] = complete(INVARIANT, i)
    return ALONE[i]


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, (name, text)
    return float(m.group(1))


def test_speculating_sessions_verify_in_shared_passes():
    draft = Path(os.environ.get("TMPDIR", "/tmp")) / f"hearth-dflash-batch-{os.getpid()}.gguf"
    subprocess.run([BIN, "synth", "--arch", "dflash", "--target", model_path(), "--block-size", "4",
                    "-o", str(draft)], check=True, capture_output=True)
    try:
        for extra, n in ((["--spec", "ngram", "--n-draft", "4"], 8),
                         (["--spec", "dflash", "--draft-model", str(draft), "--block-length", "4"], 6)):
            spec = Server("--batch-invariant", "--max-sessions", "20", *extra, ctx=1024)
            try:
                together = at_once(spec, n)
                _, text = http(spec, "GET", "/metrics")
                passes = metric(text, "hearth_forward_passes_total")
                seqs = metric(text, "hearth_forward_pass_sequences_total")
                assert seqs / passes > 2.0, (extra, seqs, passes)
                assert metric(text, "hearth_spec_target_forwards_total") > 0, text
                if extra[1] == "ngram":
                    assert metric(text, "hearth_spec_accepted_tokens_total") > 0, text
                for i, got in enumerate(together):
                    assert got == alone(i), (extra, i, got, alone(i))
            finally:
                assert spec.stop() == 0
    finally:
        draft.unlink(missing_ok=True)


def test_default_mode_batches_requests_sent_at_once():
    passes0, seqs0 = batch_counters(DEFAULT)
    together = at_once(DEFAULT, 6)
    passes1, seqs1 = batch_counters(DEFAULT)
    assert (seqs1 - seqs0) / (passes1 - passes0) > 2.0
    for i, (text, n, finish) in enumerate(together):
        want = request(i)[1]
        assert text and (n == want or finish == "stop"), (i, n, want, finish)


def test_a_short_request_is_answered_during_a_long_prefill():
    long_prompt = "Summarize this log:\n" + "".join(
        f"2026-12-01 10:{i // 60:02d}:{i % 60:02d} worker-{i % 7} processed batch {i} in {i % 13 + 1} ms\n"
        for i in range(60))
    done = {}

    def long_one():
        r = DEFAULT.client().chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": long_prompt}], max_tokens=1, temperature=0)
        done["long"] = time.monotonic()
        done["long_prompt_tokens"] = r.usage.prompt_tokens

    t = threading.Thread(target=long_one)
    t.start()
    time.sleep(0.5)
    r = DEFAULT.client().chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}], max_tokens=2, temperature=0)
    short_done = time.monotonic()
    t.join()
    assert r.usage.completion_tokens >= 1
    assert done["long_prompt_tokens"] > 1500, done
    assert short_done < done["long"], "the short request waited for the whole long prefill"


if __name__ == "__main__":
    sys.exit(run_tests(globals(), setup, teardown))
