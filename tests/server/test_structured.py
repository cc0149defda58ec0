#!/usr/bin/env python3
"""Structured output against the real `hearth serve` (qwen2.5-coder-0.5b), with
the official openai SDK, checked by an independent validator (`jsonschema`):

- `response_format: json_schema` on 10 schemas (nested objects, enums, arrays
  with bounds, required fields, numbers, booleans, patterns): every answer
  parses and validates. HEARTH_STRUCTURED_REQUESTS sets how many requests
  (default 10: one greedy request per schema; then per schema sampled ones at T=0.8 with seeds;
  `bench/structured.sh` runs 200 and records the result);
- `json_object`, a streamed `json_schema` answer, and
  `client.beta.chat.completions.parse` with a Pydantic model;
- `tool_choice: required` (always a call, arguments valid under the tool's
  schema), a named function, `strict` tools under `tool_choice: auto`;
- `logprobs` / `top_logprobs` (chat, streamed, completions);
- bad schemas and choices are 400s naming the field;
- the constraint's time per token, from the server's turn log, printed.

Run: python3 tests/server/test_structured.py [name filter]
"""
import json
import os
import re
import sys
from typing import Literal

import jsonschema
import openai
from pydantic import BaseModel, Field

from common import MODEL_ID, Server, http, run_tests

SERVER = None
N_REQUESTS = int(os.environ.get("HEARTH_STRUCTURED_REQUESTS", "10"))
REPORT = {}

SCHEMAS = [
    ("a person", {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("a book with its author", {"type": "object", "properties": {
        "title": {"type": "string"},
        "author": {"type": "object", "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
                   "required": ["first", "last"], "additionalProperties": False},
        "year": {"type": "integer"}},
        "required": ["title", "author", "year"], "additionalProperties": False}),
    ("the weather today", {"type": "object", "properties": {
        "condition": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]},
        "temperature_c": {"type": "number"}, "windy": {"type": "boolean"}},
        "required": ["condition", "temperature_c", "windy"], "additionalProperties": False}),
    ("three programming languages", {"type": "object", "properties": {
        "languages": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}},
        "required": ["languages"], "additionalProperties": False}),
    ("a todo list", {"type": "object", "properties": {
        "todos": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {"task": {"type": "string"}, "done": {"type": "boolean"},
                                             "priority": {"type": "string", "enum": ["low", "medium", "high"]}},
            "required": ["task", "done", "priority"], "additionalProperties": False}}},
        "required": ["todos"], "additionalProperties": False}),
    ("an HTTP request", {"type": "object", "properties": {
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "DELETE"]},
        "path": {"type": "string", "pattern": "^/[a-z0-9/_-]*$"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 60000}},
        "required": ["method", "path", "timeout_ms"], "additionalProperties": False}),
    ("a point in 3-D space", {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "number"}},
        "required": ["x", "y", "z"], "additionalProperties": False}),
    ("a git commit", {"type": "object", "properties": {
        "sha": {"type": "string", "pattern": "^[0-9a-f]{7}$"}, "message": {"type": "string"},
        "files_changed": {"type": "integer", "minimum": 0},
        "kind": {"type": "string", "enum": ["fix", "feat", "docs", "refactor"]}},
        "required": ["sha", "message", "files_changed", "kind"], "additionalProperties": False}),
    ("a product review", {"type": "object", "properties": {
        "rating": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "recommend": {"type": "boolean"},
        "pros": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "cons": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["rating", "recommend", "pros", "cons"], "additionalProperties": False}),
    ("a city with its country and population", {"type": "object", "properties": {
        "city": {"type": "string"},
        "country": {"type": "object", "properties": {"name": {"type": "string"},
                                                     "code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
                    "required": ["name", "code"], "additionalProperties": False},
        "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "country", "population"], "additionalProperties": False}),
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "verbose": {"type": "boolean"}, "retries": {"type": "integer", "minimum": 0}},
         "required": ["path", "verbose"], "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def setup():
    global SERVER
    SERVER = Server(ctx=2048)


def teardown():
    if SERVER is not None:
        assert SERVER.stop() == 0


def chat(session=None, **kw):
    kw.setdefault("model", MODEL_ID)
    if session:
        # Requests that share a long prefix (the tool list) reuse its KV.
        kw["extra_body"] = {"session_id": session}
    kw.setdefault("max_tokens", 400)
    return SERVER.client().chat.completions.create(**kw)


def ask(what):
    return [{"role": "user", "content": f"Describe {what} as JSON."}]


def test_json_schema_answers_always_validate():
    done = valid = 0
    tokens = 0
    for i in range(N_REQUESTS):
        what, schema = SCHEMAS[i % len(SCHEMAS)]
        rnd = i // len(SCHEMAS)
        sampling = {"temperature": 0} if rnd == 0 else {"temperature": 0.8, "seed": 1000 + i}
        r = chat(messages=ask(what), response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": True}}, session="json", **sampling)
        c = r.choices[0]
        assert c.finish_reason == "stop", f"request {i} ({what}): finish {c.finish_reason}: {c.message.content!r}"
        value = json.loads(c.message.content)
        jsonschema.validate(value, schema)
        done += 1
        valid += 1
        tokens += r.usage.completion_tokens
    REPORT["json_schema"] = f"{valid}/{done} valid ({tokens} completion tokens)"
    assert valid == N_REQUESTS


def test_json_object_and_streamed_json_schema():
    r = chat(messages=ask("a cat"), response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    what, schema = SCHEMAS[4]
    stream = chat(messages=ask(what), response_format={"type": "json_schema", "json_schema": {
        "name": "todo", "schema": schema}}, temperature=0, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(text), schema)


class Address(BaseModel):
    street: str
    city: str
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    name: str
    tier: Literal["free", "pro", "enterprise"]
    addresses: list[Address]
    active: bool


def test_openai_parse_with_a_pydantic_model():
    client = SERVER.client()
    r = client.beta.chat.completions.parse(
        model=MODEL_ID, temperature=0, max_tokens=400,
        messages=[{"role": "user", "content": "Invent a customer record."}], response_format=Customer)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Customer), r.choices[0].message
    assert re.fullmatch(r"[0-9]{5}", parsed.addresses[0].zip_code) if parsed.addresses else True


def check_calls(message, only=None):
    assert message.tool_calls, f"no tool call: {message}"
    for call in message.tool_calls:
        name = call.function.name
        assert name in TOOL_SCHEMAS, name
        if only:
            assert name == only
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[name])
    return len(message.tool_calls)


def test_tool_choice_required_always_calls_with_valid_arguments():
    prompts = ["Tell me a joke.", "What is 2 + 2?", "Is it raining in Oslo?",
               "Check that my project in ./app passes.", "Hello!"]
    calls = 0
    for i, p in enumerate(prompts):
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
        r = chat(messages=[{"role": "user", "content": p}], tools=TOOLS, tool_choice="required",
                 session="tools", **sampling)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        calls += check_calls(r.choices[0].message)
    # One call only when parallel calls are off; a named function.
    r = chat(messages=[{"role": "user", "content": "Weather in Rome and in Paris?"}], tools=TOOLS,
             tool_choice="required", parallel_tool_calls=False, temperature=0, session="tools")
    assert check_calls(r.choices[0].message) == 1
    r = chat(messages=[{"role": "user", "content": "Weather in Rome?"}], tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "run_tests"}}, temperature=0, session="tools")
    check_calls(r.choices[0].message, only="run_tests")
    REPORT["tool_choice required"] = f"{len(prompts)}/{len(prompts)} requests called ({calls} calls, all valid)"


def test_strict_tools_under_auto():
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    r = chat(messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
             tools=strict, temperature=0, session="strict")
    check_calls(r.choices[0].message)
    # A plain answer stays possible.
    r = chat(messages=[{"role": "user", "content": "Say only the word hello."}], tools=strict, temperature=0, session="strict",
             max_tokens=20)
    assert r.choices[0].message.content, r.choices[0]


def test_logprobs():
    r = chat(messages=[{"role": "user", "content": "Name a color."}], temperature=0, max_tokens=8,
             logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy, no penalties: the token chosen is the most likely one.
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    stream = chat(messages=[{"role": "user", "content": "Name a color."}], temperature=0, max_tokens=8,
                  logprobs=True, stream=True)
    streamed = [t for ch in stream if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in lp]
    c = SERVER.client().completions.create(model=MODEL_ID, prompt="def add(a, b):", max_tokens=6,
                                           temperature=0, logprobs=2)
    assert "".join(c.choices[0].logprobs.tokens) == c.choices[0].text
    assert all(len(t) <= 2 for t in c.choices[0].logprobs.top_logprobs)


def test_random_weights_still_give_valid_json():
    """The grammar alone makes the output valid: a model with random weights
    (hearth synth, qwen2 layout, smollm2's tokenizer) sampled at T=0.9 writes
    schema-valid JSON through `hearth run --json-schema` on every seed."""
    import subprocess
    import tempfile
    from common import BIN
    with tempfile.TemporaryDirectory() as tmp:
        model = f"{tmp}/random.gguf"
        subprocess.run([BIN, "synth", "--arch", "qwen2", "--tokenizer-from", "smollm2-135m", "-o", model],
                       check=True, capture_output=True)
        # Bounded everywhere (a random model would otherwise write a string
        # until the token budget ends): nested objects, enums, arrays.
        schema = {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 24},
            "todos": {"type": "array", "maxItems": 3, "items": {
                "type": "object", "properties": {
                    "task": {"type": "string", "maxLength": 24}, "done": {"type": "boolean"},
                    "priority": {"type": "string", "enum": ["low", "medium", "high"]},
                    "estimate": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["task", "done", "priority", "estimate"], "additionalProperties": False}}},
            "required": ["title", "todos"], "additionalProperties": False}
        path = f"{tmp}/schema.json"
        with open(path, "w") as f:
            json.dump(schema, f)
        for seed in range(1, 6):
            out = subprocess.run([BIN, "run", "-m", model, "-p", "hi", "--temp", "0.9", "--seed", str(seed),
                                  "-n", "1000", "--json-schema", path], check=True, capture_output=True, text=True)
            jsonschema.validate(json.loads(out.stdout), schema)


def test_bad_requests_name_the_field():
    bad = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema: missing"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ]
    for extra, field in bad:
        status, body = http(SERVER, "POST", "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], **extra})
        assert status == 400, (extra, status, body)
        assert field in body["error"]["message"], (field, body)
    status, _ = http(SERVER, "GET", "/health")
    assert status == 200


def report():
    # The constraint's share of decode time, from the turn log.
    lines = SERVER.logs().splitlines() if SERVER else []
    total_c = total_d = toks = 0.0
    for line in lines:
        m = re.search(r"completion_tokens=(\d+) prefill_ms=\S+ decode_tok_s=(\S+) constraint_ms=(\S+)", line)
        if m and float(m.group(3)) > 0 and float(m.group(2)) > 0:
            n = int(m.group(1))
            total_c += float(m.group(3))
            total_d += (n - 1) / float(m.group(2)) * 1e3
            toks += n
    if toks:
        REPORT["constraint time"] = (f"{total_c / toks:.2f} ms per token vs {total_d / toks:.1f} ms per decode step "
                                     f"({100 * total_c / total_d:.1f}%)")
    for k, v in REPORT.items():
        print(f"[structured] {k}: {v}")


if __name__ == "__main__":
    code = run_tests(globals(), setup, teardown, report)
    sys.exit(code)
