#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/seeds/<target>/ (small inputs
that reach each target's main paths; libFuzzer grows its own corpus from them).

    python3 fuzz/make_seeds.py        (needs the `gguf` package for two seeds)

Input layouts are those documented in fuzz/src/lib.rs.
"""
import json, shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"


def write(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def gguf_seeds():
    write("gguf_reader", "small.gguf", (ROOT / "tests/fixtures/gguf/small.gguf").read_bytes())
    try:
        import gguf
        import numpy as np
    except ImportError:
        return
    tmp = SEEDS / "gguf_reader" / "tok.gguf"
    w = gguf.GGUFWriter(str(tmp), arch="llama")
    tokens = ["<unk>", "<s>", "</s>", "h", "e", "l", "o", "he", "ll", "hell", "hello", " ", "Ġ", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 4) + [3])
    w.add_token_merges(["h e", "l l", "he ll", "hell o"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}")
    w.add_tensor("w", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spm = SEEDS / "gguf_reader" / "spm.gguf"
    w = gguf.GGUFWriter(str(spm), arch="gemma3")
    pieces = ["<unk>", "<s>", "</s>", "▁", "▁h", "h", "i", "▁hi", "<0x0A>"]
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -3.0, -1.5, -4.0])
    w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1, 6])
    w.add_tensor("t", np.zeros(4, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def template_seeds():
    for model in ["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"]:
        fx = json.loads((ROOT / f"tests/fixtures/templates/{model}.json").read_text())
        for i, case in enumerate(fx["cases"][:6]):
            conv = {"messages": case["messages"], "tools": case.get("tools"), "kwargs": case.get("kwargs") or {}}
            write("chat_template", f"{model}-{i}", b"\x80" + json.dumps(conv).encode())
    fx = json.loads((ROOT / "tests/fixtures/templates/jinja-features.json").read_text())
    for i, case in enumerate(fx["cases"][:24]):
        conv = {"messages": case["messages"], "tools": case.get("tools"), "kwargs": case.get("kwargs") or {}}
        write("chat_template", f"jinja-{i}", b"\x81" + case["template"].encode() + b"\0" + json.dumps(conv).encode())


def request_seeds():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    bodies = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"model": "model", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1, "max_tokens": 16, "stop": ["\n", "END"], "stream": True,
         "stream_options": {"include_usage": True}, "session_id": "abc-1"},
        {"messages": [{"role": "user", "content": "w?"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "c0", "content": "sunny"}],
         "tools": tools, "tool_choice": "auto", "chat_template_kwargs": {"return_reasoning": True, "enable_thinking": False}},
        {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}},
        {"prompt": "Once upon a time", "max_completion_tokens": 8, "stop": "."},
        {"prompt": ["a", "b"], "n": 2, "logprobs": True},
    ]
    for i, b in enumerate(bodies):
        write("server_request", f"body-{i}", json.dumps(b))
    write("server_request", "not-object", "[1, 2]")


def parser_seeds():
    # byte 0: options (bit 0-1 tools, 2 text policy, 3 start in <think>, 4 length); byte 1: chunk seed
    texts = {
        "hermes": [
            "The tag <tool_call> is how I call tools, but here I just answer: 42.",
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": \"true\"}}\n</tool_call><|im_end|>",
            "<think>maybe <tool_call>{\"name\": \"add\"}</tool_call></think>\n\nNo call.",
            "<tool_call>[{\"name\": \"read.file\", \"parameters\": {\"path\": \"/x\"}}, {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": \\\"</tool_call>\\\"}\"}]</tool_call>",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```",
            "Before<tool_call>not json</tool_call> after",
        ],
        "qwen3_xml": [
            "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "<function=add>\n<parameter=c>\nNone\n</parameter>\n<parameter=d>\n[1, 2]\n</parameter>\n</function>\n<function=f>\n<parameter=x>\na </parameter> b\n</parameter>\n</function>",
            "<think>\nuse <function=f>\n</function>\n</think>\n\nOK <function=f>\n<parameter=x>\nabc",
        ],
        "atem": [
            "Sure! <atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n</atem:invoke>\n<atem:invoke name=\"add\">\n<atem:parameter name=\"a\">1e3</atem:parameter>\n<atem:parameter name=\"b\">False</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "<atem:invoke name=\"f\">\n<atem:parameter name=\"x\">a </atem:parameter> b</atem:parameter>\n</atem:invoke>\nThe tag <atem:function_calls> is text.",
        ],
        "muse_glimmer": [
            " to=self<|message|>Need weather.<|eom|><|start|>assistant to=get_weather constrain=json<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Par</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>",
            " to=user<|message|>Use goto=label; set auto=true. to=self<|message|>x<|eom|><|start|>assistant<|message|>b<|end_of_text|>",
        ],
        "harmony": [
            "<|channel|>analysis<|message|>User asks.<|end|><|start|>assistant<|channel|>final<|message|>391<|return|>",
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.add<|channel|>commentary <|constrain|>json<|message|>{\"a\": 1, \"b\": true}<|call|><|start|>assistant<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"q\": \"x\"",
        ],
        "plain": ["<|start|>x <tool_call>{}</tool_call> to=self<|message|>"],
    }
    for fmt, items in texts.items():
        for i, t in enumerate(items):
            for flags in [0x01, 0x14, 0x0b if fmt in ("hermes", "qwen3_xml") else 0x02]:
                write(f"parse_{fmt}", f"{i}-{flags:02x}", bytes([flags, 7 * i + flags]) + t.encode())


if __name__ == "__main__":
    if SEEDS.exists():
        shutil.rmtree(SEEDS)
    gguf_seeds()
    template_seeds()
    request_seeds()
    parser_seeds()
    for d in sorted(SEEDS.iterdir()):
        print(d.name, len(list(d.iterdir())), sum(f.stat().st_size for f in d.iterdir()))
