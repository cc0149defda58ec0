#!/usr/bin/env python3
"""Anthropic's Messages API on `hearth serve` (qwen2.5-coder-0.5b), with the
official `anthropic` Python SDK (pinned in scripts/requirements.txt):

- text, whole and streamed: the stream's exact event sequence (message_start,
  ping, content_block_start / _delta / _stop, message_delta, message_stop)
  read off the wire, the SDK's accumulated message equal to the whole one,
  and both equal to what /v1/chat/completions answers for the same request
  (one engine: the same greedy tokens);
- tools: `tool_choice` any / tool / none, `tool_use` blocks whose `input`
  follows the tool's `input_schema`, streamed as input_json_delta pieces that
  concatenate to the same input; a `tool_result` turn (is_error too);
- `stop_sequences` (stop_reason stop_sequence, the sequence named), max_tokens;
- usage: input_tokens + cache_read_input_tokens = the prompt; a conversation
  resent whole each turn with no session id, as Claude Code does, reuses the
  previous turn's KV even though its `x-anthropic-billing-header` system
  block changes every turn (≥ 90% of the previous prompt read from cache);
- structured output (`output_config.format` json_schema, strict tools),
  validated by jsonschema;
- /v1/messages/count_tokens equals the prompt the request is charged;
- errors in Anthropic's shape ({"type":"error","error":{"type","message"}})
  with its status codes, through the SDK's exception classes: missing
  max_tokens, a bad block, an unknown model, a server tool, a wrong
  x-api-key (401), an unknown route under /v1/messages.

Run: python3 tests/server/test_anthropic.py [name filter]
"""
import json
import random

import anthropic
import jsonschema

from common import MODEL_ID, Server, request, run_tests

KEY = "anthropic-test-key"
S = None

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def setup_module(module=None):
    global S
    S = Server("--api-key", KEY, ctx=4096, api_key=KEY)


def teardown_module(module=None):
    if S is not None:
        assert S.stop() == 0


def client(key=KEY):
    return anthropic.Anthropic(base_url=S.base[: -len("/v1")], api_key=key, max_retries=0, timeout=600)


def events(body):
    """The (event name, data) pairs of a streamed /v1/messages answer."""
    status, headers, text = request(S, "POST", "/v1/messages", {**body, "stream": True},
                                    headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert status == 200, text
    assert headers["content-type"].startswith("text/event-stream"), headers
    out = []
    for chunk in text.split("\n\n"):
        name = data = None
        for line in chunk.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name:
            assert data["type"] == name, (name, data)
            out.append((name, data))
    return out


def test_text_whole_and_streamed_agree_with_chat_completions():
    # The SDK no longer sends temperature; the server's default is greedy.
    body = {"model": MODEL_ID, "max_tokens": 24,
            "system": "You are terse.", "messages": [{"role": "user", "content": "Name three colors."}]}
    whole = client().messages.create(**body)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == MODEL_ID
    assert whole.id.startswith("msg_"), whole.id
    assert [b.type for b in whole.content] == ["text"], whole.content
    assert whole.stop_reason in ("end_turn", "max_tokens"), whole.stop_reason
    assert whole.usage.output_tokens > 0 and whole.usage.input_tokens > 0, whole.usage
    text = whole.content[0].text
    # The same request through the OpenAI door: the same tokens.
    chat = S.client().chat.completions.create(
        model=MODEL_ID, max_tokens=24,
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."}],
        extra_body={"cache_salt": "other-door"})
    assert chat.choices[0].message.content == text, (chat.choices[0].message.content, text)
    assert chat.usage.prompt_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    # Streamed, off the wire: the exact event sequence.
    ev = events(body)
    names = [n for n, _ in ev]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) == {"content_block_delta"}, names
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0, start
    assert ev[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    streamed = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta")
    assert all(d["delta"]["type"] == "text_delta" for n, d in ev if n == "content_block_delta")
    assert streamed == text, (streamed, text)
    delta = ev[-2][1]
    assert delta["delta"]["stop_reason"] == whole.stop_reason and delta["usage"]["output_tokens"] == whole.usage.output_tokens
    # The SDK's stream helper accumulates the same message.
    with client().messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == text and final.stop_reason == whole.stop_reason


def test_tool_use_whole_streamed_and_the_result_turn():
    c = client()
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        r = c.messages.create(model=MODEL_ID, max_tokens=64, tools=[WEATHER], tool_choice=choice,
                              messages=ASK)
        assert r.stop_reason == "tool_use", r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name == "get_weather", r.content
        assert uses[0].id.startswith("toolu_"), uses[0].id
        jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    # Streamed: input_json_delta pieces concatenate to the same input.
    ev = events({"model": MODEL_ID, "max_tokens": 64, "tools": [WEATHER],
                 "tool_choice": {"type": "any"}, "messages": ASK})
    starts = [d for n, d in ev if n == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    assert len(starts) == 1 and starts[0]["content_block"]["input"] == {}, starts
    at = starts[0]["index"]
    pieces = "".join(d["delta"]["partial_json"] for n, d in ev
                     if n == "content_block_delta" and d["index"] == at)
    assert json.loads(pieces) == uses[0].input, (pieces, uses[0].input)
    assert [d["delta"]["stop_reason"] for n, d in ev if n == "message_delta"] == ["tool_use"]
    # tool_choice none: no call.
    r = c.messages.create(model=MODEL_ID, max_tokens=16, tools=[WEATHER],
                          tool_choice={"type": "none"}, messages=ASK)
    assert all(b.type == "text" for b in r.content) and r.stop_reason != "tool_use", r
    # The result turn, resent whole (no session id): answered, and the
    # previous turn's prompt comes from cache.
    first = c.messages.create(model=MODEL_ID, max_tokens=64, tools=[WEATHER],
                              tool_choice={"type": "any"}, messages=ASK)
    use = next(b for b in first.content if b.type == "tool_use")
    for is_error in (False, True):
        turn = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "is_error": is_error,
                                                    "content": [{"type": "text", "text": "18 degrees, sunny"}]}]}]
        r = c.messages.create(model=MODEL_ID, max_tokens=24, tools=[WEATHER], messages=turn)
        assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
        prompt_before = first.usage.input_tokens + first.usage.cache_read_input_tokens
        assert r.usage.cache_read_input_tokens >= 0.9 * prompt_before, (r.usage, first.usage)


def test_stop_sequences_and_max_tokens():
    c = client()
    r = c.messages.create(model=MODEL_ID, max_tokens=40, stop_sequences=["4"],
                          messages=[{"role": "user", "content": "Count from 1 to 9, separated by spaces."}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "4", r
    assert "4" not in r.content[0].text and "3" in r.content[0].text, r.content
    r = c.messages.create(model=MODEL_ID, max_tokens=2,
                          messages=[{"role": "user", "content": "Write a long story."}])
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2, r


def test_a_claude_code_conversation_reuses_its_kv_though_the_billing_header_changes():
    c = client()
    tools = [WEATHER, {"name": "Bash", "description": "Run a shell command.",
                       "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                        "required": ["command"]}}]
    rules = "You are a coding agent. " + " ".join(f"Rule {i}: be careful with step {i}." for i in range(60))

    def system():
        cch = "%05x" % random.randrange(16 ** 5)
        return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli; cch={cch};"},
                {"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}]

    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}]
    prev = None
    for turn in range(3):
        r = c.messages.create(model=MODEL_ID, max_tokens=8, system=system(), tools=tools,
                              messages=messages, metadata={"user_id": "user_abc"})
        prompt = r.usage.input_tokens + r.usage.cache_read_input_tokens
        if prev is not None:
            assert r.usage.cache_read_input_tokens >= 0.9 * prev, (turn, r.usage, prev)
        prev = prompt
        messages = messages + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                               {"role": "user", "content": f"Now say {turn}."}]
    # The metadata block is not in the prompt: count_tokens agrees.
    n = c.messages.count_tokens(model=MODEL_ID, system=system(), tools=tools, messages=[{"role": "user", "content": "x"}])
    m = c.messages.count_tokens(model=MODEL_ID, system=system()[1:], tools=tools, messages=[{"role": "user", "content": "x"}])
    assert n.input_tokens == m.input_tokens > 0, (n, m)


def test_structured_output_follows_the_schema():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    c = client()
    r = c.messages.create(model=MODEL_ID, max_tokens=40, output_config={"format": {"type": "json_schema", "schema": schema}},
                          messages=[{"role": "user", "content": "Make up a person."}])
    jsonschema.validate(json.loads(r.content[0].text), schema)
    # A strict tool under tool_choice auto: a call, if the model writes one, follows the schema.
    strict = dict(WEATHER, strict=True)
    r = c.messages.create(model=MODEL_ID, max_tokens=64, tools=[strict], messages=ASK)
    for b in r.content:
        if b.type == "tool_use":
            jsonschema.validate(b.input, WEATHER["input_schema"])
    try:
        c.messages.create(model=MODEL_ID, max_tokens=4, messages=ASK,
                          output_config={"format": {"type": "json_schema", "schema": {"type": "nope"}}})
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error" and "schema" in e.body["error"]["message"], e.body
    else:
        raise AssertionError("a bad schema was accepted")


def test_count_tokens_is_the_prompt_charged():
    c = client()
    body = {"model": MODEL_ID, "system": "Be brief.", "tools": [WEATHER],
            "messages": [{"role": "user", "content": "Hello there."}]}
    n = c.messages.count_tokens(**body)
    r = c.messages.create(max_tokens=1, **body)
    assert n.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens, (n, r.usage)


def test_errors_have_anthropics_shape_and_status():
    c = client()
    cases = [
        (dict(model=MODEL_ID, messages=ASK, max_tokens=None), anthropic.BadRequestError, 400, "invalid_request_error",
         "max_tokens"),
        (dict(model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": [{"type": "video"}]}]),
         anthropic.BadRequestError, 400, "invalid_request_error", "messages[0].content[0].type"),
        (dict(model=MODEL_ID, max_tokens=4, messages=[{"role": "tool", "content": "x"}]),
         anthropic.BadRequestError, 400, "invalid_request_error", "messages[0].role"),
        (dict(model="claude-nope", max_tokens=4, messages=ASK), anthropic.NotFoundError, 404, "not_found_error",
         "claude-nope"),
        (dict(model=MODEL_ID, max_tokens=4, messages=ASK, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
         anthropic.BadRequestError, 400, "invalid_request_error", "tools[0].type"),
        (dict(model=MODEL_ID, max_tokens=4, messages=ASK, extra_body={"temperature": 1.5}), anthropic.BadRequestError, 400,
         "invalid_request_error", "temperature"),
    ]
    for kwargs, exc, status, kind, needle in cases:
        try:
            c.messages.create(**kwargs)
        except exc as e:
            assert e.status_code == status, (kwargs, e.status_code)
            assert e.body["type"] == "error" and e.body["error"]["type"] == kind, e.body
            assert needle in e.body["error"]["message"], (needle, e.body)
        else:
            raise AssertionError(f"{kwargs} was accepted")
    try:
        client("wrong-key").messages.create(model=MODEL_ID, max_tokens=4, messages=ASK)
    except anthropic.AuthenticationError as e:
        assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body
    else:
        raise AssertionError("a wrong key was accepted")
    status, _, text = request(S, "POST", "/v1/messages/nope", {"x": 1})
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error", text
    # Not JSON at all.
    status, _, text = request(S, "POST", "/v1/messages", raw=b"{nope")
    body = json.loads(text)
    assert status == 400 and body["type"] == "error" and "not valid JSON" in body["error"]["message"], text


def main():
    return run_tests(globals(), setup_module, teardown_module)


if __name__ == "__main__":
    raise SystemExit(main())
