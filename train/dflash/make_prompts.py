#!/usr/bin/env python3
"""Training prompts for the DFlash drafter of qwen2.5-coder-0.5b, as token ids.

Everything comes from this repository and the machine's own Python standard
library (nothing downloaded): coding instructions built from task and
language lists, edit/fix/explain/translate requests about functions taken
from the standard library's sources, and raw code prefixes to continue. The
target model writes the answers later (train.py, on the GPU); this script
only renders and tokenizes the prompts.

Held out, never used here: bench/prompts/*.txt and bench/prompts-heldout/*.txt
(the benchmark prompts). The task lists below avoid their tasks.

    python3 train/dflash/make_prompts.py --tokenizer TOKENIZER.json --out prompts.jsonl [--n 6000]

TOKENIZER.json is the packaged model's HF tokenizer (scripts/fixtures/make_tokenizer_fixtures.py
writes it beside the GGUF). Output lines: {"ids": [...], "kind": "chat"|"raw", "temp": T}.
"""
import argparse
import ast
import json
import os
import random
import sys
import sysconfig

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chat(user: str) -> str:
    # The GGUF's chat template with one user message (what `hearth run --chat`
    # renders: `hearth template -m qwen2.5-coder-0.5b` prints the same bytes).
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
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


def stdlib_functions(max_lines=45, min_lines=6):
    """Source of functions and classes from the standard library."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("test", "tests", "site-packages", "idlelib", "lib2to3", "__pycache__")]
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            try:
                src = open(path, encoding="utf-8").read()
                tree = ast.parse(src)
            except Exception:
                continue
            lines = src.splitlines()
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and hasattr(node, "end_lineno"):
                    n = node.end_lineno - node.lineno + 1
                    if min_lines <= n <= max_lines:
                        body = lines[node.lineno - 1 : node.end_lineno]
                        indent = len(body[0]) - len(body[0].lstrip())
                        body = [l[indent:] if l[:indent].strip() == "" else l for l in body]
                        out.append("\n".join(body))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=6000, help="number of prompts")
    ap.add_argument("--seed", type=int, default=17)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    rng = random.Random(a.seed)
    funcs = stdlib_functions()
    rng.shuffle(funcs)
    print(f"{len(funcs)} standard-library functions and classes", file=sys.stderr)
    prompts = []
    # ~35% generated tasks, ~50% edits of library code, ~15% raw continuations.
    n_task = int(a.n * 0.35)
    n_edit = int(a.n * 0.5)
    n_raw = a.n - n_task - n_edit
    for i in range(n_task):
        text = rng.choice(PHRASES).format(lang=rng.choice(LANGS), task=rng.choice(TASKS))
        prompts.append(("chat", chat(text)))
    for i in range(n_edit):
        code = funcs[i % len(funcs)]
        text = f"{rng.choice(EDITS)}\n\n```python\n{code}\n```"
        prompts.append(("chat", chat(text)))
    for i in range(n_raw):
        code = funcs[(n_edit + i) % len(funcs)].splitlines()
        keep = max(2, len(code) // 3)
        prompts.append(("raw", "\n".join(code[:keep]) + "\n"))
    rng.shuffle(prompts)
    with open(a.out, "w") as f:
        for i, (kind, text) in enumerate(prompts):
            ids = tok.encode(text, add_special_tokens=False).ids
            # Half greedy, half sampled at T=0.7 (the target's own outputs either way).
            f.write(json.dumps({"ids": ids, "kind": kind, "temp": 0.0 if i % 2 == 0 else 0.7}) + "\n")
    lens = sorted(len(tok.encode(t, add_special_tokens=False).ids) for _, t in prompts[:500])
    print(f"wrote {len(prompts)} prompts to {a.out}; prompt tokens p50 {lens[len(lens)//2]}, p95 {lens[int(len(lens)*0.95)]}", file=sys.stderr)


if __name__ == "__main__":
    main()
