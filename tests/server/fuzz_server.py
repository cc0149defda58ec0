"""Hostile requests against a real `hearth serve`: thousands of malformed,
oversized and adversarial requests in named categories, sent over raw
sockets (so broken framing reaches the server as written), with one server
process for the whole run, never restarted.

Per category it reports the count, the status histogram, the 5xx answers,
the hangs (no answer within the limit: the body timeout plus a margin for
requests that stall on purpose, a generous limit for the rest) and whether
the process died; and the server's RSS after warm-up, at the end, and after
every session was cleared (DELETE /v1/sessions).

    python3 tests/server/fuzz_server.py                    # the test command's short run (~1,000)
    python3 tests/server/fuzz_server.py --requests 10000   # the full run (BENCHMARKS.md)
    python3 tests/server/fuzz_server.py --model qwen2.5-coder-0.5b --json out.json

It fails (exit 1) on any abort, any 5xx other than the injected panics'
500s, any hang, an injected panic that did not answer 500 or that took the
server down, or RSS after clearing more than 10% above its post-warm-up
value. The server runs with fault injection on (HEARTH_FAULT_INJECTION=1):
the `x-hearth-fault` header panics in the request handler or in the
engine's step of that request's turn.
"""
import argparse
import base64
import collections
import concurrent.futures as futures
import json
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Server, model_path  # noqa: E402

BODY_TIMEOUT = 3.0
HEADER_TIMEOUT = 3.0
# A request that generates (max_tokens <= 8 here) answers well within this.
ANSWER_LIMIT = 60.0


# ---------------------------------------------------------------- HTTP over a raw socket

class Hang(Exception):
    pass


def build(host, method="POST", path="/v1/chat/completions", headers=None, body=b"",
          content_type="application/json", length=True):
    """Request bytes: the request line, Host, a content type and length
    (unless told otherwise), `headers` (a list of (name, value) byte or str
    pairs, sent as given), the body."""
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + host.encode()]
    if content_type is not None:
        lines.append(b"Content-Type: " + content_type.encode())
    if length and body is not None:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    for k, v in headers or []:
        k = k.encode() if isinstance(k, str) else k
        v = v.encode() if isinstance(v, str) else v
        lines.append(k + b": " + v)
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def read_response(sock, deadline):
    """(status, body bytes) of the first response on `sock`; None for the
    status when the server closed without answering. Raises Hang past
    `deadline`."""
    buf = b""

    def more():
        nonlocal buf
        left = deadline - time.monotonic()
        if left <= 0:
            raise Hang()
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise Hang()
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        buf += chunk
        return bool(chunk)

    while b"\r\n\r\n" not in buf:
        if not more():
            return None, buf
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return None, head
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    buf = rest
    if b"content-length" in headers:
        n = int(headers[b"content-length"])
        while len(buf) < n:
            if not more():
                break
        return status, buf[:n]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        # Read to the last chunk (a streamed reply ends with "0\r\n\r\n").
        while not buf.endswith(b"0\r\n\r\n"):
            if not more():
                break
        return status, buf
    return status, buf


def send(host, port, data, *, limit, after_send=None, stall_after=None):
    """Sends `data` (bytes, or a list of byte pieces sent with small pauses)
    and reads the answer. `stall_after`: send only that many bytes, then wait
    (the server must answer within the body or header timeout).
    `after_send(sock)`: called once the request is out (a client that
    disconnects mid-stream). Returns (status or None, body, seconds)."""
    t0 = time.monotonic()
    deadline = t0 + limit
    with socket.create_connection((host, port), timeout=10) as sock:
        pieces = data if isinstance(data, list) else [data]
        try:
            for i, p in enumerate(pieces):
                if stall_after is not None:
                    p = p[:stall_after]
                sock.sendall(p)
                if i + 1 < len(pieces):
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (and close) before all of it is sent
        if after_send is not None:
            return after_send(sock), b"", time.monotonic() - t0
        status, body = read_response(sock, deadline)
    return status, body, time.monotonic() - t0


# ---------------------------------------------------------------- request generators

def chat_body(model, **kw):
    b = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    b.update(kw)
    return b


def dumps(v):
    return json.dumps(v, allow_nan=True)


class Gen:
    """Each method builds one request of its category from the rng:
    returns a dict with `data` (bytes or pieces) and optionally `limit`,
    `stall_after`, `after_send`, `expect` (a set of statuses that must come)."""

    def __init__(self, host, model, rng):
        self.host, self.model, self.rng = host, model, rng

    def req(self, body, **kw):
        if not isinstance(body, (bytes, str)):
            body = dumps(body)
        return {"data": build(self.host, body=body, **kw)}

    def valid(self):
        r = self.rng
        body = chat_body(self.model)
        if r.random() < 0.3:
            body["stream"] = True
        if r.random() < 0.2:
            body["temperature"] = r.choice([0, 0.7, 1.5])
        return body

    # 1
    def broken_json(self):
        r = self.rng
        good = dumps(self.valid())
        kind = r.randrange(8)
        if kind == 0:
            body = good[: r.randrange(len(good))]
        elif kind == 1:
            b = bytearray(good.encode())
            for _ in range(r.randint(1, 6)):
                b[r.randrange(len(b))] = r.randrange(256)
            body = bytes(b)
        elif kind == 2:
            body = good + r.choice(["}", "]", ",", "garbage", "\x00", "{}", " 1"])
        elif kind == 3:
            body = r.choice(["", " ", "null", "[]", "1", '"x"', "true", "{", "}", "{{}}", "[{}]", "\ufeff{}"])
        elif kind == 4:
            body = good.replace('"', "'", r.randint(1, 4))
        elif kind == 5:
            body = good.replace(":", "", 1)
        elif kind == 6:
            body = '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "max_tokens": 3}' % self.model
        else:
            body = good.replace("{", "{/*c*/", 1)
        return self.req(body)

    # 2
    def wrong_types(self):
        r = self.rng
        body = self.valid()
        field = r.choice(["model", "messages", "max_tokens", "temperature", "top_p", "stream", "stop", "seed",
                          "n", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs",
                          "stream_options", "session_id", "presence_penalty", "frequency_penalty",
                          "logit_bias", "user", "cache_salt", "max_completion_tokens", "parallel_tool_calls"])
        body[field] = r.choice([None, True, False, 0, -1, 1.5, "x", "", [], [1, "a"], {}, {"a": 1}, [[[]]], "1e3"])
        if r.random() < 0.3 and field != "messages":
            m = body["messages"][0]
            m[r.choice(["role", "content", "name", "tool_calls", "tool_call_id"])] = r.choice(
                [None, 1, [], {}, [{"type": "text"}], [{"type": "text", "text": 5}], [{"type": "bogus"}], True])
        return self.req(body)

    # 3
    def out_of_range(self):
        r = self.rng
        body = self.valid()
        field = r.choice(["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                          "n", "top_logprobs", "presence_penalty", "frequency_penalty", "repeat_penalty"])
        body[field] = r.choice([-1, 0, -0.0, 1e-300, 1e300, 2**63, 2**64, -(2**63) - 1, 10**40, 1e308 * 10, 3.5,
                                -1e300, 2**31, 2**53 + 1, 100, 101, 1000000000])
        return self.req(body)

    # 4
    def roles(self):
        r = self.rng
        body = self.valid()
        kind = r.randrange(8)
        if kind == 0:
            body["messages"] = []
        elif kind == 1:
            body["messages"] = [{"role": r.choice(["robot", "", "SYSTEM", "function", "tool", "developer", "\x00"]),
                                 "content": "x"}]
        elif kind == 2:
            body["messages"] = [{"role": "assistant", "content": None,
                                 "tool_calls": r.choice([[], [{}], [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}],
                                                         [{"id": 1, "type": "x"}], "nope"])}]
        elif kind == 3:
            body["messages"] = [{"role": "tool", "content": "out"}, {"role": "user", "content": "hi"}]
        elif kind == 4:
            body["messages"] = [{"role": "system", "content": "s"}] * r.randint(1, 50)
        elif kind == 5:
            body["messages"] = [{"role": r.choice(["user", "assistant"]), "content": "x"} for _ in range(r.randint(100, 2000))]
        elif kind == 6:
            body["messages"] = [{"role": "user"}]
        else:
            body["messages"] = [{"role": "assistant", "content": "prefill"}]
        return self.req(body)

    # 5
    def nesting(self):
        r = self.rng
        depth = r.choice([50, 100, 126, 127, 128, 129, 200, 1000, 10000, 100000])
        kind = r.randrange(4)
        if kind == 0:
            inner = "[" * depth + "]" * depth
            body = '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "metadata": %s}' % (self.model, inner)
        elif kind == 1:
            inner = '{"a":' * depth + "1" + "}" * depth
            body = '{"model": "%s", "messages": [{"role": "user", "content": %s}], "max_tokens": 2}' % (self.model, inner)
        elif kind == 2:
            body = "[" * depth + "]" * depth
        else:
            inner = '{"a":' * depth + "1" + "}" * depth
            body = ('{"model": "%s", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, '
                    '"tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]}' % (self.model, inner))
        return self.req(body)

    # 6
    def big_bodies(self):
        r = self.rng
        kind = r.randrange(5)
        if kind == 0:
            n = r.choice([10_000, 100_000, 1_000_000])
            body = dumps(chat_body(self.model, messages=[{"role": "user", "content": "word " * n}]))
            return self.req(body)
        if kind == 1:  # declared far larger than the limit, nothing sent
            return {"data": build(self.host, body=b"", length=False, headers=[("Content-Length", str(r.choice([2**31, 2**40, 10**18])))]),
                    "limit": BODY_TIMEOUT + 5}
        if kind == 2:  # just over the limit (the run's server has 2 MiB)
            return self.req(b'{"a": "' + b"x" * (2 * 1024 * 1024 + 10) + b'"}')
        if kind == 3:
            body = dumps(chat_body(self.model, stop=["x" * 1000] * r.choice([4, 5, 100])))
            return self.req(body)
        body = dumps(chat_body(self.model, messages=[{"role": "user", "content": [{"type": "text", "text": "a"}] * r.choice([10, 1000, 50000])}]))
        return self.req(body)

    # 7
    def bad_utf8(self):
        r = self.rng
        payload = r.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80", b"\xf4\x90\x80\x80", b"\x00", b"a\x00b",
                            b"\\u0000", b"\\ud800", b"\\udc00\\ud800", b"\\uDFFF", b"\xef\xbb\xbf", b"\xe2\x80\xae",
                            b"\\u001b[2J"])
        where = r.randrange(4)
        if where == 0:
            body = b'{"model": "' + self.model.encode() + b'", "messages": [{"role": "user", "content": "x' + payload + b'y"}], "max_tokens": 2}'
        elif where == 1:
            body = b'{"model": "' + self.model.encode() + payload + b'", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
        elif where == 2:
            body = b'{"model": "' + self.model.encode() + b'", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "session_id": "s' + payload + b'"}'
        else:
            body = b'{"model": "' + self.model.encode() + b'", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stop": ["' + payload + b'"]}'
        return self.req(body)

    # 8
    def headers(self):
        r = self.rng
        body = dumps(self.valid())
        kind = r.randrange(12)
        if kind == 0:
            return self.req(body, headers=[("X-Big", "a" * r.choice([8000, 70000, 300000]))])
        if kind == 1:
            return self.req(body, headers=[(f"X-H{i}", "v") for i in range(r.choice([100, 1000]))])
        if kind == 2:
            return self.req(body, content_type=r.choice(["text/plain", "application/jsonx", "", "application/json; charset=\xff",
                                                         "multipart/form-data; boundary=x", "APPLICATION/JSON"]))
        if kind == 3:
            return self.req(body, content_type=None)
        if kind == 4:  # two lengths
            return {"data": build(self.host, body=body, headers=[("Content-Length", str(len(body) + 1))])}
        if kind == 5:  # length shorter than the body
            return {"data": build(self.host, body=body, length=False, headers=[("Content-Length", str(max(0, len(body) - 5)))])}
        if kind == 6:  # length longer than the body: stalls
            return {"data": build(self.host, body=body, length=False, headers=[("Content-Length", str(len(body) + 100))]),
                    "limit": BODY_TIMEOUT + 5}
        if kind == 7:
            return {"data": build(r.choice(["evil.example", "", "127.0.0.1:1", "localhost:99999", "[::1", "a b"]), body=body)}
        if kind == 8:
            return self.req(body, headers=[("Origin", r.choice(["http://evil.example", "null", "file://", "http://localhost:1"]))])
        if kind == 9:
            return self.req(body, headers=[("Authorization", r.choice(["Bearer", "Bearer x" * 1000, "Basic ???", "\x7f"]))])
        if kind == 10:
            return {"data": b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + self.host.encode() + b"\r\nX-Bad: a\x00b\r\nContent-Length: 2\r\n\r\n{}"}
        return {"data": r.choice([b"GARBAGE\r\n\r\n", b"POST / HTTP/9.9\r\n\r\n", b"\r\n\r\n", b"GET /health HTTP/1.1\r\n\r\n",
                                  b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
                                  b"GET /health HTTP/1.1\r\nHost: " + self.host.encode() + b"\r\nHost: b\r\n\r\n"])}

    # 9
    def chunked(self):
        r = self.rng
        body = dumps(self.valid()).encode()
        te = [("Transfer-Encoding", "chunked")]
        good = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        kind = r.randrange(14)
        if kind == 0:
            chunks = good
        elif kind == 1:  # a size no body can have, nothing after it
            chunks = r.choice([b"ffffffffffffffff", b"7fffffffffffffff", b"100000000", b"FFFFFFFF"]) + b"\r\n" + body[:20]
            return {"data": build(self.host, body=chunks, length=False, headers=te), "limit": BODY_TIMEOUT + 5}
        elif kind == 2:  # overflows 64 bits
            chunks = b"1" + b"0" * 20 + b"\r\n" + body + b"\r\n0\r\n\r\n"
        elif kind == 3:
            chunks = r.choice([b"zz", b"-1", b"", b" ", b"0x10", b"1 2"]) + b"\r\n" + body + b"\r\n0\r\n\r\n"
        elif kind == 4:  # no CRLF after the data
            chunks = b"%x\r\n" % len(body) + body + b"XX0\r\n\r\n"
        elif kind == 5:  # size smaller than the data
            chunks = b"%x\r\n" % (len(body) // 2) + body + b"\r\n0\r\n\r\n"
        elif kind == 6:  # size larger than the data: stalls
            chunks = b"%x\r\n" % (len(body) + 50) + body
            return {"data": build(self.host, body=chunks, length=False, headers=te), "limit": BODY_TIMEOUT + 5}
        elif kind == 7:  # extensions
            chunks = b"%x;" % len(body) + b"a=" + b"b" * r.choice([10, 10000, 100000]) + b"\r\n" + body + b"\r\n0\r\n\r\n"
        elif kind == 8:  # trailers
            chunks = b"%x\r\n" % len(body) + body + b"\r\n0\r\n" + b"X-T: 1\r\n" * r.choice([1, 100, 10000]) + b"\r\n"
        elif kind == 9:  # chunked and a length
            return {"data": build(self.host, body=good, headers=te)}
        elif kind == 10:  # one byte a chunk, sent in pieces
            pieces = [b"1\r\n" + body[i:i + 1] + b"\r\n" for i in range(0, min(len(body), 40))]
            head = build(self.host, body=b"", length=False, headers=te)
            return {"data": [head] + pieces[:5] + [b"".join(pieces[5:]) + b"".join(b"1\r\n" + body[i:i + 1] + b"\r\n" for i in range(40, len(body))) + b"0\r\n\r\n"]}
        elif kind == 11:  # never ends (no last chunk)
            chunks = b"%x\r\n" % len(body) + body + b"\r\n"
            return {"data": build(self.host, body=chunks, length=False, headers=te), "limit": BODY_TIMEOUT + 5}
        elif kind == 12:
            te = [("Transfer-Encoding", r.choice(["gzip, chunked", "chunked, identity", "identity", "xchunked", "chunked\x00"]))]
            chunks = good
        else:  # many chunks summing past the body limit (2 MiB)
            piece = b"x" * 65536
            chunks = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(40)) + b"0\r\n\r\n"
        return {"data": build(self.host, body=chunks, length=False, headers=te)}

    def schema(self):
        """A JSON schema, sometimes enormous, deep or odd."""
        r = self.rng
        kind = r.randrange(16)
        n = r.choice([10, 100, 1000, 3000, 10000, 100000])
        if kind == 0:
            return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(n)}, "required": [f"k{i}" for i in range(n)]}
        if kind == 1:
            return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(min(n, 20000))}}
        if kind == 2:
            return {"enum": [f"v{i}" for i in range(n)]}
        if kind == 3:
            s = {"type": "integer"}
            for _ in range(r.choice([10, 30, 60, 63, 64, 100, 200])):
                s = {"type": "array", "items": s}
            return s
        if kind == 4:
            s = {"type": "string"}
            for i in range(r.choice([10, 30, 60, 100, 200])):
                s = {"type": "object", "properties": {f"p{i}": s}, "required": [f"p{i}"]}
            return s
        if kind == 5:
            return {"anyOf": [{"type": "object", "properties": {f"a{i}": {"type": "integer"}}, "required": [f"a{i}"]} for i in range(min(n, 5000))]}
        if kind == 6:
            return {"type": "string", "pattern": r.choice(["(a|b){1000}", "(a*)*b", "[", "(?=a)", "\\", "a{99999999}", "(((((a)))))" * 50])}
        if kind == 7:
            return {"type": "string", "minLength": r.choice([10, 1000, 10**6, 2**63]), "maxLength": r.choice([5, 10**7])}
        if kind == 8:
            return {"type": "array", "minItems": r.choice([1, 1000, 10**6]), "maxItems": r.choice([0, 10, 10**9]), "items": {"type": "integer"}}
        if kind == 9:
            return {"$ref": r.choice(["#", "#/definitions/a", "http://example.com/s.json", "#/$defs/x"]),
                    "$defs": {"x": {"$ref": "#/$defs/x"}}, "definitions": {"a": {"$ref": "#/definitions/a"}}}
        if kind == 10:
            return {"type": r.choice(["integer", "number"]), "minimum": r.choice([0, 1e308, -1e308, 10**30]),
                    "maximum": r.choice([-1, 1e308, 10**40]), "multipleOf": r.choice([0, 1e-300, 3, -1])}
        if kind == 11:
            return r.choice([{}, True, False, None, [], "x", 1, {"type": "bogus"}, {"type": ["string", "null"]}, {"not": {}},
                             {"allOf": [{"type": "string"}, {"type": "integer"}]}, {"const": {"a": [1, 2, {"b": None}]}}])
        if kind == 12:
            return {"type": "object", "patternProperties": {"^a+$": {"type": "string"}}, "additionalProperties": False,
                    "minProperties": r.choice([0, 1, 1000])}
        if kind == 13:
            return {"oneOf": [{"type": "string", "pattern": f"^x{i}[a-z]{{{i % 50}}}$"} for i in range(min(n, 2000))]}
        if kind == 14:
            return {"type": "object", "properties": {"a" * r.choice([10, 10000, 200000]): {"type": "integer"}}, "required": ["a"]}
        return {"type": "object", "properties": {f"k{i}": {"type": "string", "enum": [f"e{j}" for j in range(50)]} for i in range(min(n, 400))}}

    # 10
    def tool_schemas(self):
        r = self.rng
        params = self.schema()
        tool = {"type": "function", "function": {"name": r.choice(["f", "get_weather", "x" * 300, "a b", "", "ünï"]), "parameters": params}}
        if r.random() < 0.5:
            tool["function"]["strict"] = True
        body = chat_body(self.model, tools=[tool] * r.choice([1, 1, 3, 200]))
        body["tool_choice"] = r.choice(["auto", "required", "none", {"type": "function", "function": {"name": "f"}},
                                        {"type": "function", "function": {"name": "nope"}}, "bogus"])
        if r.random() < 0.3:
            body["stream"] = True
        return self.req(body)

    # 11
    def response_format(self):
        r = self.rng
        kind = r.randrange(6)
        if kind == 0:
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": self.schema(), "strict": r.choice([True, False])}}
        elif kind == 1:
            fmt = {"type": r.choice(["json_object", "text", "xml", "", None])}
        elif kind == 2:
            fmt = {"type": "json_schema", "json_schema": r.choice([None, {}, {"name": "x"}, {"schema": {}}, {"name": 1, "schema": []}])}
        elif kind == 3:
            fmt = r.choice(["json", [], 1, None])
        else:
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": self.schema()}}
        body = chat_body(self.model, response_format=fmt, max_tokens=8)
        if r.random() < 0.3:
            body["stream"] = True
        return self.req(body)

    # 12
    def images(self):
        r = self.rng
        url = r.choice(["data:image/png;base64,", "data:image/png;base64,!!!!", "data:image/png;base64," + base64.b64encode(os.urandom(64)).decode(),
                        "data:image/png;base64," + "A" * 200000, "data:text/plain;base64,aGk=", "data:,hi", "http://127.0.0.1:1/x.png",
                        "file:///etc/passwd", "javascript:alert(1)", "", "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(40)).decode()])
        part = r.choice([{"type": "image_url", "image_url": {"url": url}}, {"type": "image_url", "image_url": url},
                         {"type": "image_url"}, {"type": "image_url", "image_url": {"url": url, "detail": "ultra"}},
                         {"type": "input_image", "image_url": url}])
        body = chat_body(self.model, messages=[{"role": "user", "content": [{"type": "text", "text": "what is this"}, part]}])
        return self.req(body)

    # 13
    def session_ids(self):
        r = self.rng
        sid = r.choice(["../../etc/passwd", "..", ".", "%2F..%2F", "CON", "NUL", "a/b", "a\\b", "$(rm -rf /)", "`id`", "a;b",
                        "x" * 300, "x" * 10000, "", " ", "ünï", "a b", "\u202e", "s1", "s2", "s3", "💥", "a\tb"])
        kind = r.randrange(5)
        if kind == 0:
            return self.req(chat_body(self.model, session_id=sid))
        if kind == 1:
            return self.req(dumps(chat_body(self.model)), headers=[("x-session-affinity", sid.encode("utf-8", "replace"))])
        path = "/v1/sessions/" + "".join(c if c.isascii() and c.isprintable() and c not in " \t" else "%%%02X" % (ord(c) & 0xFF) for c in sid)
        if kind == 2:
            return self.req(b"", path=path + r.choice(["/reset", "/save", "/restore", "/x", ""]))
        if kind == 3:
            return {"data": build(self.host, method="DELETE", path=path, body=b"", content_type=None)}
        return self.req(chat_body(self.model, session_id=sid, stream=True))

    # 14
    def misc(self):
        r = self.rng
        kind = r.randrange(12)
        if kind == 0:
            return {"data": build(self.host, method=r.choice(["PUT", "DELETE", "PATCH", "GET", "HEAD", "TRACE", "FOO"]), body=dumps(self.valid()))}
        if kind == 1:
            return {"data": build(self.host, method="OPTIONS", path="/v1/chat/completions", body=b"", content_type=None,
                                  headers=[("Origin", "http://evil.example"), ("Access-Control-Request-Method", "POST")])}
        if kind == 2:
            return {"data": build(self.host, method="GET", path=r.choice(["/", "/v1", "/v1/models?x=" + "a" * 5000, "/../../etc/passwd",
                                                                          "/%00", "/v1/models/%ff", "//", "/metrics?%%%"]), body=b"", content_type=None)}
        if kind == 3:
            p = r.choice([[2**40], [-1], [0] * 5000, [[1, 2]], "", [], ["a", 1], [1.5], [None]])
            return self.req({"model": self.model, "prompt": p, "max_tokens": 2}, path="/v1/completions")
        if kind == 4:
            return self.req({"model": self.model, "prompt": "x", "max_tokens": 2, r.choice(["echo", "best_of", "suffix", "logprobs"]): r.choice([True, 5, 100, "x"])},
                            path="/v1/completions")
        if kind == 5:
            return self.req(chat_body(self.model, logit_bias=r.choice([{"999999999": 100}, {"-1": 1}, {"x": 1}, {"1": 1e300}, {str(i): 1 for i in range(5000)}])))
        if kind == 6:
            body = chat_body(self.model)
            body["model"] = r.choice(["", "other", "x" * 10000, None])
            return self.req(body)
        if kind == 7:
            return self.req({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
                            path="/apply-template")
        if kind == 8:  # a streamed reply the client walks away from
            def hang_up(sock):
                sock.settimeout(10)
                try:
                    first = sock.recv(100)
                except socket.timeout:
                    return None
                return int(first.split()[1]) if first.startswith(b"HTTP/1.1 ") else None
            body = chat_body(self.model, stream=True, max_tokens=64)
            return {"data": build(self.host, body=dumps(body)), "after_send": hang_up}
        if kind == 9:  # pipelined requests on one connection
            one = build(self.host, body=dumps(self.valid()))
            return {"data": one + one + b"GARBAGE\r\n\r\n"}
        if kind == 10:
            return self.req(chat_body(self.model, stream=True, stream_options=r.choice([{"include_usage": True}, {"include_usage": "yes"}, [], {"x": 1}])))
        return self.req(chat_body(self.model, n=r.choice([1, 2]), stop=r.choice(["", [""], ["a"] * 4, [1]]), user="u" * 1000))

    # 16: Anthropic's Messages API (its 4xx must come in Anthropic's error shape)
    def messages(self):
        r = self.rng
        body = {"model": self.model, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
        if r.random() < 0.3:
            body["stream"] = True
        kind = r.randrange(10)
        junk = [None, True, 0, -1, 1e300, "x", "", [], {}, [{}], [{"type": "bogus"}], [[[]]]]
        if kind == 0:
            body[r.choice(["model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences",
                           "temperature", "top_p", "top_k", "thinking", "metadata", "stream", "output_config"])] = r.choice(junk)
        elif kind == 1:
            body["messages"] = [{"role": r.choice(["user", "assistant", "system", "tool", "x", None]),
                                 "content": r.choice(junk + ["ok"])} for _ in range(r.randint(0, 4))]
        elif kind == 2:
            body["messages"][0]["content"] = [r.choice([
                {"type": "text"}, {"type": "text", "text": 5}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}},
                {"type": "image", "source": {"type": "url", "url": "http://x"}}, {"type": "tool_result"},
                {"type": "tool_use", "id": "t", "name": "f", "input": "x"}, {"type": "document"},
                {"type": "thinking", "thinking": "x"}, {"type": "text", "text": "x" * r.choice([1, 100000])}])]
        elif kind == 3:
            body["tools"] = [r.choice([{"name": "f"}, {"name": "f", "input_schema": "x"}, {"input_schema": {}},
                                       {"name": "f", "input_schema": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(r.choice([10, 3000, 12000]))}}},
                                       {"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}])]
            body["tool_choice"] = r.choice([{"type": "any"}, {"type": "tool", "name": "nope"}, {"type": "x"}, "auto", None])
        elif kind == 4:
            body["system"] = r.choice([[{"type": "text"}], [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}], 5, [5]])
        elif kind == 5:
            body["output_config"] = {"format": r.choice([{"type": "json_schema", "schema": {"type": "nope"}}, {"type": "json_schema"},
                                                         {"type": "x"}, {"type": "json_schema", "schema": {"type": "object"}}])}
        elif kind == 6:
            body["thinking"] = r.choice([{"type": "enabled", "budget_tokens": -1}, {"type": "enabled"}, {"type": "x"}, {"type": "disabled"}])
        elif kind == 7:
            body["max_tokens"] = r.choice([0, -1, 2**63, 1.5, "4"])
        elif kind == 8:
            return self.req(dumps(body)[: r.randrange(1, 60)], path="/v1/messages") | {"shape": "anthropic"}
        else:
            return self.req({"model": self.model, "messages": r.choice([[], "x", [{"role": "user"}], None])},
                            path="/v1/messages/count_tokens") | {"shape": "anthropic"}
        return self.req(body, path="/v1/messages") | {"shape": "anthropic"}

    # 17: OpenAI's Responses API
    def responses(self):
        r = self.rng
        body = {"model": self.model, "max_output_tokens": 4, "input": "Say hi."}
        if r.random() < 0.3:
            body["stream"] = True
        kind = r.randrange(9)
        junk = [None, True, 0, -1, 1e300, "x", "", [], {}, [{}], [{"type": "bogus"}], [[[]]]]
        if kind == 0:
            body[r.choice(["model", "input", "instructions", "tools", "tool_choice", "text", "reasoning", "store",
                           "previous_response_id", "max_output_tokens", "temperature", "top_p", "include", "metadata"])] = r.choice(junk)
        elif kind == 1:
            body["input"] = [r.choice([
                {"type": "message", "role": "user"}, {"type": "message", "role": "robot", "content": "x"},
                {"type": "function_call", "name": "f"}, {"type": "function_call_output", "call_id": "c"},
                {"type": "custom_tool_call", "call_id": "c"}, {"type": "reasoning", "summary": "x"},
                {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,!!"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
                {"type": "computer_call"}, {"type": "item_reference", "id": "x"}]) for _ in range(r.randint(1, 3))]
        elif kind == 2:
            body["tools"] = [r.choice([{"type": "function"}, {"type": "function", "name": "f", "parameters": "x"},
                                       {"type": "namespace", "name": "n"}, {"type": "namespace", "name": "n", "tools": [{"type": "x"}]},
                                       {"type": "custom"}, {"type": "web_search"}, {"type": "nope"},
                                       {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(r.choice([10, 12000]))}}}])]
            body["tool_choice"] = r.choice(["required", {"type": "function", "name": "nope"}, {"type": "custom"}, "x", None])
        elif kind == 3:
            body["text"] = {"format": r.choice([{"type": "json_schema"}, {"type": "json_schema", "schema": {"type": "nope"}},
                                                {"type": "json_object"}, {"type": "x"}, "x"])}
        elif kind == 4:
            body["previous_response_id"] = r.choice(["resp_nope", "", "../x", "x" * 5000])
        elif kind == 5:
            return {"data": build(self.host, method=r.choice(["GET", "DELETE"]),
                                  path="/v1/responses/" + r.choice(["resp_nope", "%00", "..", "x" * 3000]), body=b"", content_type=None)}
        elif kind == 6:
            return self.req(b"", path="/v1/responses/resp_nope/cancel")
        elif kind == 7:
            return self.req(dumps(body)[: r.randrange(1, 40)], path="/v1/responses")
        else:
            body["max_output_tokens"] = r.choice([0, -1, 2**63, 1.5, "4"])
        return self.req(body, path="/v1/responses")

    # 18: Ollama's API (its 4xx must be {"error": "..."})
    def ollama(self):
        r = self.rng
        junk = [None, True, 0, -1, 1e300, "x", "", [], {}, [{}], [[[]]]]
        if r.random() < 0.5:
            body = {"model": self.model, "messages": [{"role": "user", "content": "Say hi."}],
                    "options": {"num_predict": 4}, "stream": r.random() < 0.5}
            kind = r.randrange(6)
            if kind == 0:
                body[r.choice(["model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"])] = r.choice(junk)
            elif kind == 1:
                body["messages"] = [{"role": r.choice(["user", "assistant", "tool", "x", None]),
                                     "content": r.choice(junk + ["ok"]), "images": r.choice([None, ["!!"], [5], "x", []]),
                                     "tool_calls": r.choice([None, [{}], [{"function": {"name": "f", "arguments": "x"}}], 5])}]
            elif kind == 2:
                body["options"] = {r.choice(["num_predict", "temperature", "top_k", "seed", "stop", "num_ctx", "bogus"]): r.choice(junk + [2**64])}
            elif kind == 3:
                body["format"] = r.choice(["json", "yaml", {"type": "nope"}, {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(r.choice([5, 6000]))}}])
            elif kind == 4:
                body["model"] = r.choice(["llama3:8b", self.model + ":latest", "", "x" * 5000])
            else:
                return self.req(dumps(body)[: r.randrange(1, 50)], path="/api/chat") | {"shape": "ollama"}
            return self.req(body, path="/api/chat") | {"shape": "ollama"}
        kind = r.randrange(4)
        if kind == 0:
            body = {"model": self.model, "prompt": r.choice(["hi", "", None, 5]), "stream": False,
                    r.choice(["raw", "system", "template", "context", "suffix", "images"]): r.choice(junk + [["!!"]])}
            return self.req(body, path="/api/generate") | {"shape": "ollama"}
        if kind == 1:
            return self.req(r.choice([{}, {"model": 5}, {"model": "nope"}, {"name": self.model}]), path="/api/show") | {"shape": "ollama"}
        return {"data": build(self.host, method="GET", path=r.choice(["/api/tags", "/api/ps", "/api/version", "/api/nope"]),
                              body=b"", content_type=None)}

    def tokenize(self):
        """llama-server's /tokenize and /detokenize with wrong types, huge or
        hostile content and out-of-range ids."""
        r = self.rng
        junk = [None, True, 0, -1, 2**64, 1e300, "x", "", [], {}, [[[]]], "\u0000", "<|im_start|>" * 50]
        if r.random() < 0.5:
            body = {"content": r.choice(junk + ["héllo " * r.choice([1, 2000]), "\ud800"])}
            for k in ("add_special", "parse_special", "with_pieces"):
                if r.random() < 0.4:
                    body[k] = r.choice(junk)
            return self.req(body, path="/tokenize")
        tokens = r.choice([None, "12", {}, [1, 2, 3], [-1], [2**40], [1.5], ["a"], [None], list(range(r.choice([10, 20000])))])
        return self.req({"tokens": tokens}, path="/detokenize")

    def embeddings(self):
        """/v1/embeddings, Ollama's /api/embed and /api/embeddings, and the
        hub's /api/pull and /api/delete (the served model is -m's: never
        deleted) with wrong types, huge inputs and unknown names."""
        r = self.rng
        junk = [None, True, 0, -1, 2**64, 1e300, "", [], {}, [[]], [None], [[-1]], [[2**40]], ["a", 1], "\u0000"]
        kind = r.randrange(5)
        if kind == 0:
            body = {"model": self.model, "input": r.choice(junk + ["hi", ["a", "b"], [1, 2, 3], ["x " * 9000]])}
            for k, vals in (("encoding_format", ["float", "base64", "int8", 5, None]), ("dimensions", [0, -1, 7, 2**64, "x"]),
                            ("model", ["nope", 5, "", self.model + ":latest"])):
                if r.random() < 0.3:
                    body[k] = r.choice(vals)
            return self.req(body, path="/v1/embeddings")
        if kind == 1:
            body = {"model": self.model, "input": r.choice(junk + ["hi", ["a", "b"], "y " * 9000]),
                    "truncate": r.choice([True, False, "x", None]), "keep_alive": r.choice(["5m", "x", -1, True, None])}
            return self.req(body, path="/api/embed") | {"shape": "ollama"}
        if kind == 2:
            return self.req({"model": self.model, "prompt": r.choice(junk + ["hi"])}, path="/api/embeddings") | {"shape": "ollama"}
        if kind == 3:
            body = r.choice([{}, {"model": 5}, {"model": "nope"}, {"name": "x" * 3000}, {"model": self.model, "stream": r.choice([True, False, "x"])}])
            return self.req(body, path="/api/pull") | {"shape": "ollama"}
        body = r.choice([{}, {"model": 5}, {"model": "llama3:8b"}, {"model": self.model}, {"name": "../../etc/passwd"}])
        return {"data": build(self.host, method="DELETE", path="/api/delete", body=dumps(body).encode()), "shape": "ollama"}

    # 15
    def slow(self):
        """Requests that stall: the head never finishes, or the body stops."""
        r = self.rng
        body = dumps(self.valid()).encode()
        data = build(self.host, body=body)
        head_len = data.index(b"\r\n\r\n")
        cut = r.choice([5, head_len - 2, head_len + 4, len(data) - 3])
        return {"data": data, "stall_after": cut, "limit": max(BODY_TIMEOUT, HEADER_TIMEOUT) + 5}


CATEGORIES = ["broken_json", "wrong_types", "out_of_range", "roles", "nesting", "big_bodies", "bad_utf8", "headers",
              "chunked", "tool_schemas", "response_format", "images", "session_ids", "misc", "slow", "messages",
              "responses", "ollama", "tokenize", "embeddings"]
# Share of the requests per category (the slow ones each cost seconds).
WEIGHTS = {"slow": 0.3, "big_bodies": 0.6, "nesting": 0.7}


# ---------------------------------------------------------------- the run

def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def largest_mappings(pid, n=8):
    """The process's largest resident mappings, [(kB, name)]."""
    out, name = [], ""
    for line in open(f"/proc/{pid}/smaps"):
        first = line.split(None, 1)[0]
        if "-" in first and not first.endswith(":"):
            parts = line.split()
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif first == "Rss:":
            out.append((int(line.split()[1]), name))
    return sorted(out, reverse=True)[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", help="write the report here as JSON")
    ap.add_argument("--only", help="comma-separated categories (default: all)")
    args = ap.parse_args()

    # No backtraces: symbolizing one maps the binary's debug info and std
    # keeps it cached (~140 MB once), which would read as growth here.
    env = dict(os.environ, HEARTH_FAULT_INJECTION="1", RUST_BACKTRACE="0")
    server = Server("--body-timeout", str(BODY_TIMEOUT), "--header-timeout", str(HEADER_TIMEOUT), "--max-body-mib", "2",
                    "--max-sessions", "6", ctx=1024, model=model_path(args.model), model_id="fuzz", env=env)
    host, port = server.host.strip("[]"), server.port
    hostport = f"{server.host}:{server.port}"
    pid = server.proc.pid
    model = "fuzz"

    def ok(data, limit=ANSWER_LIMIT):
        return send(host, port, data, limit=limit)

    # Warm-up: plain, streamed, structured and tool requests, so that the
    # vocabulary for structured output and the sessions' buffers exist.
    for i in range(6):
        for body in [chat_body(model, session_id=f"warm{i}"), chat_body(model, stream=True),
                     chat_body(model, response_format={"type": "json_object"}, max_tokens=8),
                     chat_body(model, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                               max_tokens=8)]:
            status, text, _ = ok(build(hostport, body=dumps(body)))
            assert status == 200, (status, text[:300])
    rss_warm = rss_kb(pid)
    maps_warm = largest_mappings(pid)

    rng = random.Random(args.seed)
    gen = Gen(hostport, model, rng)
    cats = args.only.split(",") if args.only else CATEGORIES
    unknown = set(cats) - set(CATEGORIES)
    if unknown:
        ap.error(f"unknown categories {sorted(unknown)}; known: {', '.join(CATEGORIES)}")
    weights = [WEIGHTS.get(c, 1.0) for c in cats]
    plan = rng.choices(cats, weights=weights, k=args.requests)
    jobs = []
    for cat in plan:
        try:
            jobs.append((cat, getattr(gen, cat)()))
        except Exception as e:  # a generator bug is the script's, not the server's
            raise RuntimeError(f"generator {cat}: {e}")
    # The injected panics, spread through the run: each must answer 500 and
    # leave the server serving.
    n_inject = max(2, args.requests // 500)
    for i in range(n_inject):
        where = "handler" if i % 2 == 0 else "engine"
        body = chat_body(model, stream=(i % 4 == 3))
        spec = {"data": build(hostport, body=dumps(body), headers=[("x-hearth-fault", f"panic-{where}")])}
        # Streamed, an engine fault comes after the 200: as an error event.
        spec["expect"] = (200, b'"error"') if body.get("stream") and where == "engine" else (500, b"internal_error")
        jobs.insert(rng.randrange(len(jobs) + 1), ("injected_panic", spec))

    stats = collections.defaultdict(lambda: {"count": 0, "status": collections.Counter(), "5xx": 0, "hangs": 0, "slowest_s": 0.0})
    failures = []
    lock = threading.Lock()
    dead = threading.Event()

    def one(job):
        cat, spec = job
        if dead.is_set():
            return
        limit = spec.get("limit", ANSWER_LIMIT)
        try:
            for attempt in range(20):
                status, body, secs = send(host, port, spec["data"], limit=limit, after_send=spec.get("after_send"),
                                          stall_after=spec.get("stall_after"))
                # An injected fault needs a session to fail in: wait for one.
                if not (cat == "injected_panic" and status == 429):
                    break
                time.sleep(0.5)
            hang = False
        except Hang:
            status, body, secs, hang = "hang", b"", limit, True
        except ConnectionRefusedError:
            status, body, secs, hang = "refused", b"", 0.0, False
        if server.proc.poll() is not None:
            dead.set()
        with lock:
            s = stats[cat]
            s["count"] += 1
            s["status"][str(status)] += 1
            s["slowest_s"] = max(s["slowest_s"], round(secs, 2))
            if hang:
                s["hangs"] += 1
                failures.append(f"{cat}: no answer within {limit:.0f} s: {spec['data'][:200]!r}")
            if spec.get("shape") == "anthropic" and isinstance(status, int) and 400 <= status < 500:
                try:
                    e = json.loads(body)
                    good = e.get("type") == "error" and isinstance(e["error"]["type"], str) and e["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    good = False
                if not good:
                    failures.append(f"{cat}: {status} not in Anthropic's error shape: {body[:200]!r}")
            if spec.get("shape") == "ollama" and isinstance(status, int) and 400 <= status < 500:
                try:
                    good = isinstance(json.loads(body)["error"], str)
                except (ValueError, KeyError, TypeError):
                    good = False
                if not good:
                    failures.append(f"{cat}: {status} not in Ollama's error shape: {body[:200]!r}")
            if isinstance(status, int) and status >= 500:
                s["5xx"] += 1
                if not (cat == "injected_panic" and status == spec["expect"][0]):
                    failures.append(f"{cat}: {status} {body[:300]!r} for {spec['data'][:300]!r}")
            if cat == "injected_panic":
                want, marker = spec["expect"]
                if status != want or marker not in body:
                    failures.append(f"{cat}: answered {status} {body[:200]!r}, not {want} with {marker!r}")

    t0 = time.monotonic()
    with futures.ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(one, jobs))
    elapsed = time.monotonic() - t0
    aborted = server.proc.poll() is not None

    report = {"requests": len(jobs), "seconds": round(elapsed, 1), "model": args.model, "seed": args.seed,
              "aborted": aborted, "categories": {}}
    if not aborted:
        # Still serving: a plain request answers, then every session goes.
        status, text, _ = ok(build(hostport, body=dumps(chat_body(model))))
        if status != 200:
            failures.append(f"after the run a plain request got {status}: {text[:200]!r}")
        rss_end = rss_kb(pid)
        status, text, _ = ok(build(hostport, method="DELETE", path="/v1/sessions", body=b"", content_type=None))
        if status != 200:
            failures.append(f"DELETE /v1/sessions got {status}: {text[:200]!r}")
        time.sleep(1)
        rss_clear = rss_kb(pid)
        report.update(rss_mib={"after_warm_up": round(rss_warm / 1024, 1), "at_end": round(rss_end / 1024, 1),
                               "after_clear": round(rss_clear / 1024, 1)})
        if rss_clear > rss_warm * 1.10:
            failures.append(f"RSS after clearing the sessions {rss_clear} kB is more than 10% above its post-warm-up {rss_warm} kB; "
                            f"largest mappings (kB): {largest_mappings(pid)}, after warm-up: {maps_warm}")
    else:
        failures.append(f"the server process died (exit {server.proc.returncode}); log tail:\n" + server.logs()[-3000:])

    for cat in CATEGORIES + ["injected_panic"]:
        s = stats.get(cat)
        if s:
            report["categories"][cat] = {"count": s["count"], "status": dict(sorted(s["status"].items())), "5xx": s["5xx"],
                                         "hangs": s["hangs"], "slowest_s": s["slowest_s"]}
    if not aborted:
        server.stop()
    report["failures"] = failures[:50]

    print(f"{'category':<16} {'count':>6} {'5xx':>4} {'hangs':>5} {'slowest':>8}  statuses")
    for cat, s in report["categories"].items():
        hist = " ".join(f"{k}:{v}" for k, v in s["status"].items())
        print(f"{cat:<16} {s['count']:>6} {s['5xx']:>4} {s['hangs']:>5} {s['slowest_s']:>7.2f}s  {hist}")
    print(f"{len(jobs)} requests in {elapsed:.1f} s; aborted: {aborted}; RSS (MiB): {report.get('rss_mib')}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    for f in failures[:50]:
        print("FAIL", f)
    print("fuzz_server:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
