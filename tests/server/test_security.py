#!/usr/bin/env python3
"""Security tests of `hearth serve` (issue 19), against the real binary.

What a web page, a slow client or a malformed agent request can do to the
server, checked over the wire (raw HTTP, so every header is under the test's
control):
- browser-style requests refused: a text/plain "simple" POST (415), a foreign
  Origin (403), a foreign Host as after DNS rebinding (403); no CORS headers
  unless --cors-origin, and then only for that origin, preflight answered;
- the API key: empty is a startup error (--api-key "", HEARTH_API_KEY="",
  a blank --api-key-file); --api-key-file and HEARTH_API_KEY work; 401 carries
  WWW-Authenticate, 429 carries Retry-After;
- session reset/delete of an unknown session is 404;
- time limits: a slowloris client sending its headers byte by byte is cut off
  within --header-timeout, an idle keep-alive connection within
  --idle-timeout, a stalled body gets 408 within --body-timeout;
- a prompt too long for the context by its byte length alone is refused
  before tokenizing, four at once, and /health stays responsive meanwhile;
- strict request validation: errors name the JSON path;
- the sampling parameters min_p, presence/frequency/repeat penalties, seed are
  accepted within their ranges and refused outside them (seed: any 64-bit
  integer, 0 and negatives included, as OpenAI's schema allows);
- anonymous requests (no session id) continue their own tenant's resident
  conversation, never another tenant's: a request of another `cache_salt`
  learns nothing through `cached_tokens`.

Uses SmolLM2-135M (the smallest packaged model): nothing here depends on what
the model says. Run: python3 tests/server/test_security.py
"""
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import BIN, MODEL_ID, Server, http, model_path, request, run_tests

KEY = "sec-key-1"
FILE_KEY = "file-key-2"
ORIGIN = "https://app.example"
CTX = 2048
HEADER_S, BODY_S, IDLE_S = 1.5, 1.5, 2.0
A = B = None  # A: defaults (key from HEARTH_API_KEY), short timeouts; B: key file, CORS, allowed host
TMP = None
MSGS = [{"role": "user", "content": "Hi"}]


def model():
    return model_path("smollm2-135m")


def setup_module(module=None):
    global A, B, TMP
    TMP = Path(tempfile.mkdtemp(prefix="hearth-sec-"))
    env = dict(os.environ, HEARTH_API_KEY=KEY)
    A = Server("--max-sessions", "1", "--max-body-mib", "1", "--header-timeout", str(HEADER_S),
               "--body-timeout", str(BODY_S), "--idle-timeout", str(IDLE_S),
               ctx=CTX, api_key=KEY, model=model(), env=env)
    key_file = TMP / "key"
    key_file.write_text(f"  {FILE_KEY}\n")
    env_b = {k: v for k, v in os.environ.items() if k != "HEARTH_API_KEY"}
    B = Server("--api-key-file", str(key_file), "--cors-origin", ORIGIN, "--allowed-hosts", "my.box,other.box",
               ctx=CTX, api_key=FILE_KEY, model=model(), env=env_b)


def teardown_module(module=None):
    for s in (A, B):
        if s is not None:
            assert s.stop() == 0


def chat(server, headers=None, **body):
    return request(server, "POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1, **body}, headers)


def error_code(text):
    return json.loads(text)["error"]["code"]


# --- browser-style requests --------------------------------------------------

def test_json_routes_need_the_json_content_type():
    body = json.dumps({"messages": MSGS, "max_tokens": 1}).encode()
    for path in ("/v1/chat/completions", "/v1/completions", "/apply-template"):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            status, _, text = request(A, "POST", path, raw=body, headers={"Content-Type": ctype})
            assert status == 415 and error_code(text) == "unsupported_media_type", (path, ctype, status, text)
    status, _, text = request(A, "POST", "/v1/chat/completions", raw=body,
                              headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 200, text


def test_foreign_origin_is_refused_without_cors_headers():
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{A.port + 1}"):
        for method, path, body in (("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1}),
                                   ("GET", "/v1/models", None), ("GET", "/health", None),
                                   ("POST", "/v1/sessions/x/reset", None)):
            status, headers, text = request(A, method, path, body, headers={"Origin": origin})
            assert status == 403 and error_code(text) == "origin_not_allowed", (origin, path, status, text)
            assert origin in json.loads(text)["error"]["message"]
            assert "access-control-allow-origin" not in headers
    # A preflight from a foreign origin gets no CORS answer.
    status, headers, _ = request(A, "OPTIONS", "/v1/chat/completions",
                                 headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "content-type"})
    assert status == 403 and not any(h.startswith("access-control-") for h in headers), (status, headers)
    # Same origin (a page served from this very address) is not cross-origin.
    status, headers, _ = chat(A, headers={"Origin": f"http://{A.host}:{A.port}"})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_foreign_host_is_refused():
    for host in ("evil.example", f"evil.example:{A.port}", f"rebind.attacker.test:{A.port}", "my.box"):
        for path in ("/v1/models", "/health"):
            status, _, text = request(A, "GET", path, headers={"Host": host})
            assert status == 403 and error_code(text) == "host_not_allowed", (host, status, text)
            assert f"'{host}'" in json.loads(text)["error"]["message"]
    status, _, text = chat(A, headers={"Host": f"evil.example:{A.port}"})
    assert status == 403 and error_code(text) == "host_not_allowed"
    for host in (f"localhost:{A.port}", f"127.0.0.1:{A.port}", "localhost", "127.0.0.2"):
        status, _, _ = request(A, "GET", "/v1/models", headers={"Host": host})
        assert status == 200, host


def test_cors_only_for_the_configured_origin():
    # Preflight: answered without a key (browsers send none), for the origin only.
    status, headers, _ = request(B, "OPTIONS", "/v1/chat/completions",
                                 headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "authorization, content-type",
                                          "Authorization": None})
    assert status == 204, (status, headers)
    assert headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"]
    status, headers, text = chat(B, headers={"Origin": ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN, (status, headers, text)
    assert "Origin" in headers.get("vary", "")
    # Errors reach the page too (it can read why), still only for that origin.
    status, headers, _ = request(B, "GET", "/v1/models", headers={"Origin": ORIGIN, "Authorization": None})
    assert status == 401 and headers["access-control-allow-origin"] == ORIGIN
    status, headers, text = chat(B, headers={"Origin": "https://other.example"})
    assert status == 403 and error_code(text) == "origin_not_allowed"
    assert "access-control-allow-origin" not in headers
    # No Origin (not a browser): no CORS headers.
    status, headers, _ = request(B, "GET", "/v1/models")
    assert status == 200 and "access-control-allow-origin" not in headers
    # Server A was started without --cors-origin: never any CORS header.
    status, headers, _ = request(A, "GET", "/v1/models", headers={"Origin": f"http://{A.host}:{A.port}"})
    assert status == 200 and not any(h.startswith("access-control-") for h in headers)


def test_allowed_hosts_extend_the_defaults():
    for host in (f"my.box:{B.port}", "other.box", f"localhost:{B.port}"):
        status, _, _ = request(B, "GET", "/v1/models", headers={"Host": host})
        assert status == 200, host
    status, _, text = request(B, "GET", "/v1/models", headers={"Host": f"evil.example:{B.port}"})
    assert status == 403 and error_code(text) == "host_not_allowed"


# --- API key, 401, 429, sessions ---------------------------------------------

def test_api_key_from_environment_and_file_and_401_header():
    for server, good in ((A, KEY), (B, FILE_KEY)):
        status, _, _ = request(server, "GET", "/v1/models", headers={"Authorization": f"Bearer {good}"})
        assert status == 200
        for auth in (None, "Bearer wrong", f"Bearer {good}x", "Basic abc"):
            status, headers, text = request(server, "GET", "/v1/models", headers={"Authorization": auth})
            assert status == 401 and error_code(text) == "invalid_api_key", (auth, status)
            assert headers.get("www-authenticate") == "Bearer", headers
    # B's file held the key with surrounding whitespace: trimmed.
    status, _, _ = request(B, "GET", "/v1/models", headers={"Authorization": f"Bearer   {FILE_KEY}  "})
    assert status == 200


def test_new_routes_keep_every_check():
    """The Anthropic and Responses routes sit behind the same Host, Origin,
    content-type and API-key checks, each answered in its API's own shape."""
    m = MODEL_ID
    routes = (("POST", "/v1/messages", {"model": m, "max_tokens": 1, "messages": MSGS}),
              ("POST", "/v1/messages/count_tokens", {"model": m, "messages": MSGS}),
              ("POST", "/v1/responses", {"model": m, "input": "hi", "max_output_tokens": 1}),
              ("GET", "/v1/responses/resp_x", None), ("DELETE", "/v1/responses/resp_x", None),
              ("POST", "/api/chat", {"model": m, "messages": MSGS, "stream": False}),
              ("POST", "/api/generate", {"model": m, "prompt": "hi", "stream": False}),
              ("GET", "/api/tags", None), ("POST", "/api/show", {"model": m}))

    def shape(path, text, openai_code, anthropic_type):
        e = json.loads(text)
        if path.startswith("/v1/messages"):
            assert e["type"] == "error" and e["error"]["type"] == anthropic_type, (path, e)
        elif path.startswith("/api/"):
            assert isinstance(e["error"], str) and e["error"], (path, e)  # Ollama's shape
            return
        else:
            assert e["error"]["code"] == openai_code, (path, e)
        assert e["error"]["message"], e

    for method, path, body in routes:
        status, _, text = request(A, method, path, body, headers={"Host": f"evil.example:{A.port}"})
        assert status == 403, (path, status, text)
        shape(path, text, "host_not_allowed", "permission_error")
        status, headers, text = request(A, method, path, body, headers={"Origin": "http://evil.example"})
        assert status == 403 and "access-control-allow-origin" not in headers, (path, status, text)
        shape(path, text, "origin_not_allowed", "permission_error")
        for auth in ({"Authorization": None}, {"Authorization": "Bearer wrong"},
                     {"Authorization": None, "x-api-key": "wrong"}):
            status, headers, text = request(A, method, path, body, headers=auth)
            assert status == 401 and headers.get("www-authenticate") == "Bearer", (path, auth, status, text)
            shape(path, text, "invalid_api_key", "authentication_error")
        if body is not None:
            status, _, text = request(A, method, path, raw=json.dumps(body).encode(),
                                      headers={"Content-Type": "text/plain"})
            assert status == 415, (path, status, text)
            shape(path, text, "unsupported_media_type", "invalid_request_error")
    # Anthropic's clients send the key as x-api-key.
    status, _, text = request(A, "POST", "/v1/messages", routes[0][2], headers={"Authorization": None, "x-api-key": KEY})
    assert status == 200, text


def test_empty_api_key_is_a_startup_error():
    blank = TMP / "blank"
    blank.write_text(" \n")
    base = [BIN, "serve", "-m", model(), "--port", "0"]
    env_clean = {k: v for k, v in os.environ.items() if k != "HEARTH_API_KEY"}
    cases = [(["--api-key", ""], env_clean), (["--api-key", "  "], env_clean), ([], dict(env_clean, HEARTH_API_KEY="")),
             (["--api-key-file", str(blank)], env_clean),
             (["--api-key-file", str(TMP / "missing")], env_clean)]
    for extra, env in cases:
        t0 = time.monotonic()
        r = subprocess.run(base + extra, capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode != 0, (extra, r.stdout, r.stderr)
        assert "ready" not in r.stdout and "listening" not in r.stdout, (extra, r.stdout)
        assert ("empty" in r.stderr) or ("missing" in r.stderr), (extra, r.stderr)
        assert time.monotonic() - t0 < 30


def test_unknown_sessions_are_404_and_known_ones_reset_and_close():
    for method, path in (("POST", "/v1/sessions/never-seen/reset"), ("DELETE", "/v1/sessions/never-seen")):
        status, _, text = request(A, method, path)
        assert status == 404 and error_code(text) == "session_not_found", (method, status, text)
    status, _, _ = chat(A, session_id="s-404")
    assert status == 200
    status, _, text = request(A, "POST", "/v1/sessions/s-404/reset")
    assert status == 200 and json.loads(text) == {"reset": True, "session_id": "s-404"}
    status, _, _ = request(A, "DELETE", "/v1/sessions/s-404")
    assert status == 200
    status, _, text = request(A, "DELETE", "/v1/sessions/s-404")
    assert status == 404 and error_code(text) == "session_not_found"


def test_429_has_retry_after():
    """A runs one KV state (--max-sessions 1): while a streamed generation
    holds it, another session is refused for capacity."""
    host, port = A.host, A.port
    body = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
                       "stream": True, "session_id": "busy-1", "temperature": 0}).encode()
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        got = b""
        while b"data:" not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        status, headers, text = chat(A, session_id="other-1")
    assert status == 429 and error_code(text) == "capacity_exhausted", (status, text)
    assert headers.get("retry-after") == "1", headers


# --- time limits ----------------------------------------------------------------

def closed_after(sock, send=None, limit=15.0):
    """Seconds until the server closes `sock` (reads until EOF or reset),
    calling `send(sock)` every 0.25 s meanwhile; None past `limit`."""
    t0 = time.monotonic()
    sock.settimeout(0.25)
    while time.monotonic() - t0 < limit:
        try:
            if not sock.recv(4096):
                return time.monotonic() - t0
        except socket.timeout:
            if send:
                try:
                    send(sock)
                except OSError:
                    return time.monotonic() - t0
        except OSError:
            return time.monotonic() - t0
    return None


def test_slowloris_headers_are_cut_off():
    with socket.create_connection((A.host, A.port)) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {A.host}:{A.port}\r\n".encode())
        n = [0]

        def drip(sock):  # one more header byte, never the end of the head
            sock.sendall(b"x-slow-%d: 1\r\n" % n[0])
            n[0] += 1

        t = closed_after(s, drip)
    assert t is not None and HEADER_S - 0.3 <= t <= HEADER_S + 1.5, t
    assert n[0] >= 3, "the client kept sending: bytes must not extend the header deadline"


def test_idle_connections_are_closed():
    with socket.create_connection((A.host, A.port)) as s:
        t = closed_after(s)
    assert t is not None and IDLE_S - 0.3 <= t <= IDLE_S + 1.5, t
    # After a complete request on a keep-alive connection: idle from the response on.
    with socket.create_connection((A.host, A.port)) as s:
        s.sendall(f"GET /health HTTP/1.1\r\nHost: {A.host}:{A.port}\r\n\r\n".encode())
        got = b""
        while b'"ok"' not in got:
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200"), got
        t = closed_after(s)
    assert t is not None and IDLE_S - 0.3 <= t <= IDLE_S + 1.5, t


def test_stalled_body_gets_408():
    with socket.create_connection((A.host, A.port)) as s:
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {A.host}:{A.port}\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode() + b'{"mes')
        t0 = time.monotonic()
        s.settimeout(BODY_S + 5)
        got = b""
        while True:
            try:
                chunk = s.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        t = time.monotonic() - t0
    assert got.startswith(b"HTTP/1.1 408"), got
    assert b"request_timeout" in got
    assert BODY_S - 0.3 <= t <= BODY_S + 2.0, t


# --- bounded work before admission ---------------------------------------------

def test_long_prompt_refused_by_byte_length_before_tokenizing():
    text = "word " * 180_000  # 900 kB: under the 1 MiB body limit, far over 2048 tokens
    health = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.monotonic()
            status, _, _ = request(A, "GET", "/health")
            health.append((status, time.monotonic() - t0))
            time.sleep(0.05)

    results = []

    def send(path, body):
        t0 = time.monotonic()
        status, _, out = request(A, "POST", path, body)
        results.append((status, out, time.monotonic() - t0))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
                           ("/v1/completions", {"prompt": text})):
            # Four at once, as in the report (there 14.7 MB bodies stalled /health for 5.6 s).
            senders = [threading.Thread(target=send, args=(path, body)) for _ in range(4)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
    finally:
        stop.set()
        poller.join()
    assert len(results) == 8
    for status, out, seconds in results:
        assert status == 400 and error_code(out) == "context_length_exceeded", (status, out[:300])
        assert "at least" in json.loads(out)["error"]["message"], out[:300]
        assert seconds < 5, seconds
    assert health and all(s == 200 for s, _ in health)
    assert max(d for _, d in health) < 2.0, max(d for _, d in health)


# --- strict validation ----------------------------------------------------------

def test_malformed_tools_and_messages_name_the_json_path():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asst = {"role": "assistant", "content": None}
    cases = [
        ({"messages": [MSGS[0], MSGS[0], dict(asst, tool_calls=[dict(call, function={"name": "f", "arguments": "{not json"})])]},
         "messages[2].tool_calls[0].function.arguments: not valid JSON"),
        ({"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
         "tools[0].function.parameters: must be an object"),
        ({"messages": MSGS, "tools": [tool, {"type": "function", "function": {"parameters": {}}}]},
         "tools[1].function.name: required"),
        ({"messages": [dict(asst, tool_calls={"id": "c1"})]}, "messages[0].tool_calls: must be an array"),
        ({"messages": [dict(asst, tool_calls=[{"id": "c1", "type": "function"}])]},
         "messages[0].tool_calls[0].function: required"),
        ({"messages": [{"role": "hacker", "content": "x"}]}, "messages[0].role: unknown role 'hacker'"),
        ({"messages": [{"role": "user", "content": {"text": "x"}}]},
         "messages[0].content: must be a string or an array of content parts"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
         "messages[0].content[0].type: content part type 'input_audio' is not accepted here"),
        ({"messages": [MSGS[0], {"role": "tool", "content": "r"}]}, "messages[1].tool_call_id: required"),
        ({"messages": MSGS, "n": 0}, "n must be a positive integer"),
    ]
    for body, want in cases:
        status, out = http(A, "POST", "/v1/chat/completions", body)
        assert status == 400, (body, status, out)
        assert out["error"]["message"].startswith(want), (want, out)
    status, out = http(A, "POST", "/v1/chat/completions", {"messages": MSGS, "n": 2})
    assert status == 400 and out["error"]["code"] == "unsupported_parameter" and "n>1" in out["error"]["message"]


def test_sampling_parameters_in_range_are_honored_and_out_of_range_refused():
    ok = {"min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1,
          "repeat_last_n": 32, "seed": 7, "temperature": 0.8}
    status, _, text = chat(A, **ok)
    assert status == 200, text
    for field, value in (("min_p", 1.5), ("presence_penalty", 2.5), ("frequency_penalty", -3),
                         ("repeat_penalty", 0), ("repeat_last_n", -1), ("seed", 2**63)):
        status, _, text = chat(A, **{field: value})
        assert status == 400 and error_code(text) == "invalid_value" and field in text, (field, status, text)
    for value in (1.5, "7", -2**64):
        status, _, text = chat(A, seed=value)
        assert status == 400 and "'seed' must be an integer" in text, (value, status, text)
    # OpenAI's seed is any 64-bit integer: 0 and negatives are seeds like
    # any other (the same seed, the same sample).
    for seed in (0, -1, -2**63 + 1, 2**63 - 1):
        replies = []
        for _ in range(2):
            status, _, text = chat(A, seed=seed, temperature=1.5, max_tokens=8)
            assert status == 200, (seed, text)
            replies.append(json.loads(text)["choices"][0]["message"]["content"])
        assert replies[0] == replies[1], (seed, replies)


def test_anonymous_requests_reveal_nothing_through_cached_tokens():
    # One tenant (cache_salt "alice") sends a secret without a session id;
    # another tenant ("mallory", or no salt at all) guesses it. Anonymous
    # requests continue only their own tenant's conversations, so every
    # guess sees no cached tokens whether or not it matches.
    secret = [{"role": "user", "content": "My PIN is 4 8 1 5 9 2. Remember it."}]
    status, _, text = chat(B, messages=secret, cache_salt="alice")
    assert status == 200, text
    # Each guess from a tenant of its own (a tenant's second guess would
    # reuse its first one's prompt, which says nothing about alice's).
    for salt, guess in (("mallory-1", "4 8 1 5 9 2"), ("mallory-2", "7 7 7 7 7 7")):
        probe = [{"role": "user", "content": f"My PIN is {guess}. Remember it."}]
        status, _, text = chat(B, messages=probe, cache_salt=salt)
        assert status == 200, text
        usage = json.loads(text)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0, (salt, guess, usage)
    # The unsalted tenant (everyone else on this server) shares its own
    # earlier prompts (the template's system prompt): a wrong guess, then the
    # right one, which reuses the wrong one's text up to the PIN and no
    # further (alice's session would have matched all of it).
    for guess in ("7 7 7 7 7 7", "4 8 1 5 9 2"):
        probe = [{"role": "user", "content": f"My PIN is {guess}. Remember it."}]
        status, _, text = chat(B, messages=probe)
        assert status == 200, text
    usage = json.loads(text)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - 6, usage
    # The tenant itself continues its conversation without naming it.
    status, _, text = chat(B, messages=secret, cache_salt="alice")
    usage = json.loads(text)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 1, usage
    # A named session still reuses its own prompt.
    for turn in range(2):
        status, _, text = chat(B, messages=secret, session_id="mine")
        assert status == 200, text
    cached = json.loads(text)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0, text


def main():
    return run_tests(globals(), setup_module, teardown_module)


if __name__ == "__main__":
    raise SystemExit(main())
