#!/usr/bin/env python3
"""Times `POST /v1/sessions/{id}/save` and `/restore` of a long session against
the real `hearth serve`, and checks that the restored session continues
exactly like the uninterrupted one.

A deterministic synthetic prompt (numbered lines) fills a session of about
7.9K tokens on smollm2-135m (-c 8192, f16 KV: ~181 MB), then:
  1. save it REPS times (client wall time of each POST);
  2. continue the uninterrupted session with a follow-up turn (greedy, 16 tokens);
  3. delete it, restore it REPS times, send the same follow-up turn: the reply
     must be identical and the saved tokens reused from the file.

Run:  HEARTH_BIN=target/ci/hearth python3 bench/session-save.py
      [--model smollm2-135m] [--lines 374] [--reps 3] [--threads 2]
The session file is written under a temporary directory (tmpfs or not, as
$TMPDIR says); pass --dir to choose it. With --keep --dir DIR the file and the
uninterrupted session's reply stay in DIR, and a later run with the same
arguments skips the (slow) prefill: it restores, saves, and checks the
follow-up reply against the stored one (the file format must not change in
between).
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "Which line mentions a glacier first?"
ROOT = Path(__file__).resolve().parent.parent
WORDS = ("amber basin cedar delta ember fjord glacier harbor island juniper kestrel lagoon meadow "
         "nectar orchard prairie quarry river summit tundra upland valley willow yarrow zephyr").split()


def prompt_text(lines):
    out = []
    for i in range(lines):
        w = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6)]
        out.append(f"{i + 1}. The {w[0]} near the {w[1]} keeps {w[2]}, {w[3]} and {w[4]} until {w[5]}.")
    return "Read these notes.\n" + "\n".join(out)


class Server:
    def __init__(self, binary, model, ctx, threads, session_dir, log):
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", model, "--port", "0", "-c", str(ctx), "-t", str(threads),
             "--model-id", "bench", "--spec", "none", "--max-sessions", "2", "--session-dir", str(session_dir)],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        deadline = time.time() + 300
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server exited early; see {log}")
            if "http://" in line:
                self.port = int(line.split("http://")[1].split("/")[0].rsplit(":", 1)[1])
                break
        if self.port is None:
            raise RuntimeError("server did not print its URL")
        for _ in range(600):
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not become ready")

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        return r.status, (json.loads(text) if text else None)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lines", type=int, default=374)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true",
                    help="keep the session file and the reference reply in --dir; a later run with the same "
                         "--dir restores that file instead of prefilling again (quick mode)")
    args = ap.parse_args()
    binary = os.environ.get("HEARTH_BIN", str(ROOT / "target" / "ci" / "hearth"))
    tmp = Path(tempfile.mkdtemp(prefix="hearth-sessbench-"))
    session_dir = Path(args.dir) if args.dir else tmp / "sessions"
    session_dir.mkdir(parents=True, exist_ok=True)
    server = Server(binary, args.model, args.ctx, args.threads, session_dir, tmp / "serve.log")
    ok = False
    try:
        def chat(messages, n):
            s, b = server.request("POST", "/v1/chat/completions", {
                "model": "bench", "messages": messages, "max_tokens": n, "temperature": 0, "session_id": "bench"})
            assert s == 200, b
            return b["choices"][0]["message"]["content"], b["usage"]

        first = [{"role": "user", "content": prompt_text(args.lines)}]
        meta = session_dir / "bench.json"
        saves, restores = [], []

        def save():
            for _ in range(args.reps):
                t = time.perf_counter()
                s, b = server.request("POST", "/v1/sessions/bench/save")
                saves.append(time.perf_counter() - t)
                assert s == 200, b
            return b["tokens"], b["bytes"]

        def restore(tokens):
            for _ in range(args.reps):
                t = time.perf_counter()
                s, b = server.request("POST", "/v1/sessions/bench/restore")
                restores.append(time.perf_counter() - t)
                assert s == 200 and b["tokens"] == tokens, b

        if args.keep and meta.exists() and (session_dir / "bench.hsession").exists():
            # Quick mode: the file and the reference reply of an earlier full run.
            m = json.loads(meta.read_text())
            assert m["lines"] == args.lines and m["model"] == args.model, m
            tokens, r1, reference = m["tokens"], m["r1"], m["reference"]
            restore(tokens)
            _, size = save()
            print(f"(quick mode: restored the file of an earlier full run in {session_dir})")
        else:
            t = time.perf_counter()
            r1, usage = chat(first, 1)
            print(f"prefill: {usage['prompt_tokens']} prompt tokens in {time.perf_counter() - t:.1f} s", flush=True)
            tokens, size = save()
            second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": QUESTION}]
            reference, _ = chat(second, 16)
            assert server.request("DELETE", "/v1/sessions/bench")[0] == 200
            restore(tokens)
            if args.keep:
                meta.write_text(json.dumps({"lines": args.lines, "model": args.model, "tokens": tokens,
                                            "r1": r1, "reference": reference}))
        print(f"session: {tokens} tokens, file {size / 1e6:.1f} MB", flush=True)
        second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": QUESTION}]
        again, usage = chat(second, 16)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        exact = again == reference and cached >= tokens - 20
        print("save    s: " + " ".join(f"{x:.3f}" for x in saves) + f"   (best {min(saves):.3f})")
        print("restore s: " + " ".join(f"{x:.3f}" for x in restores) + f"   (best {min(restores):.3f})")
        print(f"save + restore (best of each): {min(saves) + min(restores):.3f} s")
        print(f"continuation after restore: {'identical' if exact else 'DIFFERENT'} "
              f"({cached} of {tokens} saved tokens reused; reply {again!r})")
        ok = exact
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
