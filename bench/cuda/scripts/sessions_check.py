#!/usr/bin/env python3
"""Sessions on a running `hearth serve --session-dir DIR --max-sessions 4`
(vision-gpu.sh's `sessions` phase runs it against `--device cuda`; it runs
against the CPU backend too). Every check compares a session that left
(saved and restored, evicted to disk, resumed from a checkpoint, started
from another session's prefix) with the same requests on a session that
never did: the greedy replies must be equal.

Usage: sessions_check.py PORT SERVE_LOG SESSION_DIR [cuda|cpu]

The shared prefix needs the donor's rings to roll back past its own
message: within CUDA's 512 spare ring slots; the CPU's rings have none
(without --spec) and no checkpoint there, so on the CPU nothing is shared.
"""
import json
import re
import sys
import time
import urllib.error
import urllib.request

PORT, LOG, DIR = int(sys.argv[1]), sys.argv[2], sys.argv[3]
BACKEND = sys.argv[4] if len(sys.argv) > 4 else "cuda"
BASE = f"http://127.0.0.1:{PORT}"
failed = []


def call(method, path, body=None):
    req = urllib.request.Request(BASE + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chat(session, messages, max_tokens=16):
    status, r = call("POST", "/v1/chat/completions", {
        "model": "e2e-text", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "session_id": session})
    if status != 200:
        raise SystemExit(f"chat {session}: HTTP {status}: {r}")
    return r["choices"][0]["message"]["content"], r["usage"]


def cached(usage):
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failed.append(name)


def reasons(session):
    return re.findall(rf"llm_turn_stats session_id={re.escape(session)} reason=(\w+)", open(LOG).read())


def metric(name):
    with urllib.request.urlopen(BASE + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


for _ in range(240):
    try:
        urllib.request.urlopen(BASE + "/health", timeout=1)
        break
    except Exception:
        time.sleep(0.5)

# 1. Save, DELETE, restore: the next turn as the uninterrupted session's.
first = [{"role": "user", "content": "Write a haiku about the sea."}]
r1, u1 = chat("s1", first)
status, saved = call("POST", "/v1/sessions/s1/save", {})
check("save", status == 200, saved)
second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": "Now one about mountains."}]
want, _ = chat("s1", second)
check("delete", call("DELETE", "/v1/sessions/s1")[0] == 200)
status, body = call("POST", "/v1/sessions/s1/restore", {})
check("restore", status == 200 and body.get("tokens") == saved.get("tokens"), body)
got, u = chat("s1", second)
check("restored session continues as the uninterrupted one", got == want, f"{got!r} vs {want!r}")
check("restored prefix reused", cached(u) >= saved["tokens"] - 20, f"cached {cached(u)} of {saved['tokens']}")

# 2. The shared prefix cache: agent-b starts from agent-a's system prompt.
system = {"role": "system", "content": "You are a careful coding agent. " + " ".join(
    f"Rule {i}: keep functions short and test edge case {i}." for i in range(12))}
task_a = [system, {"role": "user", "content": "Reverse a string."}]
task_b = [system, {"role": "user", "content": "Add two numbers."}]
chat("agent-a", task_a, 8)
b, ub = chat("agent-b", task_b, 8)
chat("agent-ref", task_a, 8)
ref, ur = chat("agent-ref", task_b, 8)
if BACKEND == "cuda":
    check("shared prefix reused", cached(ub) >= 64 and reasons("agent-b") == ["shared_prefix"],
          f"cached {cached(ub)}, reasons {reasons('agent-b')}")
else:
    check("nothing shared (CPU rings cannot roll back)", cached(ub) == 0, f"cached {cached(ub)}")
check("shared-prefix session continues as one that computed it", b == ref and cached(ur) == cached(ub),
      f"{b!r} vs {ref!r}, cached {cached(ub)} vs {cached(ur)}")

# 3. Ring checkpoints: 600 generated tokens move the rings (window 16, 512
# spare slots) past the first prompt's end; the second turn parts there.
long_first = [{"role": "user", "content": "Count slowly and say everything you know about numbers."}]
long_second = long_first + [{"role": "assistant", "content": "Fact 7."}, {"role": "user", "content": "And 8?"}]
_, ug = chat("g", long_first, 600)
warm, _ = chat("g", long_second, 12)
chat("ref", long_first, 1)
ref, _ = chat("ref", long_second, 12)
moved = ug["completion_tokens"] > 530
check("checkpoint resume equals a state that stopped at the prompt", warm == ref, f"{warm!r} vs {ref!r}")
check("checkpoint used", not moved or reasons("g") == ["new", "checkpoint"],
      f"{ug['completion_tokens']} generated, reasons {reasons('g')}")
chat("h", long_first, 600)
status, body = call("POST", "/v1/sessions/h/save", {})
check("save with a checkpoint", status == 200, body)
call("DELETE", "/v1/sessions/h")
status, body = call("POST", "/v1/sessions/h/restore", {})
check("restore with a checkpoint", status == 200, body)
again, _ = chat("h", long_second, 12)
check("restored checkpoint equals the in-memory one", again == ref, f"{again!r} vs {ref!r}")
check("restored checkpoint used", not moved or reasons("h") == ["new", "checkpoint"], f"reasons {reasons('h')}")

# 4. Evicted sessions (--max-sessions 4) come back from DIR/.evicted: s1
# has long been evicted by now.
spills = metric("hearth_session_spills_total")
third = second + [{"role": "assistant", "content": got}, {"role": "user", "content": "And one about rivers."}]
r3, u3 = chat("s1", third)
check("an evicted session comes back from disk",
      spills >= 1 and metric("hearth_session_unspills_total") >= 1 and cached(u3) >= cached(u),
      f"spills {spills}, unspills {metric('hearth_session_unspills_total')}, cached {cached(u3)}")
print(f"{len(failed)} failed" if failed else "all passed")
sys.exit(1 if failed else 0)
