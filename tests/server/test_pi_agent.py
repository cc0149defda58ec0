#!/usr/bin/env python3
"""End-to-end test: the Pi coding agent (npm `@mariozechner/pi-coding-agent`,
pinned in tests/server/pi/package-lock.json) drives `hearth serve`.

Installs Pi with `npm ci` into tests/server/pi/node_modules (unless the pinned
version is already there), starts the real binary (target/release/hearth, or
$HEARTH_BIN) on a free loopback port with qwen2.5-coder-1.5b, writes Pi's
config (models.json pointing at the server's /v1, settings.json) into a temp
HOME / PI_CODING_AGENT_DIR, and runs `pi --mode json -p TASK` in a temp
working directory. Asserted: Pi does the task (hello.txt holds "hi"; the
server's default sampling is greedy, so the run is repeatable up to the date
and the temp path in Pi's prompt), and the agent loop completes without a
client error: Pi exits 0, every assistant turn ends with stop/toolUse/length
and no error message, and the server answered every one of Pi's requests with
200 (checked on /metrics and in the server's llm_turn_stats log lines),
reusing the session's KV across the agent's turns.

Run: python3 tests/server/test_pi_agent.py
Needs: cargo build --release -p hearth; node >= 20.6 and npm.
Env: HEARTH_BIN, HEARTH_PI_MODEL (a .gguf path), HEARTH_PI_TIMEOUT (seconds
for the whole Pi run, default 3600), HEARTH_PI_MAX_TURNS (default 8).
CPU prefill of Pi's ~1.4k-token system prompt dominates the run time.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import MODEL_ID, ROOT, Server, model_path, run_tests

PI_DIR = ROOT / "tests" / "server" / "pi"
API_KEY = "pi-test-key"
CTX = 8192  # Pi's prompt is ~1.4k tokens; room for several agent turns
MAX_TOKENS = 128  # per request (Pi sends it as max_completion_tokens)
PI_TIMEOUT = float(os.environ.get("HEARTH_PI_TIMEOUT", "3600"))
MAX_TURNS = int(os.environ.get("HEARTH_PI_MAX_TURNS", "8"))
TASK = "Create a file named hello.txt in the current directory containing the text: hi"

SERVER = None
TMP = None
PI_RUN = None  # the result of the agent run, shared by the checks below


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pinned_version():
    return json.loads((PI_DIR / "package.json").read_text())["dependencies"]["@mariozechner/pi-coding-agent"]


def pi_bin():
    return PI_DIR / "node_modules" / ".bin" / "pi"


def ensure_pi():
    """`npm ci` from the lockfile unless the pinned version is already installed.
    Install scripts are skipped: Pi's CLI needs none (koffi/protobufjs hooks
    only matter for features the test does not use)."""
    installed = PI_DIR / "node_modules" / "@mariozechner" / "pi-coding-agent" / "package.json"
    if installed.exists() and json.loads(installed.read_text())["version"] == pinned_version() and pi_bin().exists():
        return
    t0 = time.monotonic()
    log(f"installing Pi {pinned_version()} with npm ci into {PI_DIR / 'node_modules'}")
    subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=PI_DIR, check=True)
    log(f"npm ci took {time.monotonic() - t0:.1f} s")


def chat_requests(metrics):
    """{status: count} for /v1/chat/completions."""
    out = {}
    for (name, labels), v in metrics.items():
        if name == "hearth_requests_total" and 'endpoint="/v1/chat/completions"' in labels:
            status = re.search(r'status="(\d+)"', labels).group(1)
            out[status] = out.get(status, 0) + int(v)
    return out


def turn_stats(logs):
    """The server's llm_turn_stats lines as dicts."""
    return [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in logs.splitlines() if line.startswith("llm_turn_stats ")]


def pi_env(home, agent_dir):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PI_") and not k.endswith("_API_KEY")}
    env.update(HOME=str(home), PI_CODING_AGENT_DIR=str(agent_dir), PI_OFFLINE="1",
               PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0", NO_COLOR="1",
               XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_DATA_HOME=str(home / ".local" / "share"))
    return env


def write_pi_config(agent_dir):
    agent_dir.mkdir(parents=True, exist_ok=True)
    models = (PI_DIR / "models.json").read_text()
    for key, value in {"__BASE_URL__": SERVER.base, "__API_KEY__": API_KEY, "__MODEL_ID__": MODEL_ID,
                       "__CONTEXT__": str(CTX), "__MAX_TOKENS__": str(MAX_TOKENS)}.items():
        models = models.replace(key, value)
    json.loads(models)  # the template must stay valid JSON once filled
    (agent_dir / "models.json").write_text(models)
    shutil.copy(PI_DIR / "settings.json", agent_dir / "settings.json")


def pi_command(*args):
    return [str(pi_bin()), "--provider", "hearth", "--model", MODEL_ID,
            "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-context-files", "--no-themes",
            *args]


def setup_module(module=None):
    global SERVER, TMP
    ensure_pi()
    TMP = tempfile.mkdtemp(prefix="hearth-pi-")
    # --strict-tools: every call Pi's tools allow follows the tool's schema
    # (Pi sends its tools and tool_choice as it always does).
    model = os.environ.get("HEARTH_PI_MODEL") or model_path("qwen2.5-coder-1.5b")
    SERVER = Server("--api-key", API_KEY, "--strict-tools", model=model, ctx=CTX, api_key=API_KEY, log_dir=TMP)
    write_pi_config(Path(TMP) / "home" / ".pi" / "agent")
    log(f"server at {SERVER.base}; Pi home {TMP}/home")


def teardown_module(module=None):
    try:
        if SERVER is not None:
            code = SERVER.stop()
            assert code == 0, f"server exit code {code} after SIGTERM"
    finally:
        if TMP and not os.environ.get("HEARTH_PI_KEEP_TMP"):
            shutil.rmtree(TMP, ignore_errors=True)


def test_pi_is_the_pinned_version():
    out = subprocess.run([str(pi_bin()), "--version"], capture_output=True, text=True, timeout=120,
                         env=pi_env(Path(TMP) / "home", Path(TMP) / "home" / ".pi" / "agent"))
    assert out.returncode == 0, out.stderr
    assert pinned_version() in out.stdout + out.stderr, (out.stdout, out.stderr)


def test_pi_sees_the_hearth_model():
    home = Path(TMP) / "home"
    out = subprocess.run([str(pi_bin()), "--list-models", "hearth"], capture_output=True, text=True, timeout=120,
                         env=pi_env(home, home / ".pi" / "agent"), cwd=TMP)
    assert out.returncode == 0, out.stderr
    assert MODEL_ID in out.stdout + out.stderr, (out.stdout, out.stderr)
    assert "error" not in out.stderr.lower(), out.stderr


def run_pi_agent():
    """Runs the agent on TASK in an empty temp dir; streams progress; returns a dict."""
    home = Path(TMP) / "home"
    work = Path(TMP) / "work"
    work.mkdir()
    before = chat_requests(SERVER.metrics())
    warnings_before = SERVER.metrics().get(("hearth_tool_call_parse_warnings_total", ""), 0)
    t0 = time.monotonic()
    proc = subprocess.Popen(pi_command("--no-session", "--mode", "json", "-p", TASK),
                            cwd=work, env=pi_env(home, home / ".pi" / "agent"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events, bad_lines, turns, runaway = [], [], 0, False
    stderr_parts = []
    threading.Thread(target=lambda: stderr_parts.append(proc.stderr.read()), daemon=True).start()
    expired = threading.Event()

    def expire():
        expired.set()
        proc.kill()

    timer = threading.Timer(PI_TIMEOUT, expire)
    timer.start()
    try:
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                bad_lines.append(line)
                continue
            events.append(ev)
            kind = ev.get("type")
            if kind == "turn_start":
                turns += 1
                log(f"pi: turn {turns} started ({time.monotonic() - t0:.0f} s)")
                if turns > MAX_TURNS:
                    runaway = True
                    proc.kill()
            elif kind == "message_end" and ev["message"].get("role") == "assistant":
                m = ev["message"]
                calls = [f"{c['name']}({json.dumps(c.get('arguments'))})" for c in m["content"] if c["type"] == "toolCall"]
                text = "".join(c.get("text", "") for c in m["content"] if c["type"] == "text")
                log(f"pi: assistant stopReason={m.get('stopReason')} usage={m.get('usage', {}).get('input')}+"
                    f"{m.get('usage', {}).get('cacheRead')} cached -> {m.get('usage', {}).get('output')} "
                    f"calls={calls} text={text[:120]!r}")
            elif kind == "tool_execution_end":
                log(f"pi: tool {ev.get('toolName')} done, isError={ev.get('isError')}")
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.5)  # the stderr reader
    wall = time.monotonic() - t0
    after = chat_requests(SERVER.metrics())
    delta = {s: after.get(s, 0) - before.get(s, 0) for s in after if after.get(s, 0) != before.get(s, 0)}
    warnings = SERVER.metrics().get(("hearth_tool_call_parse_warnings_total", ""), 0) - warnings_before
    return dict(rc=proc.returncode, events=events, bad_lines=bad_lines, stderr="".join(stderr_parts),
                turns=turns, runaway=runaway, timed_out=expired.is_set(), wall=wall, requests=delta, work=work,
                parse_warnings=int(warnings))


def tool_calls(run):
    return [c for m in assistant_messages(run) for c in m["content"] if c["type"] == "toolCall"]


def pi_run():
    global PI_RUN
    if PI_RUN is None:
        PI_RUN = run_pi_agent()
    return PI_RUN


def assistant_messages(run):
    return [e["message"] for e in run["events"]
            if e.get("type") == "message_end" and e["message"].get("role") == "assistant"]


def test_pi_agent_turn_completes_without_client_error():
    run = pi_run()
    assert not run["timed_out"], f"Pi did not finish within {PI_TIMEOUT:.0f} s"
    assert not run["runaway"], f"the agent was still calling tools after {MAX_TURNS} turns (model loop)"
    assert run["rc"] == 0, f"pi exited {run['rc']}; stderr:\n{run['stderr'][-4000:]}"
    assert not run["bad_lines"], f"non-JSON lines on Pi's stdout: {run['bad_lines'][:5]}"
    types = [e.get("type") for e in run["events"]]
    assert "agent_end" in types, f"no agent_end event; events: {types}"
    msgs = assistant_messages(run)
    assert msgs, "Pi produced no assistant message"
    for m in msgs:
        assert m.get("stopReason") in ("stop", "toolUse", "length"), \
            f"assistant turn ended with {m.get('stopReason')}: {m.get('errorMessage')}"
        assert not m.get("errorMessage"), m["errorMessage"]
    for pattern in ("error", "status code", "Stream ended"):
        assert pattern.lower() not in run["stderr"].lower(), f"Pi stderr:\n{run['stderr'][-4000:]}"


def test_server_answered_every_pi_request():
    run = pi_run()
    n = len(assistant_messages(run))
    assert run["requests"] == {"200": n}, \
        f"chat completion statuses during the Pi run {run['requests']}, expected {n} x 200"
    stats = turn_stats(SERVER.logs())
    assert len(stats) == n, f"{len(stats)} llm_turn_stats lines for {n} assistant turns"
    # Pi's session id arrives as an affinity header: one named session, and
    # every turn after the first reuses the previous turn's KV.
    session = next(e["id"] for e in run["events"] if e.get("type") == "session")
    assert {s["session_id"] for s in stats} == {session}, (session, stats)
    for s in stats[1:]:
        assert int(s["reused_prompt_tokens"]) > 0, f"a later agent turn re-prefilled everything: {s}"
    # What Pi reports matches what the server did.
    for m, s in zip(assistant_messages(run), stats):
        u = m["usage"]
        assert u["input"] + u["cacheRead"] == int(s["prompt_tokens"]), (u, s)
        assert u["cacheRead"] == int(s["reused_prompt_tokens"]), (u, s)
        assert u["output"] == int(s["completion_tokens"]), (u, s)


def test_pi_creates_hello_txt():
    run = pi_run()
    hello = run["work"] / "hello.txt"
    files = sorted(p.name for p in run["work"].iterdir())
    assert hello.exists(), f"Pi did not create hello.txt (work folder holds {files})"
    assert hello.read_text().strip() == "hi", f"hello.txt holds {hello.read_text()!r}"


def test_every_tool_call_parsed():
    """Calls the model began but the parser could not read are counted by the
    server (parse warnings); with --strict-tools there must be none."""
    run = pi_run()
    calls = tool_calls(run)
    log(f"Pi tool calls: {len(calls)} parsed, {run['parse_warnings']} malformed "
        f"({len(calls)}/{len(calls) + run['parse_warnings']} parsed, --strict-tools)")
    assert run["parse_warnings"] == 0, f"{run['parse_warnings']} tool calls did not parse"


def report():
    """Timings and the outcome of the task (informational)."""
    if PI_RUN is None:
        return
    stats = turn_stats(SERVER.logs())
    for i, s in enumerate(stats, 1):
        log(f"turn {i}: prompt {s['prompt_tokens']} tokens ({s['reused_prompt_tokens']} reused, "
            f"{s['prefilled_prompt_tokens']} prefilled in {int(s['prefill_ms']) / 1000:.1f} s), "
            f"{s['completion_tokens']} generated at {s['decode_tok_s']} tok/s, finish={s['finish']}")
    hello = PI_RUN["work"] / "hello.txt"
    made = hello.read_text().strip() if hello.exists() else None
    log(f"Pi run: {PI_RUN['turns']} turn(s), {PI_RUN['wall']:.0f} s; hello.txt: "
        f"{'contains ' + repr(made) if made is not None else 'not created'}")


def main():
    return run_tests(globals(), setup_module, teardown_module, report)


if __name__ == "__main__":
    raise SystemExit(main())
