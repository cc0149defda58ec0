"""hearth replicas behind SGLang Model Gateway (PyPI sglang-router, `smg`).

Three `hearth serve` workers on loopback and the gateway in front of them
replay a coding agent's multi-session workload (tests/gateway/workload.json:
12 conversations x 6 turns, one system prompt and tool list, the assistant
turns the model's own greedy replies):

1. reference: the workload on one worker, alone, one conversation at a time;
2. `round_robin` and `cache_aware` through the gateway, 6 conversations at a
   time: every reply equal to the reference's, and the share of each turn's
   previous prompt the worker reused (`cached_tokens`): >= 90% of every turn
   under cache_aware, against round_robin's in the same run; throughput and
   time to first token for both;
3. failover (cache_aware, `--shared-sessions` on one session dir): one worker
   is killed with SIGKILL mid-workload and another drained with SIGTERM. Only
   the requests in flight on the killed worker may fail (and then with an
   error, not a cut reply); they are sent again; every reply still equals the
   reference; the drained worker exits 0 and its sessions are continued from
   the session dir; every file there passes its checksum.

Workers run with --batch-invariant (a reply then does not depend on what else
runs nor on how its prompt was split into passes), so "equal" is byte-equal.
`--json PATH` writes the figures (BENCHMARKS.md's table comes from them).
"""
import argparse
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "server"))
from common import BIN, Server, model_path  # noqa: E402

MODEL = "smollm2-135m"
MAX_TOKENS = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smg_binary():
    found = shutil.which("smg") or str(Path(sys.executable).parent / "smg")
    if not Path(found).exists():
        raise SystemExit("smg (PyPI sglang-router) is not installed: pip install -r scripts/requirements.txt")
    return found


def worker(*extra, log_dir):
    return Server("--batch-invariant", "-t", "1", "--max-sessions", "16", *extra,
                  ctx=4096, model=model_path(MODEL), model_id=MODEL, log_dir=log_dir)


class Gateway:
    """`smg launch` in front of `workers` with `policy`. Health checked every
    second (one failure marks a worker down) and failed requests retried for
    a few seconds, so a dead or draining worker's traffic moves over."""

    def __init__(self, workers, policy, log_dir, extra=()):
        self.port = free_port()
        self.log_path = Path(log_dir) / f"smg-{policy}-{self.port}.log"
        self.log = open(self.log_path, "w")
        urls = [w.base.removesuffix("/v1") for w in workers]
        self.proc = subprocess.Popen(
            [smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(self.port),
             "--prometheus-port", str(free_port()), "--worker-urls", *urls, "--policy", policy,
             "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
             "--health-success-threshold", "1", "--retry-max-retries", "10",
             "--retry-initial-backoff-ms", "200", "--retry-max-backoff-ms", "1000",
             "--request-timeout-secs", "600", "--log-level", "warn", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.host = "127.0.0.1"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                status, body = get(self.host, self.port, "/workers")
                ws = json.loads(body).get("workers", []) if status == 200 else []
                if len(ws) == len(urls) and all(w.get("is_healthy") for w in ws):
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        raise RuntimeError(f"smg did not register the workers: {self.log_path.read_text()[-3000:]}")

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def get(host, port, path):
    c = http.client.HTTPConnection(host, port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def chat(host, port, messages, tools):
    """One streamed turn: {text, tool_calls, ttft, prompt, cached, completion}
    or {error}. A stream that ends without a finish reason is an error too."""
    body = {"model": MODEL, "messages": messages, "tools": tools, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": MAX_TOKENS}
    t0 = time.time()
    c = http.client.HTTPConnection(host, port, timeout=600)
    out = {"text": "", "tool_calls": {}, "ttft": None, "finish": None, "usage": None, "start": t0}
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return {"error": f"HTTP {r.status}: {r.read().decode()[:300]}", "start": t0}
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                return {"error": f"stream error: {ev['error']}", "start": t0}
            if ev.get("usage"):
                out["usage"] = ev["usage"]
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if (d.get("content") or d.get("tool_calls")) and out["ttft"] is None:
                    out["ttft"] = time.time() - t0
                out["text"] += d.get("content") or ""
                for tc in d.get("tool_calls") or []:
                    slot = out["tool_calls"].setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    slot["id"] += tc.get("id") or ""
                    f = tc.get("function") or {}
                    slot["name"] += f.get("name") or ""
                    slot["arguments"] += f.get("arguments") or ""
                if ch.get("finish_reason"):
                    out["finish"] = ch["finish_reason"]
    except (OSError, http.client.HTTPException, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}", "start": t0}
    finally:
        c.close()
    out["end"] = time.time()
    if out["finish"] is None or out["usage"] is None:
        return {"error": "the stream ended without a finish reason", "start": t0}
    u = out["usage"]
    out["prompt"] = u["prompt_tokens"]
    out["completion"] = u["completion_tokens"]
    out["cached"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if out["ttft"] is None:
        out["ttft"] = out["end"] - t0
    return out


def append_reply(messages, turn, t):
    """The assistant turn as an agent appends it (tool calls answered)."""
    calls = [turn["tool_calls"][k] for k in sorted(turn["tool_calls"])]
    msg = {"role": "assistant", "content": turn["text"]}
    if calls:
        msg["tool_calls"] = [{"id": c["id"] or f"call_{t}_{i}", "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for i, c in enumerate(calls)]
    messages.append(msg)
    for i, tc in enumerate(msg.get("tool_calls", [])):
        messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "(done)"})


def replay(host, port, workload, concurrency, hook=None):
    """Every conversation's turns in order, `concurrency` conversations at a
    time. Returns (per-conversation list of turns, errors, wall seconds).
    A failed turn is sent again (once more at most 3 times)."""
    done = [0]
    lock = threading.Lock()
    errors = []

    def one(si):
        messages = [{"role": "system", "content": workload["system"]}]
        turns = []
        for t, user in enumerate(workload["sessions"][si]):
            messages.append({"role": "user", "content": user})
            for attempt in range(4):
                r = chat(host, port, messages, workload["tools"])
                if "error" not in r:
                    break
                with lock:
                    errors.append({"session": si, "turn": t, "start": r["start"], "at": time.time(),
                                   "error": r["error"]})
                time.sleep(0.5)
            else:
                raise RuntimeError(f"conversation {si} turn {t}: {r['error']}")
            turns.append(r)
            append_reply(messages, r, t)
            with lock:
                done[0] += 1
                n = done[0]
            if hook:
                hook(n)
        return turns

    t0 = time.time()
    with ThreadPoolExecutor(concurrency) as ex:
        out = list(ex.map(one, range(len(workload["sessions"]))))
    return out, errors, time.time() - t0


def reuse_shares(sessions):
    """cached_tokens of each turn after the first over the previous turn's prompt."""
    return [min(1.0, b["cached"] / a["prompt"]) for turns in sessions for a, b in zip(turns, turns[1:])]


def replies(sessions):
    return [[(t["text"], json.dumps(t["tool_calls"], sort_keys=True)) for t in turns] for turns in sessions]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(name, sessions, wall, workers=()):
    shares = reuse_shares(sessions)
    ttft = [t["ttft"] for turns in sessions for t in turns]
    tokens = sum(t["completion"] for turns in sessions for t in turns)
    prefilled = sum(t["prompt"] - t["cached"] for turns in sessions for t in turns)
    s = {"policy": name, "turns": len(ttft), "wall_s": round(wall, 1),
         "tokens_per_s": round(tokens / wall, 2), "prefilled_tokens": prefilled,
         "reuse_mean": round(statistics.mean(shares), 4), "reuse_min": round(min(shares), 4),
         "turns_reusing_90": round(sum(x >= 0.9 for x in shares) / len(shares), 4),
         "ttft_p50_ms": round(pct(ttft, 0.5) * 1e3, 1), "ttft_p99_ms": round(pct(ttft, 0.99) * 1e3, 1)}
    print(f"{name:>12}: {s['turns']} turns in {s['wall_s']} s, {s['tokens_per_s']} tok/s, "
          f"prefilled {prefilled} tokens, reuse mean {s['reuse_mean']:.1%} min {s['reuse_min']:.1%}, "
          f"TTFT p50 {s['ttft_p50_ms']} ms p99 {s['ttft_p99_ms']} ms", flush=True)
    if workers:
        s["turns_per_worker"] = [int(w.metrics().get(
            ("hearth_requests_total", '{endpoint="/v1/chat/completions",status="200"}'), 0)) for w in workers]
        print(f"{'':>12}  turns per worker: {s['turns_per_worker']}", flush=True)
    return s


def check_session_files(folder):
    """Every session file's trailing sha256 matches what precedes it."""
    n = 0
    for p in Path(folder).rglob("*.hsession"):
        data = p.read_bytes()
        assert data[:13] == b"HEARTHSESSION", p
        assert hashlib.sha256(data[:-32]).digest() == data[-32:], f"{p}: checksum mismatch"
        n += 1
    return n


def kv_tokens(w):
    return w.metrics().get(("hearth_kv_tokens", ""), 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--gateway-args", default="--balance-abs-threshold 2 --balance-rel-threshold 1.5",
                    help="more smg launch arguments [default: cache_aware balances load once a worker "
                         "has 2 more requests than another and 1.5x as many]")
    args = ap.parse_args()
    workload = json.loads((HERE / "workload.json").read_text())
    gateway_args = args.gateway_args.split()
    tmp = Path(tempfile.mkdtemp(prefix="hearth-gateway-"))
    figures = {"workload": f"{len(workload['sessions'])} conversations x "
                           f"{len(workload['sessions'][0])} turns, {MAX_TOKENS} tokens per reply",
               "model": MODEL, "replicas": 3}

    # 1. The reference: one worker, alone, one conversation at a time.
    w = worker(log_dir=tmp)
    ref, errs, wall = replay(w.host, w.port, workload, 1)
    assert not errs, errs
    figures["single"] = summary("single", ref, wall)
    assert w.stop() == 0
    expected = replies(ref)

    # 2. The two policies, each on three fresh workers: plain ones (KV reuse
    # only where the gateway sends a conversation back to the worker holding
    # it), then sharing one session dir (a conversation moved to another
    # worker is continued from its last turn's file).
    for shared in [False, True]:
        for policy in ["round_robin", "cache_aware"]:
            extra = ["--session-dir", str(tmp / f"s-{policy}"), "--shared-sessions"] if shared else []
            ws = [worker(*extra, log_dir=tmp) for _ in range(3)]
            gw = Gateway(ws, policy, tmp, gateway_args)
            status, body = get(gw.host, gw.port, "/v1/models")
            assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL, body
            got, errs, wall = replay(gw.host, gw.port, workload, args.concurrency)
            assert not errs, errs
            name = policy + ("+shared" if shared else "")
            figures[name] = summary(name, got, wall, ws)
            assert replies(got) == expected, f"{name}: a reply differs from the single worker's"
            gw.stop()
            for x in ws:
                assert x.stop() == 0
    cache = figures["cache_aware+shared"]
    assert cache["reuse_min"] >= 0.9, f"cache_aware: a turn reused {cache['reuse_min']:.1%} of its previous prompt"

    # 3. Failover: SIGKILL one worker after 20 turns, drain another after 45.
    sessions_dir = tmp / "sessions"
    ws = [worker("--session-dir", str(sessions_dir), "--shared-sessions", "--drain-grace", "3",
                 log_dir=tmp) for _ in range(3)]
    gw = Gateway(ws, "cache_aware", tmp, gateway_args)
    events = {}
    alive = list(ws)

    def hook(n):
        if n == 20 and "kill" not in events:
            victim = max(alive, key=kv_tokens)
            alive.remove(victim)
            events["kill"] = {"at": time.time(), "worker": ws.index(victim)}
            victim.proc.kill()
            print(f"    turn {n}: SIGKILL worker {ws.index(victim)}", flush=True)
        if n == 45 and "drain" not in events:
            drained = max(alive, key=kv_tokens)
            alive.remove(drained)
            events["drain"] = {"at": time.time(), "worker": ws.index(drained)}
            drained.proc.send_signal(signal.SIGTERM)
            print(f"    turn {n}: SIGTERM worker {ws.index(drained)}", flush=True)

            def wait_exit():
                events["drain"]["code"] = drained.proc.wait(timeout=120)
                events["drain"]["exited"] = time.time()
            threading.Thread(target=wait_exit, daemon=True).start()

    got, errs, wall = replay(gw.host, gw.port, workload, args.concurrency, hook)
    fail = summary("failover", got, wall, alive)
    killed_at = events["kill"]["at"]
    for e in errs:
        print(f"    error (sent again): conversation {e['session']} turn {e['turn']}: {e['error']}", flush=True)
    # Only requests already in flight when the worker died may fail.
    late = [e for e in errs if e["start"] > killed_at]
    assert not late, f"requests sent after the kill failed: {late}"
    assert replies(got) == expected, "failover: a reply differs from the single worker's"
    deadline = time.time() + 60
    while "code" not in events["drain"] and time.time() < deadline:
        time.sleep(0.2)
    drained = ws[events["drain"]["worker"]]
    assert events["drain"].get("code") == 0, f"the drained worker exited {events['drain'].get('code')}"
    log = drained.logs()
    assert "hearth serve: draining" in log and "shutting down (drained in" in log, log[-2000:]
    restored = sum(x.logs().count("session restored: an anonymous conversation") for x in alive)
    gw.stop()
    for x in alive:
        assert x.stop() == 0
    ws[events["kill"]["worker"]].log.close()
    files = check_session_files(sessions_dir)
    print(f"    drained worker exited 0 after {events['drain']['exited'] - events['drain']['at']:.1f} s; "
          f"{restored} conversations continued from the session dir; {files} session files, checksums good",
          flush=True)
    assert restored > 0 and files > 0
    fail.update({"errors": len(errs), "errors_after_kill_sent": len(late), "drain_exit": 0,
                 "sessions_restored": restored, "session_files": files})
    figures["failover"] = fail

    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    print("ok: gateway replicas (cache-aware reuse, identical replies, SIGKILL failover, SIGTERM drain)")


if __name__ == "__main__":
    main()
