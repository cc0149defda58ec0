#!/usr/bin/env python3
"""End-to-end tests of `hearth serve` with the official `openai` Python SDK.

Starts the real binary (target/release/hearth, or $HEARTH_BIN) on a free
loopback port with qwen2.5-coder-0.5b and talks to it as a client would: chat,
streaming, tool calls and a tool-result turn, usage with cached tokens on a
session's second turn, two concurrent sessions, a client disconnect mid-stream,
every validation error, session reset/close, metrics, and a clean SIGTERM.

Run: python3 tests/server/test_server.py   (or: python3 -m pytest tests/server)
Needs: cargo build --release -p hearth; pip install openai.
Generations are kept to a few tokens: CPU decode is slow on 2 cores.
"""
import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import openai

from common import BIN, ROOT, Server, http, model_path, run_tests

API_KEY = "test-key-123"
CTX = 2048
SERVER = None  # the shared server, started by setup_module

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."}]


def oversized_post(server, size):
    """Declares a body over the limit; the server answers 413 from the headers
    (without reading the body), so only the headers and a first piece are sent."""
    host, port = server.host, server.port
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n").encode())
        try:
            s.sendall(b'{"messages": [' + b" " * 65536)
        except OSError:
            pass
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def setup_module(module=None):
    global SERVER
    SERVER = Server("--api-key", API_KEY, "--max-sessions", "6", "--max-body-mib", "1", ctx=CTX, api_key=API_KEY)


def teardown_module(module=None):
    if SERVER is not None:
        code = SERVER.stop()
        assert code == 0, f"server exit code {code} after SIGTERM"
        assert "shutting down" in SERVER.logs()


def test_health_and_models():
    status, body = http(SERVER, "GET", "/health", headers={"Authorization": ""})
    assert (status, body) == (200, {"status": "ok"})
    models = SERVER.client().models.list()
    assert [m.id for m in models.data] == ["qwen-test"]
    assert models.data[0].owned_by == "hearth"


def test_chat_plain():
    r = SERVER.client().chat.completions.create(
        model="qwen-test", messages=[{"role": "user", "content": "What is 2+2? Answer with one number."}],
        max_tokens=4, temperature=0,
    )
    assert r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and "4" in msg.content, msg
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_is_incremental_and_matches_whole():
    client = SERVER.client()
    ask = [{"role": "user", "content": "Count from 1 to 5, separated by spaces."}]
    whole = client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=8, temperature=0)
    chunks, times = [], []
    for c in client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
        chunks.append(c)
        times.append(time.monotonic())
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 3, "content should arrive in several deltas"
    # Deltas arrive as tokens are decoded, not in one burst at the end.
    assert times[chunks.index(content[-1])] - times[chunks.index(content[0])] > 0.02
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content for c in content) == whole.choices[0].message.content


def test_tool_call_streamed_then_tool_result_turn_reuses_the_session():
    client = SERVER.client()
    session = {"session_id": "tools-1"}
    calls, finish, usage = {}, None, None
    for c in client.chat.completions.create(model="qwen-test", messages=WEATHER_ASK, tools=[WEATHER_TOOL], max_tokens=48, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=session):
        if c.usage:
            usage = c.usage
        for ch in c.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function.name, "the first delta of a call carries id and name"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None, "id only on the first delta"
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls", (finish, calls)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    args = json.loads(calls[0]["arguments"])
    assert "paris" in args["city"].lower()

    # Turn 2: the tool result, arguments sent back as a JSON string (OpenAI style).
    messages = WEATHER_ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny, 24 degrees Celsius."},
    ]
    r = client.chat.completions.create(model="qwen-test", messages=messages, tools=[WEATHER_TOOL], max_tokens=12, temperature=0,
                                       extra_body=session)
    assert r.choices[0].message.content, r
    assert r.usage.prompt_tokens > usage.prompt_tokens
    # The first turn's prompt is resident in the session: it is not prefilled again.
    assert r.usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens, (r.usage, usage)


def test_tool_call_whole_response():
    r = SERVER.client().chat.completions.create(model="qwen-test", messages=WEATHER_ASK, tools=[WEATHER_TOOL], max_tokens=48,
                                                temperature=0, extra_body={"session_id": "tools-1"})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert msg.tool_calls[0].type == "function" and msg.tool_calls[0].function.name == "get_weather"
    assert "paris" in json.loads(msg.tool_calls[0].function.arguments)["city"].lower()
    # Same prompt as turn 1 of this session: only the last prompt token is re-fed.
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def test_two_concurrent_sessions_keep_their_own_context():
    client = SERVER.client()
    names = {"alice-s": "Alice", "bob-s": "Bob"}
    results, errors = {}, []
    together = threading.Barrier(len(names))

    def converse(sid, name):
        try:
            ask = [{"role": "system", "content": "You are a helpful assistant. Keep answers very short."},
                   {"role": "user", "content": f"Hello, my name is {name}."}]
            r1 = client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=6, temperature=0,
                                                extra_headers={"x-session-affinity": sid})
            ask += [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "What is my name? Reply with the sentence: Your name is NAME."}]
            together.wait(timeout=600)
            text, times, usage = "", [], None
            for c in client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=8, temperature=0,
                                                    stream=True, stream_options={"include_usage": True},
                                                    extra_headers={"x-session-affinity": sid}):
                if c.usage:
                    usage = c.usage
                if c.choices and c.choices[0].delta.content:
                    text += c.choices[0].delta.content
                    times.append(time.monotonic())
            results[sid] = (text, times, usage, r1.usage)
        except Exception as e:  # surfaced by the main thread
            errors.append(e)

    threads = [threading.Thread(target=converse, args=item) for item in names.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for sid, name in names.items():
        text, _, usage, first = results[sid]
        other = ({"Alice", "Bob"} - {name}).pop()
        assert name in text and other not in text, (sid, text)
        assert usage.prompt_tokens_details.cached_tokens >= first.prompt_tokens, (usage, first)
    # Interleaved at token granularity: each stream produced tokens while the
    # other was still producing.
    a, b = results["alice-s"][1], results["bob-s"][1]
    assert len(a) >= 2 and len(b) >= 2, (a, b)
    assert a[0] < b[-1] and b[0] < a[-1], "the two generations did not overlap"


def test_disconnect_mid_stream_then_normal_request():
    client = SERVER.client()
    ask = [{"role": "user", "content": "Write a long story about a dragon."}]
    stream = client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=300, temperature=0, stream=True,
                                            extra_body={"session_id": "drop-1"})
    seen = 0
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            seen += 1
            if seen == 3:
                break
    stream.close()
    t0 = time.monotonic()
    r = client.chat.completions.create(model="qwen-test", messages=[{"role": "user", "content": "Say OK."}], max_tokens=2,
                                       temperature=0, extra_body={"session_id": "drop-1"})
    assert r.choices[0].message.content
    assert time.monotonic() - t0 < 120
    m = re.findall(r"llm_turn_stats session_id=drop-1 .*completion_tokens=(\d+) .*finish=(\w+)", SERVER.logs())
    assert m[0][1] == "cancelled" and int(m[0][0]) < 40, m
    assert m[1][1] in ("stop", "length")


def test_disconnect_during_a_long_prefill_stops_within_one_chunk():
    """A client that leaves while its long prompt is being prefilled costs at
    most the 512-token chunk in progress (issue 18), counted in /metrics."""
    client = SERVER.client()
    words = " ".join(f"item{i}" for i in range(450))
    ask = [{"role": "user", "content": f"Summarize this list: {words}"}]
    before = SERVER.metrics().get(("hearth_cancelled_prefill_tokens_total", ""), 0)
    stream = client.chat.completions.create(model="qwen-test", messages=ask, max_tokens=5, temperature=0, stream=True,
                                            extra_body={"session_id": "long-drop"})
    next(iter(stream))  # the role chunk: admitted, prefill running
    time.sleep(1.0)
    stream.close()
    deadline = time.monotonic() + 120
    m = None
    while time.monotonic() < deadline and not m:
        m = re.search(r"llm_turn_stats session_id=long-drop .*prompt_tokens=(\d+) reused_prompt_tokens=\d+ "
                      r"prefilled_prompt_tokens=(\d+) .*finish=(\w+)", SERVER.logs())
        time.sleep(0.5)
    assert m, "the cancelled turn was never logged"
    prompt, prefilled, finish = int(m.group(1)), int(m.group(2)), m.group(3)
    assert finish == "cancelled" and prompt > 1100, m.group(0)
    # The chunk in progress when the client left, and at most one more.
    assert prefilled <= 1024, m.group(0)
    after = SERVER.metrics()[("hearth_cancelled_prefill_tokens_total", "")]
    assert after - before == prompt - prefilled, (before, after, prompt, prefilled)
    # Leave the session slots (--max-sessions) to the tests after this one.
    assert http(SERVER, "DELETE", "/v1/sessions/long-drop")[0] == 200


def test_validation_errors_do_not_disturb_a_running_session():
    client = SERVER.client()
    background = {}

    def run_background():
        text, finish = "", None
        for c in client.chat.completions.create(model="qwen-test", messages=[{"role": "user", "content": "List three colors."}],
                                                max_tokens=10, temperature=0, stream=True,
                                                extra_body={"session_id": "bg-1"}):
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        background.update(text=text, finish=finish)

    t = threading.Thread(target=run_background)
    t.start()
    msgs = [{"role": "user", "content": "hi"}]

    def expect(status, code, fn, match=None):
        try:
            fn()
        except openai.APIStatusError as e:
            assert e.status_code == status, (e.status_code, e.body)
            body = e.body.get("error", e.body) if isinstance(e.body, dict) else {}
            assert body.get("code") == code, e.body
            if match:
                assert re.search(match, str(e.body)), e.body
            return e
        raise AssertionError(f"expected HTTP {status}")

    expect(404, "model_not_found", lambda: client.chat.completions.create(model="nope", messages=msgs),
           "Model 'nope' not found. This server serves 'qwen-test'.")
    expect(400, "invalid_value", lambda: client.chat.completions.create(model="qwen-test", messages=msgs, temperature=3),
           r"temperature must be between 0 and 2 \(got 3")
    expect(400, "invalid_value", lambda: client.chat.completions.create(model="qwen-test", messages=msgs, top_p=0))
    expect(400, "invalid_value", lambda: client.chat.completions.create(model="qwen-test", messages=msgs, max_tokens=0),
           r"max_tokens must be a positive integer")
    expect(400, "unsupported_parameter", lambda: client.chat.completions.create(model="qwen-test", messages=msgs, n=2), r"n>1")
    expect(400, "invalid_value",
           lambda: client.chat.completions.create(model="qwen-test", messages=msgs, logprobs=True, top_logprobs=21),
           r"top_logprobs")
    expect(400, "invalid_value",
           lambda: client.chat.completions.create(model="qwen-test", messages=msgs, tools=[WEATHER_TOOL],
                                                  tool_choice={"type": "function", "function": {"name": "nope"}}),
           r"tool_choice\.function\.name")
    expect(400, "invalid_value", lambda: client.chat.completions.create(model="qwen-test", messages=msgs, frequency_penalty=3.0),
           r"frequency_penalty must be between -2 and 2")
    expect(400, "invalid_session_id",
           lambda: client.chat.completions.create(model="qwen-test", messages=msgs, extra_body={"session_id": "has space"}))
    expect(400, "invalid_session_id",
           lambda: client.chat.completions.create(model="qwen-test", messages=msgs, extra_body={"session_id": "x" * 129}))
    long = [{"role": "user", "content": "word " * (CTX + 100)}]
    for stream in (False, True):
        expect(400, "context_length_exceeded",
               lambda: client.chat.completions.create(model="qwen-test", messages=long, stream=stream),
               r"maximum context length is 2048 tokens")
    expect(401, "invalid_api_key", lambda: SERVER.client(key="wrong").chat.completions.create(model="qwen-test", messages=msgs))

    status, body = http(SERVER, "POST", "/v1/chat/completions", raw=b'{"messages": [')
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]
    status, body = http(SERVER, "POST", "/v1/chat/completions", body={"max_tokens": 3})
    assert status == 400 and "messages" in body["error"]["message"]
    status, body = http(SERVER, "POST", "/v1/chat/completions", body={"messages": "hi"})
    assert status == 400 and "messages" in body["error"]["message"]
    status, body = http(SERVER, "POST", "/v1/chat/completions", body={"messages": msgs, "temperature": "hot"})
    assert status == 400 and "temperature" in body["error"]["message"]
    status, body = oversized_post(SERVER, 2 * 1024 * 1024)
    assert status == 413 and body["error"]["type"] == "invalid_request_error", (status, body)
    status, body = http(SERVER, "GET", "/v1/models", headers={"Authorization": ""})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = http(SERVER, "POST", "/v1/chat/completions", body={"messages": msgs},
                        headers={"Authorization": ""})
    assert status == 401

    t.join()
    assert background["finish"] in ("stop", "length") and background["text"], background


def test_tokenize_and_detokenize_match_llama_cpp():
    """llama-server's /tokenize and /detokenize against llama.cpp's own
    tokenization of the fixture strings (tests/fixtures/tokenizer/, made with
    llama-tokenize): ids with and without special parsing, the pieces, and the
    concatenated pieces back from the ids."""
    served = Path(SERVER.proc.args[SERVER.proc.args.index("-m") + 1]).name
    fixtures = [json.loads(f.read_text()) for f in (ROOT / "tests" / "fixtures" / "tokenizer").glob("*.json")]
    fx = next((f for f in fixtures if f.get("file") == served), None)
    assert fx is not None, f"no tokenizer fixture for the served model {served}"
    h = {"Authorization": f"Bearer {API_KEY}"}
    for case in fx["cases"]:
        text = case["text"]
        st, r = http(SERVER, "POST", "/tokenize", {"content": text, "add_special": True}, h)
        assert st == 200 and r["tokens"] == case["ids"], (text, st, r)
        st, r = http(SERVER, "POST", "/tokenize", {"content": text, "add_special": True, "parse_special": False}, h)
        assert st == 200 and r["tokens"] == case["ids_no_parse_special"], (text, st, r)
        st, r = http(SERVER, "POST", "/detokenize", {"tokens": case["ids"]}, h)
        assert st == 200 and r["content"] == case["detok"], (text, st, r)
    # Pieces: each token's bytes (a string where they are whole UTF-8, else
    # the byte list), and together they are the text.
    text = "héllo wörld <|im_start|> 日本語"
    st, r = http(SERVER, "POST", "/tokenize", {"content": text, "with_pieces": True}, h)
    assert st == 200, r
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in r["tokens"])
    assert joined.decode() == text, (joined, r)
    ids = [p["id"] for p in r["tokens"]]
    assert http(SERVER, "POST", "/tokenize", {"content": text}, h)[1]["tokens"] == ids
    assert "<|im_start|>" in [p["piece"] for p in r["tokens"]], r  # one special token, parsed
    # Bad input: 400 naming the field, in OpenAI's error shape.
    for path, body, words in [
        ("/tokenize", {}, "content is required"),
        ("/tokenize", {"content": 5}, "content must be a string"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "'with_pieces' must be a boolean"),
        ("/detokenize", {"tokens": "12"}, "tokens must be an array"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens[1] must be a token id"),
        ("/detokenize", {"tokens": [10**9]}, "tokens[0] must be a token id"),
    ]:
        st, r = http(SERVER, "POST", path, body, h)
        assert st == 400 and words in r["error"]["message"], (path, body, st, r)
    assert http(SERVER, "POST", "/detokenize", {}, h)[1] == {"content": ""}
    # The API key still applies.
    assert http(SERVER, "POST", "/tokenize", {"content": "x"}, {"Authorization": None})[0] == 401
    assert http(SERVER, "POST", "/detokenize", {"tokens": [1]}, {"Authorization": "Bearer wrong"})[0] == 401


def test_ignore_eos_generates_to_max_tokens():
    """`ignore_eos` (llama-server's and vLLM's field): a reply that ends with
    the end-of-turn token after a few tokens runs to max_tokens instead."""
    msgs = [{"role": "user", "content": "What is 2+2? Answer with one number."}]
    ask = lambda **kw: SERVER.client().chat.completions.create(model="qwen-test", messages=msgs, max_tokens=12,
                                                               temperature=0, **kw)
    plain = ask()
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 12, plain
    forced = ask(extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 12, forced
    assert forced.choices[0].message.content.startswith(plain.choices[0].message.content), forced
    status, body = http(SERVER, "POST", "/v1/chat/completions", body={"messages": msgs, "ignore_eos": "yes"})
    assert status == 400 and "'ignore_eos' must be a boolean." in body["error"]["message"], body


def test_completions_endpoint():
    r = SERVER.client().completions.create(model="qwen-test", prompt="def add(a, b):\n    return", max_tokens=3,
                                           temperature=0)
    assert r.choices[0].text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1


def test_session_reset_and_close():
    status, body = http(SERVER, "POST", "/v1/sessions/tools-1/reset")
    assert (status, body) == (200, {"reset": True, "session_id": "tools-1"})
    status, body = http(SERVER, "DELETE", "/v1/sessions/never-seen")
    assert status == 404 and body["error"]["code"] == "session_not_found", (status, body)
    status, body = http(SERVER, "DELETE", "/v1/sessions/alice-s")
    assert (status, body) == (200, {"closed": True, "session_id": "alice-s"})


def test_metrics():
    status, text = http(SERVER, "GET", "/metrics")
    assert status == 200
    assert re.search(r'hearth_requests_total\{endpoint="/v1/chat/completions",status="200"\} [1-9]', text)
    assert re.search(r'hearth_requests_total\{endpoint="/v1/chat/completions",status="400"\} [1-9]', text)
    for name in ["hearth_prompt_tokens_total", "hearth_completion_tokens_total", "hearth_reused_prompt_tokens_total",
                 "hearth_prefill_tokens_per_second", "hearth_decode_tokens_per_second", "hearth_active_sessions"]:
        assert re.search(rf"^{name} \d", text, re.M), name
    assert float(re.search(r"^hearth_reused_prompt_tokens_total (\S+)", text, re.M).group(1)) > 0


SPEC_PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]


def test_speculative_servers_generate_what_the_plain_server_does():
    """--spec ngram and --spec dflash (a synthetic draft: nearly every draft is rejected, which
    exercises the hidden-state taps, rollback and session resume): greedy completions equal the
    plain server's, token for token, also when a session resumes; /metrics reports acceptance."""
    want = [SERVER.client().completions.create(model="qwen-test", prompt=p, max_tokens=16, temperature=0)
            .choices[0].text for p in SPEC_PROMPTS]
    draft = Path(os.environ.get("TMPDIR", "/tmp")) / f"hearth-dflash-{os.getpid()}.gguf"
    subprocess.run([BIN, "synth", "--arch", "dflash", "--target", model_path(), "--block-size", "4",
                    "-o", str(draft)], check=True, capture_output=True)
    try:
        # K = 2 and short contexts: where the shipped kernels compute a verify pass's rows
        # exactly as single-token decode does (crates/engine/tests/spec_greedy.rs explains).
        for extra in (["--spec", "ngram", "--n-draft", "2"],
                      ["--spec", "dflash", "--draft-model", str(draft), "--block-length", "3"]):
            spec = Server("--api-key", API_KEY, *extra, ctx=CTX, api_key=API_KEY)
            try:
                c = spec.client()
                got = [c.completions.create(model="qwen-test", prompt=p, max_tokens=16, temperature=0)
                       .choices[0].text for p in SPEC_PROMPTS]
                assert got == want, (extra, got, want)
                # The same prompt again on the scratch session: resumes (rolls back) and agrees.
                again = c.completions.create(model="qwen-test", prompt=SPEC_PROMPTS[-1], max_tokens=16,
                                             temperature=0).choices[0].text
                assert again == want[-1], (extra, again, want[-1])
                status, text = http(spec, "GET", "/metrics")
                assert status == 200
                assert re.search(rf'^hearth_spec_info\{{spec="{extra[1]}",n_draft="\d+",adaptive="false"\}} 1$', text, re.M), text
                assert re.search(r'^hearth_spec_drafted_at_position_total\{position="0"\} [1-9]', text, re.M), text
                forwards = int(re.search(r"^hearth_spec_target_forwards_total (\d+)", text, re.M).group(1))
                assert forwards > 0
                assert re.search(r'^hearth_spec_acceptance_by_position\{position="0"\} \S+', text, re.M)
                if extra[1] == "ngram":
                    assert int(re.search(r"^hearth_spec_accepted_tokens_total (\d+)", text, re.M).group(1)) > 0
            finally:
                assert spec.stop() == 0
    finally:
        draft.unlink(missing_ok=True)


def test_constrained_and_logprob_turns_keep_the_drafter_in_step():
    """A turn that does not speculate (a JSON schema, logprobs) in a session
    of a --spec dflash server still feeds its tokens to the drafter, so the
    session's later speculative turns resume and match the plain server."""
    draft = Path(os.environ.get("TMPDIR", "/tmp")) / f"hearth-dflash-step-{os.getpid()}.gguf"
    subprocess.run([BIN, "synth", "--arch", "dflash", "--target", model_path(), "--block-size", "4",
                    "-o", str(draft)], check=True, capture_output=True)
    spec = Server("--spec", "dflash", "--draft-model", str(draft), "--block-length", "3", ctx=1024)
    try:
        schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]}}}

        def turns(server, client, session):
            def run(msgs, **kw):
                r = client.chat.completions.create(model="qwen-test", messages=msgs, max_tokens=12, temperature=0,
                                                   extra_body={"session_id": session}, **kw)
                return r.choices[0].message.content
            m = [{"role": "user", "content": "Give a JSON object with a name."}]
            a = run(m, response_format=schema)
            m += [{"role": "assistant", "content": a}, {"role": "user", "content": "Now say hello in French."}]
            b = run(m, logprobs=True)
            m += [{"role": "assistant", "content": b}, {"role": "user", "content": "And in German?"}]
            return a, b, run(m)

        want = turns(SERVER, SERVER.client(), "step-plain")
        got = turns(spec, spec.client(), "step-spec")
        assert got == want, (got, want)
        reasons = re.findall(r"llm_turn_stats session_id=step-spec reason=(\w+)", spec.logs())
        assert reasons == ["new", "exact_prefix", "exact_prefix"], reasons
    finally:
        spec.stop()
        draft.unlink(missing_ok=True)


def main():
    return run_tests(globals(), setup_module, teardown_module)


if __name__ == "__main__":
    raise SystemExit(main())

