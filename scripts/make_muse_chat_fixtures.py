#!/usr/bin/env python3
"""Writes tests/fixtures/muse_glimmer/chat/: conversations rendered through llama.cpp 11434's
Muse Glimmer chat template (models/templates/muse-glimmer.jinja, copied next to the fixtures)
by llama.cpp's own chat code, for crates/chat/tests/muse_glimmer_template.rs to match byte for
byte.

The renderer is scripts/muse_chat_dump.cpp, linked against the reference build's
libllama-common (scripts/build-llamacpp.sh): common_chat_templates_init +
common_chat_templates_apply, with each case's request fields turned into the inputs as
llama-server does (messages and tools through common_chat_{msgs,tools}_parse_oaicompat,
chat_template_kwargs JSON-dumped, the request's "reasoning_effort" put into the kwargs). Its
clock is fixed at 2026-03-14 12:00 UTC (strftime_now), run with TZ=UTC.

Usage: python3 scripts/make_muse_chat_fixtures.py
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "muse_glimmer" / "chat"
BOS, EOS = "<|begin_of_text|>", "<|eot|>"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
EDIT = {"type": "function", "function": {
    "name": "edit", "description": "Edit a file — «unicode» is kept.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "dry": {"type": "boolean"}, "line": {"type": "integer"},
        "opts": {"type": "object"}, "tags": {"type": "array"}, "note": {"type": "string"}}}}}
FILES = [{"type": "function", "function": {"name": f"files.{n}", "description": f"{n.title()} a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
         for n in ("read", "write")]

CASES = [
    {"name": "user_only", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_with_effort_text", "messages": [
        {"role": "system", "content": "You are terse.\nReasoning effort: low"},
        {"role": "user", "content": "Why is the sky blue?"}]},
    {"name": "reasoning_effort_field", "reasoning_effort": "medium",
     "messages": [{"role": "user", "content": "Plan a trip."}]},
    {"name": "tools_offered", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"}]},
    {"name": "tool_call_and_result", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"}]},
    {"name": "typed_arguments", "tools": [EDIT], "messages": [
        {"role": "user", "content": "Fix the typo."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "e1", "type": "function", "function": {
            "name": "edit", "arguments": json.dumps({"path": "a b.txt", "dry": False, "line": 42,
                                                     "opts": {"k": [1, 2.5]}, "tags": ["x", "y"],
                                                     "note": None}, ensure_ascii=False)}}]},
        {"role": "tool", "name": "edit", "tool_call_id": "e1", "content": "ok"},
        {"role": "user", "content": "Thanks — and again?"}]},
    {"name": "reasoning_history", "messages": [
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "reasoning_content": "17*23 = 391.", "content": "391"},
        {"role": "user", "content": "And 391/17?"}]},
    {"name": "parallel_namespaced_calls", "tools": FILES,
     "chat_template_kwargs": {"tool_namespace_descriptions": {"files": "File access"}},
     "messages": [
         {"role": "user", "content": "Copy a to b."},
         {"role": "assistant", "reasoning_content": "Read then write.", "content": "", "tool_calls": [
             {"id": "r", "type": "function", "function": {"name": "files.read", "arguments": "{\"path\": \"a\"}"}},
             {"id": "w", "type": "function", "function": {"name": "files.write", "arguments": "{\"path\": \"b\"}"}}]},
         {"role": "tool", "tool_call_id": "r", "content": "data"},
         {"role": "tool", "tool_call_id": "w", "content": "done"}]},
    {"name": "image_marker", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "media_marker", "text": "<__media__>"},
            {"type": "text", "text": "Be brief."}]}]},
    {"name": "kwargs_dates_and_strength",
     "chat_template_kwargs": {"current_date": "2025-01-02", "knowledge_cutoff": "2025-06-01",
                              "reasoning_strength": "low"},
     "reasoning_effort": "high",
     "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Still there?"}]},
    {"name": "system_tools_consecutive_assistant", "tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be helpful. Reasoning Strength: high."},
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": "Checking."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "-3 C"},
        {"role": "assistant", "content": "It is -3 C."},
        {"role": "user", "content": "Thanks."}]},
]


def build_dir() -> Path:
    """The reference build: only its libraries are needed (libllama-common, libllama, ggml), so
    an existing build dir with them is used as is; otherwise scripts/build-llamacpp.sh makes one."""
    cache = Path(os.environ.get("HEARTH_REF_CACHE", Path.home() / ".cache" / "hearth-ref"))
    ver = os.environ.get("LLAMACPP_VERSION", "11434.0.0")
    for b in sorted(cache.glob(f"build-{ver}-cpu*")):
        if (b / "common" / "libllama-common.a").is_file() and (b / "src" / "libllama.a").is_file():
            return b
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build-llamacpp.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Path(out).parent


def compile_dumper(build: Path) -> Path:
    cache = (build / "CMakeCache.txt").read_text()
    lsrc = Path(re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M).group(1))
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_muse_fixtures as mmf  # link_libs: llama-debug's link line
    src = ROOT / "scripts" / "muse_chat_dump.cpp"
    exe = build / "muse-dump" / "muse_chat_dump"
    exe.parent.mkdir(exist_ok=True)
    cmd = [os.environ.get("CXX", "c++"), "-O1", "-std=c++17", "-DGGML_USE_CPU",
           f"-I{lsrc}/common", f"-I{lsrc}/vendor", f"-I{lsrc}/include", f"-I{lsrc}/ggml/include",
           f"-I{lsrc}/src", str(src), "-o", str(exe)] + mmf.link_libs(build)
    subprocess.run(cmd, cwd=build, check=True)
    return exe, lsrc


def main() -> None:
    build = build_dir()
    exe, lsrc = compile_dumper(build)
    template = lsrc / "models" / "templates" / "muse-glimmer.jinja"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, OUT_DIR / "muse-glimmer.jinja")
    with tempfile.TemporaryDirectory() as tmp:
        cases, out = Path(tmp) / "cases.json", Path(tmp) / "out.json"
        cases.write_text(json.dumps(CASES, ensure_ascii=False))
        subprocess.run([str(exe), str(template), BOS, EOS, str(cases), str(out)], check=True,
                       env={**os.environ, "TZ": "UTC"})
        rendered = json.loads(out.read_text())
    records = []
    for case, r in zip(CASES, rendered):
        assert case["name"] == r["name"]
        records.append({**case, **{k: v for k, v in r.items() if k != "name"}})
    doc = {
        "about": "Conversations rendered through llama.cpp 11434's Muse Glimmer chat template "
                 "(muse-glimmer.jinja here, copied from its models/templates) by llama.cpp's own chat code "
                 "(scripts/muse_chat_dump.cpp against libllama-common: common_chat_templates_apply with "
                 "llama-server's input handling; clock fixed at 2026-03-14 12:00 UTC). Written by "
                 "scripts/make_muse_chat_fixtures.py.",
        "template": "muse-glimmer.jinja",
        "template_sha256": hashlib.sha256(template.read_bytes()).hexdigest(),
        "bos_token": BOS,
        "eos_token": EOS,
        "now_utc": "2026-03-14T12:00:00Z",
        "cases": records,
    }
    (OUT_DIR / "render.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    for r in records:
        print(r["name"], "error: " + r["error"] if "error" in r else f"{len(r['prompt'])} chars")


if __name__ == "__main__":
    main()
