#!/usr/bin/env python3
"""Several models behind one `hearth serve` (no -m): loaded on demand,
unloaded when idle, aliases, Ollama's keep_alive, pull and delete, with the
official `openai`, `anthropic` and `ollama` clients.

The server runs over a model store of its own (HEARTH_HOME in a temporary
folder, the packaged files hard-linked in, so nothing is downloaded and
`/api/delete` deletes only the link) with
`--models smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b --max-models 2
--keep-alive 3s --alias gpt-4o-mini=smollm2-135m`:

- before any request: /v1/models lists the three (unloaded, the alias
  under its model), /api/tags and /api/show describe them from their files,
  /api/ps is empty and the process holds no model (RSS);
- requests alternate between two models and each answers what it answers
  alone (greedy; the same text each time, the reply naming its model); the
  alias reaches its model;
- an unknown model gets a 404 naming the served ones, in each API's shape;
- a third model loads while the first one streams (the stream keeps coming
  during the load; Ollama's load_duration says the request waited for it),
  and with --max-models 2 the idle one of the other two is unloaded, never
  the busy one;
- after the keep-alive the idle models unload: /api/ps empty, RSS back down;
- Ollama's keep_alive: -1 keeps a model (expires_at decades ahead), 0
  unloads it now (done_reason "unload"), a bad value is a 400 naming it;
- embeddings (/v1/embeddings, Ollama's /api/embed and /api/embeddings) of
  qwen2.5-coder-0.5b and gemma3-270m within cosine 0.9999 of llama.cpp's
  `llama-embedding` (tests/fixtures/embeddings/, made by
  scripts/fixtures/make_embedding_fixtures.py), base64 the same floats,
  errors naming the field, Ollama's truncate;
- pull (a model already here: success) and delete (the file goes, the model
  leaves /api/tags; an unknown name is a 404);
- `hearth ps` prints what the server holds;
- a 404 lists the routes; each request gets an access log line; a port in
  use fails `hearth serve -m` before the model loads;
- a 3,000-token streamed prompt reports its prefill before the first token:
  chat completions' `prompt_progress` chunks (`return_progress`, as
  llama-server's) counting up to the prompt's tokens, Anthropic's `ping`s.

Run: python3 tests/server/test_models.py [name filter]
"""
import base64
import json
import math
import os
import struct
import shutil
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import anthropic
import ollama
import openai

from common import BIN, Server, model_path, request, run_tests

A, B, C = "smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings"
ALIAS = "gpt-4o-mini"
S = None
HOME = None
ASK = [{"role": "user", "content": "Name three colors."}]


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def setup():
    global S, HOME
    HOME = Path(tempfile.mkdtemp(prefix="hearth-models-home-"))
    store = HOME / "models"
    store.mkdir()
    for name in (A, B, C):
        src = Path(model_path(name))
        try:
            os.link(src, store / src.name)
        except OSError:
            shutil.copy(src, store / src.name)
        rec = src.with_name(src.name + ".hearth.json")
        if rec.exists():
            shutil.copy(rec, store / rec.name)
    # The embedding fixtures' llama.cpp build decides the float order hearth
    # follows (its AVX-512 and AVX2 builds round SwiGLU's exp differently),
    # so they are checked on any CPU.
    builds = {json.loads((FIXTURES / f"{n}.json").read_text())["build"] for n in (B, C)}
    assert len(builds) == 1, builds
    env = {**os.environ, "HEARTH_HOME": str(HOME), "HEARTH_REF_ISA": builds.pop()}
    S = Server("--models", f"{A},{B},{C}", "--max-models", "2", "--keep-alive", "3s",
               "--alias", f"{ALIAS}={A}", model=False, ctx=4096, env=env)


def teardown():
    if S:
        S.stop()
    if HOME:
        shutil.rmtree(HOME, ignore_errors=True)


def oai():
    return openai.OpenAI(base_url=S.base, api_key="unused", max_retries=0, timeout=300)


def oll():
    return ollama.Client(host=S.base.removesuffix("/v1"))


def loaded():
    return sorted(m.model for m in oll().ps().models)


def wait_unloaded(timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not loaded():
            return
        time.sleep(0.25)
    raise AssertionError(f"still loaded after {timeout} s: {loaded()}")


def greedy(model):
    r = oai().chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=0)
    return r.model, r.choices[0].message.content


def test_models_are_listed_before_any_load():
    data = oai().models.list().data
    assert [m.id for m in data] == [A, B, C], data
    extra = {m.id: m.model_extra for m in data}
    assert all(e["status"]["value"] == "unloaded" for e in extra.values()), extra
    assert extra[A]["aliases"] == [ALIAS] and extra[B]["aliases"] == [], extra
    tags = {m.model: m for m in oll().list().models}
    assert sorted(tags) == sorted([A, B, C]), tags
    assert tags[B].details.family == "gemma3" and tags[A].size > 50_000_000, tags
    # show describes a model from its file without loading it.
    info = oll().show(C)
    assert info.modelinfo["general.architecture"] == "qwen2" and "tools" in info.capabilities, info.capabilities
    assert "<|im_start|>" in info.template and "tools" not in oll().show(B).capabilities
    assert loaded() == []
    assert rss_mib(S.proc.pid) < 150, rss_mib(S.proc.pid)


def test_requests_alternate_between_models():
    a1, b1 = greedy(A), greedy(B)
    a2, b2 = greedy(A), greedy(B)
    assert a1 == a2 and b1 == b2, (a1, a2, b1, b2)
    assert a1[0] == A and b1[0] == B and a1[1] and b1[1] and a1[1] != b1[1], (a1, b1)
    # The alias answers as its model does, under the model's own name.
    assert greedy(ALIAS) == a1
    assert loaded() == sorted([A, B])


def test_unknown_model_is_a_404_naming_the_served_ones():
    try:
        oai().chat.completions.create(model="llama3:70b", messages=ASK, max_tokens=2)
        raise AssertionError("an unknown model was served")
    except openai.NotFoundError as e:
        msg = e.body["message"]
        assert e.body["code"] == "model_not_found" and all(n in msg for n in (A, B, C, ALIAS)), msg
    ac = anthropic.Anthropic(base_url=S.base.removesuffix("/v1"), api_key="unused", max_retries=0)
    try:
        ac.messages.create(model="claude-opus-4", max_tokens=4, messages=ASK)
        raise AssertionError("an unknown model was served")
    except anthropic.NotFoundError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
        assert A in e.body["error"]["message"], e.body
    try:
        oll().chat(model="llama3:8b", messages=ASK)
        raise AssertionError("an unknown model was served")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and C in e.error, (e.status_code, e.error)


def test_a_model_loads_while_another_streams():
    assert loaded() == sorted([A, B]), loaded()
    greedy(B)  # B is now the more recently used; A is about to be busy
    arrivals, done = [], threading.Event()

    def stream():
        s = oai().chat.completions.create(model=A, messages=ASK, max_tokens=400, temperature=0, stream=True,
                                          extra_body={"ignore_eos": True})
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    while not arrivals:
        time.sleep(0.01)
    sent = time.monotonic()
    r = oll().generate(model=C, prompt="Say hi.", options={"num_predict": 4, "temperature": 0})
    answered = time.monotonic()
    during = [x for x in arrivals if sent <= x <= answered]
    assert r.done and r.load_duration > 0.2e9, r
    # The stream kept coming while C loaded (A was never paused for it).
    assert len(during) >= 5, (len(during), answered - sent)
    # --max-models 2: the idle B made room; the streaming A stayed.
    assert loaded() == sorted([A, C]), loaded()
    done.wait(300)
    t.join()
    assert len(arrivals) >= 100, len(arrivals)


def test_idle_models_unload_after_the_keep_alive():
    greedy(A)
    before = rss_mib(S.proc.pid)
    assert loaded(), "nothing loaded"
    wait_unloaded()
    after = rss_mib(S.proc.pid)
    assert after < before / 2 and before - after > 150, (before, after)
    data = {m.id: m.model_extra["status"]["value"] for m in oai().models.list().data}
    assert set(data.values()) == {"unloaded"}, data


def test_ollama_keep_alive():
    c = oll()
    r = c.generate(model=B, prompt="", keep_alive=-1)
    assert r.done_reason == "load", r
    ps = {m.model: m for m in c.ps().models}
    assert B in ps and ps[B].expires_at > datetime.now(timezone.utc).replace(year=datetime.now().year + 50), ps
    time.sleep(4.5)  # past --keep-alive 3s: -1 keeps it
    assert B in loaded()
    r = c.generate(model=B, prompt="", keep_alive=0)
    assert r.done_reason == "unload", r
    deadline = time.time() + 10
    while B in loaded() and time.time() < deadline:
        time.sleep(0.1)
    assert B not in loaded()
    # A chat turn with keep_alive "1m" outlives the server's 3 s.
    c.chat(model=A, messages=ASK, options={"num_predict": 2}, keep_alive="1m")
    time.sleep(4.5)
    assert A in loaded()
    c.generate(model=A, prompt="", keep_alive=0)
    for bad in ("soon", True, "5x"):
        status, _, text = request(S, "POST", "/api/generate", {"model": A, "prompt": "x", "keep_alive": bad})
        assert status == 400 and "keep_alive" in json.loads(text)["error"], (bad, status, text)
    wait_unloaded()


def test_hearth_ps_prints_the_loaded_models():
    oll().generate(model=C, prompt="", keep_alive="1m")
    out = subprocess.run([BIN, "ps", "--host", S.host, "--port", str(S.port)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "SIZE"], out.stdout
    assert any(l.startswith(C) and "4096" in l for l in lines[1:]), out.stdout
    oll().generate(model=C, prompt="", keep_alive=0)
    wait_unloaded()
    out = subprocess.run([BIN, "ps", "--host", S.host, "--port", str(S.port)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "no models loaded" in out.stdout, (out.stdout, out.stderr)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_match_llama_cpp():
    for name in (C, B):
        ref = json.loads((FIXTURES / f"{name}.json").read_text())
        r = oai().embeddings.create(model=name, input=ref["texts"])
        got = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
        assert len(got) == len(ref["embeddings"]) and r.model == name, (len(got), r.model)
        for text, g, want in zip(ref["texts"], got, ref["embeddings"]):
            assert len(g) == len(want), (name, len(g), len(want))
            c = cosine(g, want)
            assert c >= 0.9999, (name, text[:40], c)
            assert abs(math.sqrt(sum(x * x for x in g)) - 1) < 1e-5
        # The same vectors in base64 and through Ollama's /api/embed and /api/embeddings.
        b64 = oai().embeddings.create(model=name, input=ref["texts"][0], encoding_format="base64").data[0].embedding
        raw = base64.b64decode(b64)
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == got[0]
        e = oll().embed(model=name, input=ref["texts"][:2])
        assert e.embeddings == got[:2] and e.prompt_eval_count > 0, e.prompt_eval_count
        assert oll().embeddings(model=name, prompt=ref["texts"][0]).embedding == got[0]
    for body, needle in (({"model": C, "input": "x", "dimensions": 7}, "dimensions"),
                         ({"model": C, "input": ""}, "input"),
                         ({"model": C, "input": []}, "input"),
                         ({"model": C, "input": [1, "a"]}, "input"),
                         ({"model": C, "input": [[999999999]]}, "vocabulary"),
                         ({"model": C, "input": "x", "encoding_format": "int8"}, "encoding_format")):
        status, _, text = request(S, "POST", "/v1/embeddings", body)
        assert status == 400 and needle in json.loads(text)["error"]["message"], (body, status, text)
    status, _, text = request(S, "POST", "/api/embed", {"model": C})
    assert status == 400 and "input" in json.loads(text)["error"], text
    long = "word " * 5000
    status, _, text = request(S, "POST", "/api/embed", {"model": C, "input": long, "truncate": False})
    assert status == 400 and "context" in json.loads(text)["error"], text
    e = oll().embed(model=A, input=long)  # truncate (Ollama's default): cut to the context
    assert e.prompt_eval_count == 4096, e.prompt_eval_count


def test_pull_and_delete():
    c = oll()
    assert c.pull(B).status == "success"
    lines = [json.loads(l) for l in request(S, "POST", "/api/pull", {"model": B})[2].splitlines()]
    assert lines[-1] == {"status": "success"}, lines
    c.generate(model=B, prompt="")  # loaded: delete unloads it first
    file = next((HOME / "models").glob("gemma-3-270m*.gguf"))
    c.delete(B)
    assert not file.exists()
    assert B not in [m.model for m in c.list().models] and B not in loaded()
    try:
        c.delete("llama3:8b")
        raise AssertionError("deleted an unknown model")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e


def sse_events(text):
    return [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]


def test_a_long_prompt_streams_its_prefill_progress():
    long = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 300 + "How many foxes?"}]
    status, _, text = request(S, "POST", "/v1/chat/completions", {
        "model": A, "messages": long, "max_tokens": 4, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}, "return_progress": True})
    assert status == 200, text
    events = sse_events(text)
    first_token = next(i for i, e in enumerate(events) if e["choices"] and e["choices"][0]["delta"].get("content"))
    progress = [e["prompt_progress"] for e in events[:first_token] if "prompt_progress" in e]
    total = events[-1]["usage"]["prompt_tokens"]
    assert total > 3000 and len(progress) >= 5, (total, progress)
    done = [p["processed"] for p in progress]
    assert done == sorted(done) and done[-1] == total and all(p["total"] == total for p in progress), progress
    assert all(p["time_ms"] >= 0 for p in progress)
    # Without return_progress, no such chunks.
    status, _, text = request(S, "POST", "/v1/chat/completions", {
        "model": A, "messages": long + [{"role": "assistant", "content": "One."}, {"role": "user", "content": "Sure?"}],
        "max_tokens": 2, "stream": True})
    assert status == 200 and "prompt_progress" not in text, text[:300]
    # Anthropic's stream pings while the prompt is prefilled.
    status, _, text = request(S, "POST", "/v1/messages", {
        "model": A, "max_tokens": 4, "stream": True,
        "messages": [{"role": "user", "content": "A lazy dog sleeps in the sun. " * 350}]})
    assert status == 200, text
    kinds = [l[7:] for l in text.splitlines() if l.startswith("event: ")]
    first_delta = kinds.index("content_block_delta") if "content_block_delta" in kinds else len(kinds)
    assert kinds[0] == "message_start" and kinds[:first_delta].count("ping") >= 5, kinds[:12]


def test_a_404_lists_the_routes_and_every_request_is_logged():
    greedy(A)
    status, _, text = request(S, "GET", "/v1/chat/complete")
    msg = json.loads(text)["error"]["message"]
    assert status == 404 and "/v1/chat/complete" in msg and "POST /v1/chat/completions" in msg, msg
    assert "GET /api/tags" in msg and "POST /v1/embeddings" in msg, msg
    log = S.logs()
    assert "access: GET /v1/chat/complete 404 " in log, log[-2000:]
    assert "access: POST /v1/chat/completions 200 " in log


def test_a_busy_port_fails_before_the_model_loads():
    t0 = time.monotonic()
    p = subprocess.run([BIN, "serve", "-m", model_path(C), "--port", str(S.port)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and f"binding 127.0.0.1:{S.port}" in p.stderr, (p.returncode, p.stderr)
    assert "loaded" not in p.stderr and time.monotonic() - t0 < 5, p.stderr


if __name__ == "__main__":
    raise SystemExit(run_tests(globals(), setup, teardown))
