#!/usr/bin/env python3
"""Training prompts for the DFlash drafters of the packaged coders, as token ids.

Every source is on the machine that runs it (nothing is downloaded), and the
manifest written beside the prompts records which (sources, package versions,
counts per kind), so a run can be re-made from PyPI packages:

- the Python standard library and every installed package's pure-Python
  sources (`site-packages`; at most --per-package functions from each
  distribution so no single package dominates): functions and classes, and
  their docstrings as task descriptions;
- this repository's Rust sources (`crates/`) and Python scripts.

Kinds of prompt (the share of each is fixed, see KINDS): coding tasks from
task lists and from docstrings, edit / fix / explain / translate / test
requests about functions, agent turns in the model's tool-call format (a
file read through a tool, then a request to change it), two-turn chats that
ask for a change to code the assistant wrote, and raw prefixes to continue.
The target model writes the answers later (train.py gen, on the GPU); this
script only renders and tokenizes the prompts.

Held out, never used here: bench/prompts/*.txt and bench/prompts-heldout/*.txt
(the benchmark prompts). The task lists below avoid their tasks.

    python3 train/dflash/make_prompts.py --tokenizer TOKENIZER.json --out prompts.jsonl [--n 52000]

TOKENIZER.json is the packaged model's HF tokenizer (scripts/fixtures/make_tokenizer_fixtures.py
writes it beside the GGUF). Output lines: {"ids": [...], "kind": K, "temp": T};
OUT.manifest.json beside it.
"""
import argparse
import ast
import json
import os
import random
import re
import sys
import sysconfig

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
AGENT_SYSTEM = (
    "You are a coding agent working in the user's repository. Use the tools to read and change files "
    "and to run commands. Keep answers short; make the change the user asks for and nothing else."
)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def turn(role, text):
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def chat(user: str, system: str = SYSTEM) -> str:
    # The GGUF's chat template with one user message (what `hearth run --chat`
    # renders: `hearth template -m qwen2.5-coder-0.5b` prints the same bytes).
    return turn("system", system) + turn("user", user) + "<|im_start|>assistant\n"


TOOLS = [
    {"type": "function", "function": {"name": "read", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Path of the file"}},
                    "required": ["path"]}}},
    {"type": "function", "function": {"name": "edit", "description": "Replace an exact piece of text in a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old_text": {"type": "string"},
                    "new_text": {"type": "string"}}, "required": ["path", "old_text", "new_text"]}}},
    {"type": "function", "function": {"name": "write", "description": "Write a whole file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command and return its output.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]


def tool_system(system: str) -> str:
    # Qwen2.5's template with tools (the block its chat template appends).
    lines = "\n".join(json.dumps(t) for t in TOOLS)
    return (
        f"{system}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    )


LANGS = ["Python", "Rust", "JavaScript", "TypeScript", "Go", "C", "C++", "Java", "Bash", "Kotlin"]

TASKS = [
    "parses a date string in ISO 8601 format and returns the day of the week",
    "merges two sorted lists into one sorted list",
    "checks whether a string is a palindrome, ignoring case and punctuation",
    "computes the n-th Fibonacci number iteratively",
    "flattens an arbitrarily nested list",
    "returns the k most common elements of a list",
    "validates an email address with a simple regular expression",
    "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral",
    "implements a stack with push, pop and peek",
    "implements a queue using two stacks",
    "implements a min-heap with insert and extract_min",
    "performs a breadth-first search on a graph given as an adjacency list",
    "performs a depth-first search and returns the visit order",
    "finds the shortest path in a weighted graph with Dijkstra's algorithm",
    "detects a cycle in a directed graph",
    "computes a topological order of a directed acyclic graph",
    "implements union-find with path compression",
    "computes the Levenshtein distance between two strings",
    "finds the longest common subsequence of two strings",
    "sorts a list with merge sort",
    "sorts a list with quicksort",
    "sorts a list with insertion sort",
    "rotates a matrix by 90 degrees clockwise",
    "transposes a matrix",
    "multiplies two matrices",
    "reads a CSV file and computes the average of one column",
    "writes a list of records to a JSON file",
    "counts the lines, words and characters of a text file",
    "recursively lists all files under a directory with a given extension",
    "computes the SHA-256 hash of a file in chunks",
    "retries a function call with exponential backoff",
    "implements a simple rate limiter (token bucket)",
    "parses command-line arguments for an input file and a verbose flag",
    "formats a number of bytes as a human-readable size",
    "converts a snake_case string to camelCase",
    "converts a camelCase string to snake_case",
    "removes duplicate elements from a list while keeping the order",
    "groups a list of records by a key",
    "chunks a list into pieces of a given size",
    "computes the prime numbers up to n with the sieve of Eratosthenes",
    "checks whether a number is prime",
    "computes the greatest common divisor and least common multiple",
    "generates all permutations of a list",
    "generates all subsets of a set",
    "solves the N-queens problem",
    "checks whether parentheses, brackets and braces are balanced",
    "evaluates an arithmetic expression in reverse Polish notation",
    "tokenizes a simple arithmetic expression",
    "implements a trie with insert and starts_with",
    "implements a singly linked list with append and reverse",
    "finds the middle node of a linked list",
    "implements a binary search tree with insert and in-order traversal",
    "computes the height of a binary tree",
    "serializes a binary tree to a string and back",
    "finds two numbers in a list that add up to a target",
    "finds the maximum subarray sum (Kadane's algorithm)",
    "computes the running median of a stream of numbers",
    "implements a circular buffer of fixed capacity",
    "parses a URL query string into a dictionary",
    "builds a URL query string from a dictionary",
    "escapes HTML special characters in a string",
    "wraps text to a given line width",
    "counts vowels and consonants in a string",
    "reverses the words of a sentence",
    "computes the factorial of n with memoization",
    "computes the power set size and prints each subset",
    "implements matrix exponentiation",
    "converts a temperature between Celsius and Fahrenheit",
    "computes simple and compound interest",
    "validates a Sudoku board",
    "implements Conway's Game of Life step",
    "implements a simple key-value store with expiry times",
    "reads environment variables with defaults and type conversion",
    "implements a thread-safe counter",
    "runs tasks concurrently with a worker pool",
    "downloads several URLs concurrently and reports their sizes",
    "implements a simple event emitter with on, off and emit",
    "implements a finite state machine for a traffic light",
    "parses a simple INI configuration file",
    "pretty-prints a table of rows with aligned columns",
    "implements a simple logger with levels",
    "computes statistics (mean, median, mode, standard deviation) of a list",
    "implements run-length encoding and decoding",
    "implements a Caesar cipher",
    "implements base64 encoding without a library",
    "checks whether two strings are anagrams",
    "finds the longest substring without repeating characters",
    "implements a simple tokenizer for a JSON-like format",
    "implements the observer pattern",
    "implements the builder pattern for a HTTP request object",
    "validates a password's strength",
    "generates a random password of a given length",
    "implements a bank account class with deposit, withdraw and a history",
    "implements a to-do list class with add, complete and list methods",
    "paginates a list of items",
    "implements interval merging",
    "computes the edit script between two lists of lines",
]

PHRASES = [
    "Write a {lang} function that {task}.",
    "Write a {lang} program that {task}. Include a short example of its use.",
    "In {lang}, implement a function that {task}. Add comments explaining each step.",
    "Show me idiomatic {lang} code that {task}.",
    "Write a {lang} function that {task}, with unit tests.",
    "Implement, in {lang}, code that {task}. Keep it short.",
]

EDITS = [
    "Add type hints to every function in this code. Return the whole edited code.",
    "Add docstrings to every function in this code. Return the whole edited code.",
    "Add logging with the logging module to this code. Return the whole edited code.",
    "Rename the variables in this function to clearer names. Return the whole edited code.",
    "Refactor this function to be easier to read. Return the whole edited code.",
    "Explain what this function does, step by step.",
    "Write unit tests with pytest for this function.",
    "Translate this Python function to JavaScript.",
    "Translate this Python function to TypeScript.",
    "Translate this Python function to Rust.",
    "Translate this Python function to Go.",
    "Find possible bugs in this function and return a corrected version.",
    "Add error handling to this function. Return the whole edited code.",
    "Make this function faster if possible and explain the change.",
    "Rewrite this function without any comments or docstrings. Return only code.",
    "Convert this code to use pathlib where it uses os.path. Return the whole edited code.",
    "Add input validation to this function. Return the whole edited code.",
    "Write a short summary of this code, then return it with comments added.",
]



AGENT_ASKS = [
    "In {path}, add type hints to `{name}`.",
    "Add a docstring to `{name}` in {path}.",
    "There is a bug in `{name}` in {path}: it fails on empty input. Fix it.",
    "Rename `{name}` in {path} to something clearer and update its uses in the file.",
    "Add input validation to `{name}` in {path}.",
    "Make `{name}` in {path} log what it does with the logging module.",
    "Write tests for `{name}` from {path} in a new file tests/test_{short}.py.",
    "Explain what `{name}` in {path} does.",
    "Refactor `{name}` in {path} to use early returns.",
    "Change `{name}` in {path} so that it raises ValueError instead of returning None on bad input.",
]
RUST_ASKS = [
    "Explain what this Rust function does.",
    "Add doc comments to this Rust code. Return the whole edited code.",
    "Write unit tests for this Rust function.",
    "Find possible bugs in this Rust code and return a corrected version.",
    "Translate this Rust function to Python.",
    "Rewrite this Rust function to be easier to read. Return the whole edited code.",
]
FOLLOW_UPS = [
    "Now add type hints to it.",
    "Now add error handling and return the whole code again.",
    "Write tests for it.",
    "Rename the variables to clearer names and show the whole code again.",
    "Add comments that explain each step.",
    "Make it handle an empty input and show the whole code again.",
    "Translate it to JavaScript.",
    "Now write it in Rust.",
]

# The share of each kind of prompt.
KINDS = {"task": 0.12, "docstring_task": 0.14, "edit": 0.26, "rust": 0.08, "agent": 0.18, "followup": 0.10, "raw": 0.12}


def py_items(path, max_lines, min_lines):
    try:
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
    except Exception:
        return [], None
    lines = src.splitlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and hasattr(node, "end_lineno"):
            n = node.end_lineno - node.lineno + 1
            if min_lines <= n <= max_lines:
                body = lines[node.lineno - 1 : node.end_lineno]
                indent = len(body[0]) - len(body[0].lstrip())
                body = [l[indent:] if l[:indent].strip() == "" else l for l in body]
                doc = ast.get_docstring(node) or ""
                out.append({"name": node.name, "code": "\n".join(body), "doc": doc.strip().split("\n\n")[0]})
    return out, src


def scan_python(root, skip, per_source, rng, label):
    """Functions and classes (and whole modules for the agent turns) under root,
    grouped by top-level package; at most per_source items from each."""
    groups = {}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.endswith((".dist-info", ".egg-info")))
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0] if rel != "." else None
        for f in sorted(files):
            if f.endswith(".py"):
                key = top or f[:-3]
                groups.setdefault(key, []).append(os.path.join(dirpath, f))
    items, modules, counts = [], [], {}
    for key in sorted(groups):
        paths = groups[key]
        rng.shuffle(paths)
        got = []
        for p in paths[: max(8, per_source // 4)]:
            its, src = py_items(p, 45, 6)
            for it in its:
                it["path"] = os.path.relpath(p, root)
                it["source"] = f"{label}:{key}"
            got += its
            if src and 40 <= src.count("\n") <= 260 and its:
                modules.append({"path": os.path.relpath(p, root), "src": src, "items": its, "source": f"{label}:{key}"})
            if len(got) >= per_source:
                break
        rng.shuffle(got)
        got = got[:per_source]
        if got:
            counts[f"{label}:{key}"] = len(got)
        items += got
    return items, modules, counts


def rust_items(rng):
    out = []
    for dirpath, dirnames, files in os.walk(os.path.join(REPO, "crates")):
        dirnames[:] = sorted(d for d in dirnames if d not in ("target", "prebuilt"))
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            lines = open(os.path.join(dirpath, f), encoding="utf-8", errors="replace").read().splitlines()
            i = 0
            while i < len(lines):
                l = lines[i]
                if re.match(r"\s*(pub(\([a-z]+\))? )?(async )?(unsafe )?fn \w+", l) and l.rstrip().endswith("{"):
                    indent = len(l) - len(l.lstrip())
                    for j in range(i + 1, min(i + 60, len(lines))):
                        if lines[j].startswith(" " * indent + "}") and len(lines[j]) - len(lines[j].lstrip()) == indent:
                            if j - i >= 5:
                                out.append("\n".join(x[indent:] for x in lines[i : j + 1]))
                            i = j
                            break
                i += 1
    rng.shuffle(out)
    return out


def versions():
    try:
        from importlib import metadata
        return sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]})
    except Exception:
        return []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=52000, help="number of prompts")
    ap.add_argument("--per-package", type=int, default=600, help="most functions taken from one package")
    ap.add_argument("--max-tokens", type=int, default=2400, help="longest prompt kept (tokens)")
    ap.add_argument("--seed", type=int, default=17)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    rng = random.Random(a.seed)
    skip = {"test", "tests", "idlelib", "lib2to3", "__pycache__", "site-packages", "dist-packages"}
    std, std_mods, counts = scan_python(sysconfig.get_paths()["stdlib"], skip, 4000, rng, "stdlib")
    site_items, site_mods = [], []
    for sp in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        if os.path.isdir(sp):
            it, mo, c = scan_python(sp, skip, a.per_package, rng, "site")
            site_items += it
            site_mods += mo
            counts.update(c)
    repo_py, repo_mods, c = scan_python(os.path.join(REPO, "scripts"), skip, 400, rng, "repo")
    counts.update(c)
    funcs = std + site_items + repo_py
    mods = std_mods + site_mods + repo_mods
    rng.shuffle(funcs)
    rng.shuffle(mods)
    docs = [f for f in funcs if 20 <= len(f["doc"]) <= 400 and not f["doc"].startswith((">>>", ":"))]
    rust = rust_items(rng)
    print(f"{len(funcs)} functions/classes ({len(std)} stdlib, {len(site_items)} site-packages, {len(repo_py)} repo), "
          f"{len(docs)} docstrings, {len(mods)} modules, {len(rust)} Rust functions", file=sys.stderr)

    def pick(xs, i):
        return xs[i % len(xs)]

    prompts = []
    want = {k: int(a.n * v) for k, v in KINDS.items()}
    want["edit"] += a.n - sum(want.values())
    for i in range(want["task"]):
        prompts.append(("task", chat(rng.choice(PHRASES).format(lang=rng.choice(LANGS), task=rng.choice(TASKS)))))
    for i in range(want["docstring_task"]):
        f = pick(docs, i)
        lang = rng.choice(["Python"] * 5 + LANGS)
        text = rng.choice([
            "Write a {lang} function `{name}` that does the following:\n\n{doc}",
            "Implement `{name}` in {lang}. Its documentation says:\n\n{doc}",
            "Here is the description of a function:\n\n{doc}\n\nWrite it in {lang}.",
        ]).format(lang=lang, name=f["name"], doc=f["doc"])
        prompts.append(("docstring_task", chat(text)))
    for i in range(want["edit"]):
        f = pick(funcs, i)
        prompts.append(("edit", chat(f"{rng.choice(EDITS)}\n\n```python\n{f['code']}\n```")))
    for i in range(want["rust"]):
        prompts.append(("rust", chat(f"{rng.choice(RUST_ASKS)}\n\n```rust\n{pick(rust, i)}\n```")))
    for i in range(want["agent"]):
        m = pick(mods, i)
        it = rng.choice(m["items"])
        path = m["path"]
        ask = rng.choice(AGENT_ASKS).format(path=path, name=it["name"], short=it["name"].lower().strip("_") or "it")
        call = json.dumps({"name": "read", "arguments": {"path": path}})
        text = (turn("system", tool_system(AGENT_SYSTEM)) + turn("user", ask)
                + turn("assistant", f"<tool_call>\n{call}\n</tool_call>")
                + turn("user", f"<tool_response>\n{m['src']}\n</tool_response>") + "<|im_start|>assistant\n")
        prompts.append(("agent", text))
    for i in range(want["followup"]):
        f = pick(funcs, i * 7 + 3)
        first = f"Write a Python function `{f['name']}`." + (f" {f['doc']}" if f["doc"] else "")
        text = (turn("system", SYSTEM) + turn("user", first) + turn("assistant", f"```python\n{f['code']}\n```")
                + turn("user", rng.choice(FOLLOW_UPS)) + "<|im_start|>assistant\n")
        prompts.append(("followup", text))
    for i in range(want["raw"]):
        if i % 4 == 3:
            code = pick(rust, i * 3 + 1).splitlines()
        else:
            code = pick(funcs, i * 5 + 2)["code"].splitlines()
        keep = max(2, len(code) // 3)
        prompts.append(("raw", "\n".join(code[:keep]) + "\n"))
    rng.shuffle(prompts)
    kept, dropped, per_kind, n_tok = 0, 0, {}, 0
    with open(a.out, "w") as out:
        for kind, text in prompts:
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) > a.max_tokens:
                dropped += 1
                continue
            # Half greedy, half sampled at T=0.7 (the target's own outputs either way).
            out.write(json.dumps({"ids": ids, "kind": kind, "temp": 0.0 if kept % 2 == 0 else 0.7}) + "\n")
            kept += 1
            n_tok += len(ids)
            per_kind[kind] = per_kind.get(kind, 0) + 1
    manifest = {"prompts": kept, "dropped_too_long": dropped, "prompt_tokens": n_tok, "per_kind": per_kind,
                "python": sys.version.split()[0], "sources": counts, "installed": versions(), "seed": a.seed}
    json.dump(manifest, open(a.out + ".manifest.json", "w"), indent=1)
    print(f"wrote {kept} prompts ({n_tok} tokens, {dropped} too long) to {a.out}: {per_kind}", file=sys.stderr)


if __name__ == "__main__":
    main()
