#!/usr/bin/env python3
"""Ollama's API on `hearth serve` (qwen2.5-coder-0.5b), with the official
`ollama` Python client (pinned in scripts/requirements.txt):

- chat, whole and streamed: the streamed pieces join into the whole answer,
  which equals /v1/chat/completions' greedy answer for the same request;
  the last line carries done, done_reason, prompt_eval_count, eval_count
  and the durations in nanoseconds (total >= prompt + eval);
- a second turn of the same conversation reuses the first's KV (no
  session id: the anonymous reuse), so its prompt_eval_count is only the
  new tokens;
- tools: a tool_calls message whose arguments are an object following the
  schema; the tool result turn (tool results name no call id);
- format: a JSON schema (llguidance) and "json";
- options: num_predict ends the answer with done_reason "length";
- generate (the prompt under the chat template, `system`), and an empty
  prompt answering done_reason "load";
- list, show (details, model_info from the GGUF, capabilities, template),
  ps, version;
- errors: {"error": ...} naming the field or the unknown model (404), the
  API key required like every route.

Run: python3 tests/server/test_ollama.py [name filter]
"""
import json

import jsonschema
import ollama

from common import MODEL_ID, Server, request, run_tests

KEY = "ollama-test-key"
S = None
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def setup_module(module=None):
    global S
    S = Server("--api-key", KEY, ctx=4096, api_key=KEY)


def teardown_module(module=None):
    if S is not None:
        assert S.stop() == 0


def client(key=KEY):
    return ollama.Client(host=S.base.removesuffix("/v1"), headers={"Authorization": f"Bearer {key}"})


GREEDY = {"temperature": 0, "num_predict": 24}
HELLO = [{"role": "user", "content": "Name three primary colors."}]


def test_chat_whole_and_streamed_agree_with_chat_completions():
    c = client()
    whole = c.chat(model=MODEL_ID, messages=HELLO, options=GREEDY, stream=False)
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    parts = list(c.chat(model=MODEL_ID, messages=HELLO, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done, [p.done for p in parts]
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert last.done_reason in ("stop", "length") and last.eval_count == whole.eval_count, (last, whole)
    assert last.total_duration >= last.prompt_eval_duration + last.eval_duration > 0, last
    oa = S.client(KEY).chat.completions.create(model=MODEL_ID, messages=HELLO, temperature=0, max_tokens=24)
    assert oa.choices[0].message.content == whole.message.content
    assert whole.eval_count == oa.usage.completion_tokens, (whole.eval_count, oa.usage)


def test_the_next_turn_reuses_the_conversation():
    c = client()
    first = c.chat(model=MODEL_ID, messages=[{"role": "user", "content": "Write a haiku about the sea. " * 20}],
                   options=GREEDY, stream=False)
    turn2 = [{"role": "user", "content": "Write a haiku about the sea. " * 20},
             {"role": "assistant", "content": first.message.content},
             {"role": "user", "content": "Now one about rivers."}]
    second = c.chat(model=MODEL_ID, messages=turn2, options=GREEDY, stream=False)
    # Only the new turn is evaluated: the rest came from the KV.
    assert second.prompt_eval_count < first.prompt_eval_count / 2, (first.prompt_eval_count, second.prompt_eval_count)


def test_tools_and_the_result_turn():
    c = client()
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = c.chat(model=MODEL_ID, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 64},
               stream=False)
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r.message
    assert isinstance(calls[0].function.arguments, dict) and isinstance(calls[0].function.arguments["city"], str)
    streamed = list(c.chat(model=MODEL_ID, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 64},
                           stream=True))
    s_calls = [t for p in streamed for t in (p.message.tool_calls or [])]
    assert [t.function.name for t in s_calls] == ["get_weather"] and s_calls[0].function.arguments == calls[0].function.arguments
    follow = ask + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                      "arguments": {"city": "Paris"}}}]},
                    {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
    r2 = c.chat(model=MODEL_ID, messages=follow, tools=[WEATHER], options={"temperature": 0, "num_predict": 32},
                stream=False)
    assert r2.message.content, r2.message


def test_format_schema_and_json():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client().chat(model=MODEL_ID, messages=[{"role": "user", "content": "Invent a person."}], format=schema,
                      options={"temperature": 0, "num_predict": 64}, stream=False)
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client().generate(model=MODEL_ID, prompt="Give a JSON object with a key 'x'.", format="json",
                          options={"temperature": 0, "num_predict": 32}, stream=False)
    assert isinstance(json.loads(r.response), dict), r.response


def test_num_predict_and_generate():
    c = client()
    r = c.generate(model=MODEL_ID, prompt="Count from 1 to 100.", system="You count.",
                   options={"temperature": 0, "num_predict": 5}, stream=False)
    assert r.done_reason == "length" and r.eval_count == 5 and r.response, r
    parts = list(c.generate(model=MODEL_ID, prompt="Count from 1 to 100.", system="You count.",
                            options={"temperature": 0, "num_predict": 5}, stream=True))
    assert "".join(p.response for p in parts) == r.response and parts[-1].done
    load = c.generate(model=MODEL_ID, prompt="")
    assert load.done and load.done_reason == "load", load


def test_list_show_ps_version():
    c = client()
    models = c.list().models
    assert [m.model for m in models] == [MODEL_ID], models
    m = models[0]
    assert m.size > 100_000_000 and m.details.format == "gguf" and m.details.family == "qwen2", m
    assert m.details.quantization_level == "Q4_K_M" and m.details.parameter_size.endswith("M"), m.details
    info = c.show(MODEL_ID)
    assert info.modelinfo["general.architecture"] == "qwen2", list(info.modelinfo)[:10]
    assert info.modelinfo["qwen2.context_length"] == 32768
    assert "tools" in info.capabilities and "completion" in info.capabilities, info.capabilities
    assert "<|im_start|>" in info.template
    running = c.ps().models
    # ps counts what the model holds in memory (Ollama's meaning): its file and its KV.
    assert running[0].model == MODEL_ID and running[0].size > m.size, running
    status, _, text = request(S, "GET", "/api/version")
    assert status == 200 and json.loads(text)["version"], text


def test_errors_are_ollamas_shape():
    c = client()
    try:
        c.chat(model="llama3:8b", messages=HELLO, stream=False)
        raise AssertionError("an unknown model was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and "llama3:8b" in e.error and MODEL_ID in e.error, (e.status_code, e.error)
    for body, needle in (({"model": MODEL_ID, "messages": "hi"}, "messages"),
                         ({"model": MODEL_ID, "messages": HELLO, "options": {"warp": 1}}, "options.warp"),
                         ({"model": MODEL_ID, "messages": HELLO, "format": 5}, "format"),
                         ({"model": MODEL_ID, "prompt": "x", "raw": True}, "raw")):
        path = "/api/generate" if "prompt" in body else "/api/chat"
        status, _, text = request(S, "POST", path, body)
        assert status == 400 and needle in json.loads(text)["error"], (body, status, text)
    try:
        client("wrong").list()
        raise AssertionError("a wrong key was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 401, e


def main():
    return run_tests(globals(), setup_module, teardown_module)


if __name__ == "__main__":
    raise SystemExit(main())
