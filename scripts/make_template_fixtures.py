#!/usr/bin/env python3
"""Writes tests/fixtures/templates/<model>.json: chat-template renders made by
Hugging Face transformers, for crates/chat/tests/template_fixtures.rs to match
byte for byte.

The reference is transformers' own `apply_chat_template(..., tokenize=False)` on
a tokenizer whose only job is to carry the chat template and the special tokens
(a one-word WordLevel vocabulary: the tokenizer is not used when tokenize=False).
That runs the real pipeline: `_normalize_chat_messages` (drops None-valued keys),
`special_tokens_map` (bos_token/eos_token) merged under the caller's kwargs, and
`render_jinja_template` (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its own `tojson`, `raise_exception`, `strftime_now`, reasoning-field
aliasing).

Templates and special tokens come from the packaged GGUFs (read with the `gguf`
package). A GGUF without `tokenizer.chat_template` (gemma3-270m) gets hearth's
built-in template for its architecture (crates/chat/src/template/<arch>.jinja),
the same fallback `ChatTemplate::from_gguf` uses.

A conversation the template rejects (raise_exception, a type error) is recorded
as {"error": {"type": ..., "message": ...}} and hearth must fail on it too.

Usage: pip install transformers jinja2 gguf tokenizers
       python3 scripts/make_template_fixtures.py [--models-dir DIR]
"""

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "templates"
BUILTIN_DIR = ROOT / "crates" / "chat" / "src" / "template"

# registry name, GGUF file, which conversation set
MODELS = [
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen"),
    ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen"),
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "gemma"),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_code",
        "description": "Search the repository. Returns <= 10 matches & their paths.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "default": 10},
                "regex": {"type": "boolean"},
            },
            "required": ["query"],
        },
    },
}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def case(name, messages, tools=None, add_generation_prompt=True, kwargs=None):
    return {
        "name": name,
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": add_generation_prompt,
        "kwargs": kwargs or {},
    }


U = {"role": "user", "content": "Write a Python function that reverses a string."}
A = {"role": "assistant", "content": "def reverse(s):\n    return s[::-1]"}
SYS = {"role": "system", "content": "You are a terse coding assistant."}


def common_cases():
    """Conversations every template should take (or reject the same way)."""
    return [
        case("single_user", [U]),
        case("system_user", [SYS, U]),
        case("multi_turn_no_generation_prompt", [SYS, U, A], add_generation_prompt=False),
        case(
            "multi_turn_three_rounds",
            [U, A, {"role": "user", "content": "Now in Rust."}, {"role": "assistant", "content": "fn reverse(s: &str) -> String { s.chars().rev().collect() }"}, {"role": "user", "content": "Thanks!"}],
        ),
        case(
            "unicode",
            [
                {"role": "system", "content": "Réponds en français. 日本語もOK. Ünïcödé ✓"},
                {"role": "user", "content": "Qu'est-ce que «λ» ? 🦀🔥 \"quoted\" \\ back\\slash\ttab"},
            ],
        ),
        case("kwargs_extra_variables", [SYS, U], kwargs={"enable_thinking": False, "custom_flag": 1, "date_string": "26 Jul 2024"}),
        case("whitespace_content", [{"role": "user", "content": "  \n padded question \n\n "}]),
        case("empty_content", [{"role": "user", "content": ""}]),
        case("content_as_list", [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"}, {"type": "image"}]}]),
        case("reasoning_content_in_history", [U, dict(A, reasoning_content="The user wants slicing."), {"role": "user", "content": "Shorter?"}]),
        case("null_valued_keys_dropped", [{"role": "user", "content": "Hi", "name": None}, {"role": "assistant", "content": "Hello!", "tool_calls": None}], add_generation_prompt=False),
    ]


def qwen_cases():
    args = {"city": "Paris", "unit": "celsius"}
    return common_cases() + [
        case("tools_default_system", [{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER]),
        case("tools_with_system", [SYS, {"role": "user", "content": "Find TODOs."}], tools=[WEATHER, SEARCH]),
        case(
            "tool_call_cycle",
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", args)]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21.5, "sky": "clear"}'},
            ],
            tools=[WEATHER],
        ),
        case(
            "parallel_calls_and_results",
            [
                SYS,
                {"role": "user", "content": "Compare Paris and Tōkyō."},
                {
                    "role": "assistant",
                    "content": "Checking both.",
                    "tool_calls": [call("a", "get_weather", {"city": "Paris"}), call("b", "get_weather", {"city": "東京", "unit": "celsius"})],
                },
                {"role": "tool", "tool_call_id": "a", "content": "18C"},
                {"role": "tool", "tool_call_id": "b", "content": "24C"},
                {"role": "assistant", "content": "Tōkyō is warmer."},
                {"role": "user", "content": "And tomorrow?"},
            ],
            tools=[WEATHER],
        ),
        case(
            "tool_call_arguments_as_json_string",
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_weather", json.dumps(args))]},
                {"role": "tool", "content": "sunny"},
            ],
            tools=[WEATHER],
            add_generation_prompt=False,
        ),
        case(
            "tool_call_without_function_wrapper",
            [
                {"role": "user", "content": "Search for main."},
                {"role": "assistant", "tool_calls": [{"name": "search_code", "arguments": {"query": "fn main"}}]},
                {"role": "tool", "content": "src/main.rs:1"},
            ],
            tools=[SEARCH],
        ),
        case(
            "tool_arguments_numbers_unicode_escapes",
            [
                {"role": "user", "content": "Go."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        call(
                            "n",
                            "search_code",
                            {
                                "query": 'line1\nline2 "q" \\ </tool_call> ünï 🦀 \u0001',
                                "floats": [1.0, 0.5, 1e-7, 1.5e21, 123456789.125, -0.0],
                                "ints": [0, -3, 12345678901234],
                                "flags": [True, False, None],
                                "nested": {"z": 1, "a": {"b": []}, "empty": {}},
                            },
                        )
                    ],
                },
            ],
            tools=[SEARCH],
            add_generation_prompt=False,
        ),
        case("empty_tools_list", [U], tools=[]),
        case("system_not_first", [U, A, {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Again."}]),
        case("missing_content_user", [{"role": "user"}]),
    ]


def smollm_cases():
    return common_cases() + [
        case("tool_role_is_printed", [U, {"role": "assistant", "content": "Calling."}, {"role": "tool", "content": "result 42"}]),
        case("tools_are_ignored", [U], tools=[WEATHER]),
        case("special_tokens_in_content", [{"role": "user", "content": "Print <|im_end|> and <|im_start|>user literally."}]),
        case("two_system_messages", [SYS, {"role": "system", "content": "Second system."}, U]),
        case("missing_content_user", [{"role": "user"}]),
    ]


def gemma_cases():
    return common_cases() + [
        case("system_only", [SYS]),
        case("roles_not_alternating", [U, {"role": "user", "content": "Hello?"}]),
        case("assistant_first", [A, U]),
        case("tool_role_at_odd_index", [U, {"role": "tool", "content": "42"}], add_generation_prompt=False),
        case("tool_role_at_even_index", [U, A, {"role": "tool", "content": "42"}]),
        case("system_as_list_content", [{"role": "system", "content": [{"type": "text", "text": "Sys from parts."}]}, U]),
        case("content_is_number", [{"role": "user", "content": 42}]),
        case("missing_content_user", [{"role": "user"}]),
        case("tools_are_ignored", [U], tools=[WEATHER]),
    ]


CASES = {"qwen": qwen_cases, "smollm": smollm_cases, "gemma": gemma_cases}

# Templates written for hearth that exercise the jinja2 features Hub templates
# lean on (Python printing, tojson options, string methods, loop variables,
# namespaces, macros, whitespace control), one small template per case.
CONV = [
    {"role": "system", "content": "  Be brief.\n"},
    {"role": "user", "content": "Hello, wörld! 🦀 <b>&amp;</b>"},
    {
        "role": "assistant",
        "content": "<think>\nhmm\n</think>\n\nHi!",
        "reasoning_content": "hmm",
        "tool_calls": [call("c1", "f", {"b": 2.0, "a": [1, None, True], "s": "x\ny"})],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    {"role": "user", "content": "Again: a  b\tc"},
]
FEATURES = [
    ("print_python_values", "{{ true }} {{ false }} {{ none }} {{ 1 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e20 }} {{ [1, 'a', none] }} {{ {'k': true} }} {{ messages[2].tool_calls[0].function.arguments }}"),
    ("string_filter", "{{ true | string }}|{{ none | string }}|{{ 3.0 | string }}|{{ [1.5] | string }}"),
    ("tojson_default", "{{ messages | tojson }}"),
    ("tojson_options", "{{ tools | tojson(indent=2) }}\n{{ tools[0] | tojson(separators=(',', ':')) }}\n{{ tools[0] | tojson(sort_keys=true) }}\n{{ messages[1] | tojson(ensure_ascii=true) }}\n{{ tools[0] | tojson(indent='\t') }}"),
    ("tojson_scalars", "{{ 'a\"b' | tojson }} {{ 1.0 | tojson }} {{ none | tojson }} {{ [] | tojson }} {{ {} | tojson(indent=2) }} {{ {1: 2} | tojson }}"),
    ("string_methods", "{% set c = messages[0].content %}[{{ c.strip() }}][{{ c.lstrip() }}][{{ c.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ messages[4].content.split() }}][{{ 'a,b,,c'.split(',') }}][{{ 'a b c'.split(' ', 1) }}][{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}][{{ 'hello world'.title() }}][{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}][{{ 'abcabc'.replace('b', 'X') }}][{{ 'abc'.find('c') }}][{{ 'a\nb'.splitlines() }}][{{ '-'.join(['x', 'y']) }}][{{ 'aXa'.count('a') }}]"),
    ("think_split", "{% set c = messages[2].content %}{% if '</think>' in c %}{{ c.split('</think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}{% endif %}"),
    ("filters", "{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | unique | list }}|{{ 'abc' | upper }}|{{ '  x  ' | trim }}|{{ 'hello' | capitalize }}|{{ 'a-b' | replace('-', '+') }}|{{ [3, 1, 2] | sort }}|{{ [3, 1, 2] | reverse | list }}|{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ undefined_var | default('dflt') }}|{{ '' | default('empty', true) }}|{{ '42' | int + 1 }}|{{ '2.5' | float }}|{{ 2.567 | round(2) }}|{{ -3 | abs }}|{{ [1, 2, 3] | sum }}|{{ [4, 9] | max }}|{{ 'héllo' | length }}|{{ 'a\nb' | indent(2) }}"),
    ("more_filters", "{{ [1, true, none, 2.0, 'x'] | join(',') }}|{{ '%.2f' | format(3.14159) }}|{{ '%s-%s' | format('a', 1) }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ '{:>5}|{:.3f}'.format('ab', 2.5) }}|{% for k, v in {'a': 1, 'b': [2]} | items %}{{ k }}:{{ v }};{% endfor %}|{{ none is not none }}|{{ [1] == [1] }}{{ 'a' < 'b' }}{{ 2 >= 2.0 }}|{{ messages | selectattr('tool_calls', 'defined') | list | length }}|{{ [1, 2] | map('string') | join }}|{{ (messages | last).role }}"),
    ("tests", "{% for v in [none, true, 1, 1.5, 'x', [1], {'a': 1}] %}{{ v is none }}{{ v is boolean }}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is sequence }}{{ v is mapping }}{{ v is iterable }}|{% endfor %}{{ nope is defined }}{{ messages is defined }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' in 'cat' }}{{ 'role' in messages[0] }}{{ 2 not in [1] }}"),
    ("arithmetic", "{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 1 + 2.0 }} {{ 3 * 'ab' }} {{ [1] + [2] }} {{ -7 // 2 }} {{ 10 - 0.5 }}"),
    ("loop_variables", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem.role if loop.previtem is defined else '-' }}/{{ loop.cycle('a', 'b') }};{% endfor %}"),
    ("loop_controls", "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("namespace_and_reverse_scan", "{%- set ns = namespace(last_user=-1, multi_step=true) %}\n{%- for m in messages[::-1] %}\n    {%- set i = (messages | length - 1) - loop.index0 %}\n    {%- if ns.multi_step and m.role == 'user' %}\n        {%- set ns.multi_step = false %}\n        {%- set ns.last_user = i %}\n    {%- endif %}\n{%- endfor %}\nlast user at {{ ns.last_user }}"),
    ("whitespace_control", "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U: {{ m.content }}\n    {% elif m.role == 'assistant' %}\n  A: {{- m.content -}}  !\n    {% else %}\n{# comment #}\n    other {{ m.role }}\n    {% endif %}\n{% endfor %}\n{%+ if true %}  plus{% endif %}\n   {%- if add_generation_prompt %}\nGEN\n{% endif %}\n"),
    ("macro_and_call", "{% macro turn(role, text='(empty)') -%}\n<{{ role }}>{{ text }}</{{ role }}>\n{%- endmacro %}\n{% macro wrap() %}[{{ caller() }}]{% endmacro %}\n{{ turn('a') }}{{ turn('b', 'x') }}{% call wrap() %}inside{% endcall %}"),
    ("set_block_filter_raw", "{% set header %}H:{{ messages | length }}{% endset %}{{ header }}|{% filter upper %}up {{ 'x' }}{% endfilter %}|{% raw %}{{ not }}{% endraw %}"),
    ("dict_methods", "{% set args = messages[2].tool_calls[0].function.arguments %}{% for k, v in args.items() %}{{ k }}={{ v }};{% endfor %}|{{ args.keys() | list }}|{{ args.get('zz', 'dflt') }}|{{ args.get('b') }}|{% for k in args %}{{ k }}{% endfor %}|{{ dict(x=1, y='z') }}"),
    ("arguments_as_xml_parameters", "{% for tc in messages[2].tool_calls %}<function={{ tc.function.name }}>\n{% for name, value in tc.function.arguments | items %}<parameter={{ name }}>\n{% if value is mapping or (value is sequence and value is not string) %}{{ value | tojson | safe }}{% else %}{{ value | string }}{% endif %}\n</parameter>\n{% endfor %}</function>{% endfor %}"),
    ("reasoning_fields", "{% for m in messages %}{% if m.reasoning_content is defined %}{{ m.thinking }}={{ m.reasoning_content }}:{{ m | list }}{% endif %}{% endfor %}"),
    ("undefined_handling", "[{{ nope }}][{{ messages[0].nope }}][{% for x in nope %}{{ x }}{% endfor %}][{{ nope | default('d') }}][{{ (messages[9] is defined) }}]"),
    ("escape_filter", "{{ messages[1].content | e }}|{{ messages[1].content | escape | length }}"),
    ("format_method", "{{ '{}-{}'.format('a', 1) }}|{{ '{0}{1}{0}'.format('x', 'y') }}|{{ '{name}!'.format(name='n') }}"),
    ("string_concat_tilde", "{{ 'a' ~ 1 ~ 'b' }}|{{ 'n' ~ none }}|{{ 't' ~ true }}|{{ 'f' ~ 1.0 }}"),
    ("raise_in_macro", "{% macro check(m) %}{% if m.role not in ['user', 'assistant', 'system'] %}{{ raise_exception('Unexpected role: ' ~ m.role) }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}"),
    ("strftime_literal", "{{ strftime_now('%%') }}|{{ strftime_now('') }}|{{ date_string | default(strftime_now('%Y') | length) }}"),
    ("generation_block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}{% endif %}\n{% endfor %}"),
]


def feature_cases():
    return [dict(case(name, CONV, tools=[WEATHER, SEARCH]), template=src) for name, src in FEATURES]


def gguf_field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def load_model(path):
    r = gguf.GGUFReader(path)
    arch = gguf_field(r, "general.architecture")
    tokens = gguf_field(r, "tokenizer.ggml.tokens")

    def token(key):
        i = gguf_field(r, key)
        return "" if i is None else tokens[i]

    template = gguf_field(r, "tokenizer.chat_template")
    source = "gguf:tokenizer.chat_template"
    if template is None:
        template = (BUILTIN_DIR / f"{arch}.jinja").read_text()
        source = f"builtin:{arch}"
    return arch, template, source, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


def render(template, bos, eos, c):
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
        bos_token=bos,
        eos_token=eos,
        chat_template=template,
    )
    try:
        text = tok.apply_chat_template(
            c["messages"],
            tools=c["tools"],
            add_generation_prompt=c["add_generation_prompt"],
            tokenize=False,
            **c["kwargs"],
        )
        return {"expected": text}
    except Exception as e:  # the template (or the renderer) rejected it: hearth must too
        return {"error": {"type": type(e).__name__, "message": str(e)}}


def write_features(reference):
    """tests/fixtures/templates/jinja-features.json: one template per case."""
    cases = [{**c, **render(c["template"], "<s>", "</s>", c)} for c in feature_cases()]
    fixture = {"model": "jinja-features", "reference": reference, "bos_token": "<s>", "eos_token": "</s>", "cases": cases}
    out = OUT_DIR / "jinja-features.json"
    out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    n_err = sum("error" in c for c in cases)
    print(f"{out.relative_to(ROOT)}: {len(cases)} cases ({n_err} rejected by the template)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    home = os.environ.get("HEARTH_HOME") or os.path.expanduser("~/.cache/hearth")
    ap.add_argument("--models-dir", default=os.path.join(home, "models"))
    args = ap.parse_args()

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    reference = f"transformers {transformers.__version__} PreTrainedTokenizerBase.apply_chat_template(tokenize=False), jinja2 {jinja2.__version__}"
    for name, file, kind in MODELS:
        path = Path(args.models_dir) / file
        if not path.is_file():
            sys.exit(f"{path} is missing: run `hearth pull {name}` or scripts/fetch_models.py {name}")
        arch, template, source, bos, eos = load_model(path)
        cases = []
        for c in CASES[kind]():
            cases.append({**c, **render(template, bos, eos, c)})
        fixture = {
            "model": name,
            "gguf": file,
            "architecture": arch,
            "reference": reference,
            "template_source": source,
            "bos_token": bos,
            "eos_token": eos,
            "template": template,
            "cases": cases,
        }
        out = OUT_DIR / f"{name}.json"
        out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        n_err = sum("error" in c for c in cases)
        print(f"{out.relative_to(ROOT)}: {len(cases)} cases ({n_err} rejected by the template)")
    write_features(reference)


if __name__ == "__main__":
    main()
