#!/usr/bin/env python3
"""The coding agents people run, unchanged, against `hearth serve` on the CPU.

Each agent (pinned in tests/server/agents/<name>/package-lock.json, Pi in
tests/server/pi/) gets its own temporary HOME and config, a temporary work
folder as its PWD, and one `hearth serve` (qwen2.5-coder-1.5b, -c 32768 by
default) for all its tasks, the way a user points an agent at a local
server: no hearth-specific header, no session id.

  claude-code  ANTHROPIC_BASE_URL -> POST /v1/messages     `claude -p TASK`
  codex        config.toml provider, wire_api = responses  `codex exec TASK`
  opencode     @ai-sdk/openai-compatible provider          `opencode run TASK`
  pi           models.json provider (openai-completions)   `pi -p TASK`

For every (agent, task) it reports: whether the task's check passed, the
agent's exit code, the seconds, the model turns, the HTTP answers the server
gave the agent (from /metrics: every one must be 200), and the KV reuse
across the agent's turns (each turn's reused prompt tokens over the previous
turn's prompt, in the same server session; the agent sent no session id).

  python3 scripts/agents-e2e.py                       # every agent, task hello
  python3 scripts/agents-e2e.py --agents codex --tasks hello,fix-test,rename,module
  python3 scripts/agents-e2e.py --json results.json   # also write the rows

Exit status 1 when a protocol check fails (a non-200 answer, an agent
that crashed on a reply, reuse below 90%); a task the 1.5B model does not
manage is reported, not an error, unless --strict.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "server"))
from common import Server  # noqa: E402

AGENTS_DIR = ROOT / "tests" / "server" / "agents"
PI_DIR = ROOT / "tests" / "server" / "pi"
MODEL_ID = "qwen-local"
KEY = "agents-e2e-key"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- tasks: (prompt, setup files, check) --------------------------------------------

def run_py(cwd, *args):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_CALC = ("import unittest\n\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
             "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
             "if __name__ == \"__main__\":\n    unittest.main()\n")
SHAPES = ("import math\n\n\ndef compute_area(r):\n    return math.pi * r * r\n\n\n"
          "def ring(outer, inner):\n    return compute_area(outer) - compute_area(inner)\n\n\n"
          "if __name__ == \"__main__\":\n    print(round(compute_area(1.0), 3), round(ring(2.0, 1.0), 3))\n")


def check_hello(d):
    p = d / "hello.txt"
    return p.exists() and p.read_text().strip() == "hi", f"hello.txt = {p.read_text()!r}" if p.exists() else "no hello.txt"


def check_fix_test(d):
    if (d / "test_calc.py").read_text() != TEST_CALC:
        return False, "test_calc.py was changed"
    r = run_py(d, "-m", "unittest", "test_calc")
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def check_rename(d):
    s = (d / "shapes.py").read_text()
    if "compute_area" in s:
        return False, f"compute_area still appears {s.count('compute_area')}x"
    if s.count("circle_area") < 4:
        return False, f"circle_area appears {s.count('circle_area')}x (want 4)"
    r = run_py(d, "shapes.py")
    return r.returncode == 0 and r.stdout.split() == ["3.142", "9.425"], f"shapes.py printed {r.stdout.strip()!r} {r.stderr.strip()[-200:]}"


def check_module(d):
    if not (d / "slugify.py").exists() or not (d / "test_slugify.py").exists():
        return False, f"files: {sorted(p.name for p in d.iterdir())}"
    probe = ("from slugify import slugify\n"
             "cases = {'Hello, World!': 'hello-world', '  Rust  is fun ': 'rust-is-fun', 'a--b': 'a-b'}\n"
             "bad = {k: slugify(k) for k, v in cases.items() if slugify(k) != v}\nprint(bad or 'ok')\n")
    r = run_py(d, "-c", probe)
    if r.stdout.strip() != "ok":
        return False, f"slugify: {r.stdout.strip()} {r.stderr.strip()[-200:]}"
    t = run_py(d, "-m", "unittest", "test_slugify")
    return t.returncode == 0 and "Ran 0 tests" not in t.stderr, (t.stderr.strip().splitlines() or [""])[-1]


TASKS = {
    "hello": ("Create a file named hello.txt in the current directory containing the text: hi", {}, check_hello),
    "fix-test": ("The unit test in test_calc.py fails. Find the bug in calc.py and fix it so that "
                 "`python3 -m unittest test_calc` passes. Do not change test_calc.py.",
                 {"calc.py": CALC, "test_calc.py": TEST_CALC}, check_fix_test),
    "rename": ("In shapes.py, rename the function compute_area to circle_area everywhere "
               "(its definition and every call). Then run `python3 shapes.py` to check it still works.",
               {"shapes.py": SHAPES}, check_rename),
    "module": ("Write a Python module slugify.py with a function slugify(text) that lowercases the text, "
               "replaces every run of characters that are not letters or digits with a single '-', and strips "
               "'-' from both ends. Also write test_slugify.py with unittest tests for it, and run them with "
               "`python3 -m unittest test_slugify`.", {}, check_module),
}


# ---- agents --------------------------------------------------------------------------

def npm_bin(name, pkg_dir, binary):
    """The pinned agent's binary, `npm ci` from its lockfile when missing."""
    b = pkg_dir / "node_modules" / ".bin" / binary
    if not b.exists():
        log(f"installing {name} with npm ci into {pkg_dir / 'node_modules'}")
        if subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=pkg_dir).returncode != 0:
            # opencode-ai lists a package per platform; where the registry has
            # only this platform's, npm writes a lockfile that its own `npm ci`
            # calls out of sync. `npm install` still takes the locked versions.
            log(f"npm ci failed for {name}; npm install from the same lockfile")
            subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=pkg_dir, check=True)
    return b


def base_env(home, work):
    env = {k: v for k, v in os.environ.items()
           if not re.match(r"^(ANTHROPIC|OPENAI|CODEX|OPENCODE|PI)_", k) and not k.endswith("_API_KEY")}
    env.update(HOME=str(home), PWD=str(work), NO_COLOR="1", XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_DATA_HOME=str(home / ".local" / "share"),
               XDG_STATE_HOME=str(home / ".local" / "state"))
    return env


def claude_code(server, home, work, task, max_turns):
    b = npm_bin("Claude Code", AGENTS_DIR / "claude-code", "claude")
    env = base_env(home, work)
    root = server.base.removesuffix("/v1")
    env.update(ANTHROPIC_BASE_URL=root, ANTHROPIC_AUTH_TOKEN=KEY, ANTHROPIC_MODEL=MODEL_ID,
               ANTHROPIC_SMALL_FAST_MODEL=MODEL_ID, ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL_ID,
               ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL_ID, ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL_ID,
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1")
    return [str(b), "-p", task, "--output-format", "json", "--max-turns", str(max_turns),
            "--permission-mode", "acceptEdits", "--allowedTools", "Write,Read,Edit,Bash"], env


# A small local model gets the shell tools only (exec_command and its
# write_stdin): web search, goals, sub-agents, image viewing and the user-input
# tool off. That takes Codex's first request from 40 KB to 25 KB (hello:
# 121.6 s -> 65.6 s on 2 cores). Codex knows nothing of a local model ("Model
# metadata for `qwen-local` not found. Defaulting to fallback metadata"): the
# model catalog in docs/agents/codex-model-catalog.json describes it (its
# context, no reasoning levels, no hosted tools) and gives it instructions a
# 1.5B model follows (with the fallback's, it calls write_stdin on a process
# that does not exist instead of exec_command; the first request drops to
# ~1.6k tokens).
CODEX_SMALL_MODEL = ('web_search = "disabled"\n[features]\nmulti_agent = false\ngoals = false\n'
                     'view_image = false\n[tools]\nexperimental_request_user_input.enabled = false\n')


def codex(server, home, work, task, max_turns):
    b = npm_bin("Codex CLI", AGENTS_DIR / "codex", "codex")
    env = base_env(home, work)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    catalog = json.loads((ROOT / "docs" / "agents" / "codex-model-catalog.json").read_text())
    catalog["models"][0].update(slug=MODEL_ID, context_window=server.ctx, max_context_window=server.ctx)
    (codex_home / "hearth-models.json").write_text(json.dumps(catalog, indent=1))
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL_ID}"\nmodel_provider = "hearth"\nmodel_context_window = {server.ctx}\n'
        f'approval_policy = "never"\nmodel_catalog_json = "{codex_home / "hearth-models.json"}"\n{CODEX_SMALL_MODEL}\n[model_providers.hearth]\nname = "hearth"\n'
        f'base_url = "{server.base}"\nwire_api = "responses"\nenv_key = "HEARTH_API_KEY"\n'
        + os.environ.get("CODEX_EXTRA_CONFIG", ""))
    env.update(CODEX_HOME=str(codex_home), HEARTH_API_KEY=KEY)
    return [str(b), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-C", str(work), task], env


def opencode(server, home, work, task, max_turns):
    b = npm_bin("OpenCode", AGENTS_DIR / "opencode", "opencode")
    env = base_env(home, work)
    cfg = home / ".config" / "opencode"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "model": f"hearth/{MODEL_ID}",
        "small_model": f"hearth/{MODEL_ID}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "provider": {"hearth": {"npm": "@ai-sdk/openai-compatible", "name": "hearth",
                                "options": {"baseURL": server.base, "apiKey": KEY},
                                "models": {MODEL_ID: {"name": "hearth local", "tool_call": True,
                                                      "limit": {"context": server.ctx, "output": 2048}}}}},
    }, indent=1))
    env.update(OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1")
    return [str(b), "run", "--dir", str(work), task], env


def pi(server, home, work, task, max_turns):
    b = npm_bin("Pi", PI_DIR, "pi")
    env = base_env(home, work)
    agent_dir = home / ".pi" / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    models = (PI_DIR / "models.json").read_text()
    for k, v in {"__BASE_URL__": server.base, "__API_KEY__": KEY, "__MODEL_ID__": MODEL_ID,
                 "__CONTEXT__": str(server.ctx), "__MAX_TOKENS__": "2048"}.items():
        models = models.replace(k, v)
    (agent_dir / "models.json").write_text(models)
    shutil.copy(PI_DIR / "settings.json", agent_dir / "settings.json")
    env.update(PI_CODING_AGENT_DIR=str(agent_dir), PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0")
    return [str(b), "--provider", "hearth", "--model", MODEL_ID, "--no-extensions", "--no-skills",
            "--no-prompt-templates", "--no-themes", "-p", task], env


AGENTS = {"claude-code": claude_code, "codex": codex, "opencode": opencode, "pi": pi}


# ---- measuring -----------------------------------------------------------------------

def answers(server):
    """{(endpoint, status): count} from /metrics."""
    out = {}
    for (name, labels), v in server.metrics().items():
        if name == "hearth_requests_total":
            ep = re.search(r'endpoint="([^"]+)"', labels).group(1)
            st = re.search(r'status="(\d+)"', labels).group(1)
            out[(ep, st)] = out.get((ep, st), 0) + int(v)
    return out


def turns(log_text):
    return [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in log_text.splitlines() if line.startswith("llm_turn_stats ")]


# An agent's own turns carry its whole system prompt (5k+ tokens); its side
# requests (OpenCode's session title, Claude Code's topic check) are short
# separate conversations and are left out of the reuse pairs. A side request
# that rolls an agent's session back between two of its turns still shows:
# the next turn's reuse is measured against the agent's previous turn.
SIDE_REQUEST_TOKENS = 1500


def reuse(ts):
    """Per turn after the first of its server session: reused / the previous
    turn's prompt (1.0 = the whole previous prompt came from the KV)."""
    last, out = {}, []
    for t in ts:
        sid, p, r = t["session_id"], int(t["prompt_tokens"]), int(t["reused_prompt_tokens"])
        if p < SIDE_REQUEST_TOKENS:
            continue
        if sid in last:
            out.append(min(1.0, r / max(1, last[sid])))
        last[sid] = p
    return out


def run_one(server, agent, task_name, args):
    prompt, files, check = TASKS[task_name]
    tmp = Path(tempfile.mkdtemp(prefix=f"hearth-{agent}-{task_name}-"))
    home = tmp / "home"
    home.mkdir()
    if args.work_root:
        # A short fixed path, as a user's project folder is (the small models
        # copy a long random temporary path badly).
        work = Path(args.work_root) / f"{agent}-{task_name}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    else:
        work = tmp / "work"
        work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    cmd, env = AGENTS[agent](server, home, work, prompt, args.max_turns)
    before_answers, log_at = answers(server), len(server.logs())
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout,
                           stdin=subprocess.DEVNULL)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), ""
    secs = time.monotonic() - t0
    ok, why = check(work)
    after = answers(server)
    got = {k: after[k] - before_answers.get(k, 0) for k in after if after[k] - before_answers.get(k, 0)}
    ts = turns(server.logs()[log_at:])
    ru = reuse(ts)
    (tmp / "agent-stdout.txt").write_text(out or "")
    (tmp / "agent-stderr.txt").write_text(err or "")
    row = {
        "agent": agent, "task": task_name, "done": ok, "check": why, "exit": rc, "seconds": round(secs, 1),
        "turns": len(ts), "answers": {f"{ep} {st}": n for (ep, st), n in sorted(got.items())},
        "non_200": sum(n for (ep, st), n in got.items() if st != "200"),
        "reuse_min": round(min(ru), 3) if ru else None,
        "prompt_tokens": [int(t["prompt_tokens"]) for t in ts],
        "reused_tokens": [int(t["reused_prompt_tokens"]) for t in ts],
        "dir": str(tmp),
    }
    log(f"{agent} {task_name}: done={ok} ({why}) exit={rc} {secs:.1f} s, {len(ts)} turns, "
        f"answers {row['answers']}, reuse min {row['reuse_min']}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default=",".join(AGENTS), help="comma-separated: " + ", ".join(AGENTS))
    ap.add_argument("--tasks", default="hello", help="comma-separated: " + ", ".join(TASKS))
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="packaged model name or .gguf path")
    ap.add_argument("-c", "--ctx", type=int, default=32768)
    ap.add_argument("--max-turns", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per agent run")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--work-root", help="make each task's folder here (default: inside its temporary folder)")
    ap.add_argument("--strict", action="store_true", help="a task not done is an error too")
    args = ap.parse_args()
    model = args.model
    if not model.endswith(".gguf"):
        model = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_models.py"), model], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rows, bad = [], []
    for agent in args.agents.split(","):
        if agent not in AGENTS:
            ap.error(f"unknown agent {agent!r}; known: {', '.join(AGENTS)}")
        server = Server(model=model, model_id=MODEL_ID, ctx=args.ctx, api_key=KEY)
        server.ctx = args.ctx
        try:
            for task in args.tasks.split(","):
                if task not in TASKS:
                    ap.error(f"unknown task {task!r}; known: {', '.join(TASKS)}")
                row = run_one(server, agent, task, args)
                rows.append(row)
                if row["non_200"] or row["exit"] == "timeout" or (row["reuse_min"] is not None and row["reuse_min"] < 0.9):
                    bad.append(f"{agent}/{task}: protocol (non-200 {row['non_200']}, exit {row['exit']}, reuse {row['reuse_min']})")
                if args.strict and not row["done"]:
                    bad.append(f"{agent}/{task}: not done ({row['check']})")
        finally:
            server.stop()
    print("| agent | task | done | seconds | turns | answers | min reuse |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ans = ", ".join(f"{k}: {v}" for k, v in r["answers"].items())
        print(f"| {r['agent']} | {r['task']} | {'yes' if r['done'] else 'no: ' + r['check']} | {r['seconds']} "
              f"| {r['turns']} | {ans} | {r['reuse_min']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    for b in bad:
        log(f"FAIL {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
