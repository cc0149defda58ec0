#!/usr/bin/env python3
"""OpenAI's Responses API on `hearth serve` (qwen2.5-coder-0.5b), with the
official `openai` SDK's `client.responses.*`:

- text, whole and streamed: the stream's event sequence (response.created,
  response.in_progress, output_item.added, content_part.added,
  output_text.delta…, output_text.done, content_part.done, output_item.done,
  response.completed) with increasing sequence numbers, the SDK's
  `responses.stream()` final response equal to the whole one, and both
  equal to /v1/chat/completions' answer for the same request;
- function tools: tool_choice required / named, a function_call item whose
  arguments follow the schema, streamed as function_call_arguments.delta
  pieces that concatenate to the same arguments; the function_call_output
  turn;
- text.format json_schema, validated by jsonschema;
- store + previous_response_id: the continued conversation reuses the
  stored one's KV (cached_tokens ≥ the stored prompt), GET returns the
  stored response, DELETE removes it, another tenant (cache_salt) cannot
  continue it, `store: false` keeps nothing;
- max_output_tokens: status incomplete, incomplete_details.reason;
- Codex's tool list: hosted tools (web_search) left out, function tools
  inside a `namespace` called by their own name with the namespace on the
  function_call item, `custom` (freeform) tools answered as
  custom_tool_call items with a string input, and all of them resent as
  history items;
- errors in OpenAI's shape: an unknown tool type, a bad item, an unknown
  previous_response_id, missing input.

Run: python3 tests/server/test_responses.py [name filter]
"""
import json

import jsonschema
import openai

from common import MODEL_ID, Server, request, run_tests

KEY = "responses-test-key"
S = None
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris? Use the tool."


def setup_module(module=None):
    global S
    S = Server("--api-key", KEY, ctx=4096, api_key=KEY)


def teardown_module(module=None):
    if S is not None:
        assert S.stop() == 0


def events(body):
    status, headers, text = request(S, "POST", "/v1/responses", {**body, "stream": True})
    assert status == 200, text
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
    seqs = [d["sequence_number"] for _, d in out]
    assert seqs == list(range(len(seqs))), seqs
    return out


def test_text_whole_and_streamed_agree_with_chat_completions():
    c = S.client()
    body = dict(model=MODEL_ID, instructions="You are terse.", input="Name three colors.", max_output_tokens=24,
                temperature=0)
    whole = c.responses.create(**body)
    assert whole.object == "response" and whole.status in ("completed", "incomplete"), whole
    assert whole.id.startswith("resp_") and whole.model == MODEL_ID
    assert [i.type for i in whole.output] == ["message"], whole.output
    text = whole.output_text
    assert text and whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0, whole.usage
    chat = c.chat.completions.create(model=MODEL_ID, max_tokens=24, temperature=0,
                                     messages=[{"role": "system", "content": "You are terse."},
                                               {"role": "user", "content": "Name three colors."}])
    assert chat.choices[0].message.content == text, (chat.choices[0].message.content, text)
    ev = events({**body})
    names = [n for n, _ in ev]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], names
    end = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          end], names
    assert set(names[4:-4]) == {"response.output_text.delta"}, names
    assert "".join(d["delta"] for n, d in ev if n == "response.output_text.delta") == text
    assert ev[-1][1]["response"]["output"][0]["content"][0]["text"] == text
    with c.responses.stream(**body) as stream:
        final = stream.get_final_response()
    assert final.output_text == text


def test_function_calls_whole_streamed_and_the_output_turn():
    c = S.client()
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = c.responses.create(model=MODEL_ID, input=ASK, tools=[WEATHER], tool_choice=choice, temperature=0,
                               max_output_tokens=64)
        calls = [i for i in r.output if i.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather", r.output
        args = json.loads(calls[0].arguments)
        jsonschema.validate(args, WEATHER["parameters"])
        assert calls[0].call_id and calls[0].id.startswith("fc_"), calls[0]
    ev = events({"model": MODEL_ID, "input": ASK, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
                 "max_output_tokens": 64})
    added = [d["item"] for n, d in ev if n == "response.output_item.added"]
    assert [i["type"] for i in added] == ["function_call"] and added[0]["arguments"] == "", added
    pieces = "".join(d["delta"] for n, d in ev if n == "response.function_call_arguments.delta")
    done = [d for n, d in ev if n == "response.function_call_arguments.done"]
    assert json.loads(pieces) == args and json.loads(done[0]["arguments"]) == args, (pieces, done)
    # The output turn: the call and its result as input items.
    turn = [{"role": "user", "content": ASK},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, sunny"}]
    r = c.responses.create(model=MODEL_ID, input=turn, tools=[WEATHER], temperature=0, max_output_tokens=24)
    assert r.status in ("completed", "incomplete") and r.output, r


def test_structured_output():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = S.client().responses.create(model=MODEL_ID, input="Make up a person.", max_output_tokens=40, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                                                     "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_previous_response_id_continues_the_stored_conversation():
    c = S.client()
    first = c.responses.create(model=MODEL_ID, input="My name is Ada. Say hello.", max_output_tokens=12,
                               temperature=0, extra_body={"cache_salt": "t1"})
    second = c.responses.create(model=MODEL_ID, input="What is my name?", previous_response_id=first.id,
                                max_output_tokens=12, temperature=0, extra_body={"cache_salt": "t1"})
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens, (first.usage, second.usage)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 2
    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    # Another tenant cannot continue it.
    try:
        c.responses.create(model=MODEL_ID, input="x", previous_response_id=first.id, max_output_tokens=2,
                           extra_body={"cache_salt": "t2"})
    except openai.NotFoundError as e:
        assert e.body["code"] == "response_not_found", e.body
    else:
        raise AssertionError("another tenant continued a stored response")
    c.responses.delete(first.id)
    try:
        c.responses.retrieve(first.id)
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("a deleted response is still there")
    unstored = c.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2, store=False)
    status, _, _ = request(S, "GET", f"/v1/responses/{unstored.id}")
    assert status == 404


def test_max_output_tokens_is_incomplete():
    r = S.client().responses.create(model=MODEL_ID, input="Write a long story.", max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 3


CODEX_TOOLS = [
    {"type": "web_search", "external_web_access": False},
    {"type": "namespace", "name": "agents", "description": "Tools that manage sub-agents.",
     "tools": [{"type": "function", "name": "spawn_agent", "description": "Start a sub-agent with a task.",
                "strict": False, "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                                                "required": ["message"], "additionalProperties": False}}]},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files.",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"*** Begin Patch\" /(.|\\n)*/"}},
    {"type": "custom", "name": "note", "description": "Keep a one-line note."},
    {"type": "function", "name": "shell", "description": "Run a shell command.",
     "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                    "required": ["command"]}},
]


def test_codex_tool_list():
    base = {"model": MODEL_ID, "tools": CODEX_TOOLS, "max_output_tokens": 48, "temperature": 0,
            "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "reasoning": {"summary": "auto"}}
    status, _, text = request(S, "POST", "/v1/responses", dict(
        base, input="Start a sub-agent that counts files.",
        tool_choice={"type": "function", "name": "spawn_agent", "namespace": "agents"}))
    assert status == 200, text
    r = json.loads(text)
    calls = [i for i in r["output"] if i["type"] == "function_call"]
    assert len(calls) == 1, r["output"]
    assert calls[0]["name"] == "spawn_agent" and calls[0]["namespace"] == "agents", calls
    assert isinstance(json.loads(calls[0]["arguments"])["message"], str)
    status, _, text = request(S, "POST", "/v1/responses", dict(
        base, input="Note that the build passed.", tool_choice={"type": "custom", "name": "note"}))
    assert status == 200, text
    r = json.loads(text)
    custom = [i for i in r["output"] if i["type"] == "custom_tool_call"]
    assert len(custom) == 1 and custom[0]["name"] == "note", r["output"]
    assert isinstance(custom[0]["input"], str) and not custom[0]["input"].startswith('{"input"'), custom
    # The SDK's stream of a custom call ends with its input.
    events = list(S.client().responses.create(
        model=MODEL_ID, input="Note that the build passed.", tools=CODEX_TOOLS, max_output_tokens=48,
        temperature=0, tool_choice={"type": "custom", "name": "note"}, stream=True))
    kinds = [e.type for e in events]
    assert "response.custom_tool_call_input.done" in kinds, kinds
    done = [e for e in events if e.type == "response.output_item.done"][-1]
    final = [e for e in events if e.type == "response.completed"][0].response.output
    input_done = [e for e in events if e.type == "response.custom_tool_call_input.done"][0]
    assert done.item.type == "custom_tool_call" and done.item.input, done
    assert input_done.input == done.item.input == final[-1].input, (input_done, done, final)
    # Codex resends the calls and their outputs as history.
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Do it."}]},
        {"type": "function_call", "name": "spawn_agent", "namespace": "agents", "call_id": "c1",
         "arguments": json.dumps({"message": "count"})},
        {"type": "function_call_output", "call_id": "c1", "output": "agent a1 started"},
        {"type": "custom_tool_call", "name": "apply_patch", "call_id": "c2", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]
    status, _, text = request(S, "POST", "/v1/responses", dict(base, input=history, max_output_tokens=4))
    assert status == 200, text
    assert json.loads(text)["status"] in ("completed", "incomplete"), text


def test_errors_name_the_field():
    c = S.client()
    cases = [
        (dict(input="x", tools=[{"type": "no_such_tool"}]), "tools[0].type"),
        (dict(input=[{"type": "computer_call"}]), "input[0].type"),
        (dict(input="x", previous_response_id="resp_nope"), "resp_nope"),
        (dict(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]), "input[0].content[0]"),
        (dict(input="x", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}), "schema"),
    ]
    for kwargs, needle in cases:
        try:
            c.responses.create(model=MODEL_ID, max_output_tokens=2, **kwargs)
        except (openai.BadRequestError, openai.NotFoundError) as e:
            assert needle in e.body["message"], (needle, e.body)
        else:
            raise AssertionError(f"{kwargs} was accepted")
    status, _, text = request(S, "POST", "/v1/responses", {"model": MODEL_ID})
    assert status == 400 and "input" in json.loads(text)["error"]["message"], text


def main():
    return run_tests(globals(), setup_module, teardown_module)


if __name__ == "__main__":
    raise SystemExit(main())
