"""`hearth run` with no prompt on a terminal: an interactive chat, driven here
through a pseudo-terminal as a person would type. Checks: two turns, the
second reusing the first turn's KV cache (its stats line reports cached
prompt tokens); Ctrl-C in the middle of an answer stops the answer and keeps
the session (the next turn still reuses the cache); /save writes the
transcript; Ctrl-D exits cleanly; /image without --mmproj is a clear error.
With the vision end-to-end fixture pair (a synthetic Muse Glimmer text model
and mmproj, tests/fixtures/vision/e2e): `/image FILE` attaches an image to the
next message, whose reply equals `hearth run --image FILE -p ...`'s (that path
is checked against llama-mtmd-cli in crates/cli/tests/vision_e2e.rs); the next
turn reuses the image's KV and does not encode it again; a missing file is an
error that keeps the chat.

Run: HEARTH_BIN=target/release/hearth python3 tests/cli/test_interactive.py
"""

import fcntl
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import termios
import time

BIN = os.environ.get("HEARTH_BIN", "target/release/hearth")
MODEL = "smollm2-135m"
STATS = re.compile(r"\[(\d+) tokens, [\d.]+ tok/s; prompt (\d+) tokens, (\d+) cached([^\]]*)\]")


class Terminal:
    """hearth run in a pty; stdout and stderr both go to the terminal."""

    def __init__(self, args):
        self.master, slave = pty.openpty()
        env = dict(os.environ, TERM="xterm")
        def controlling_tty():
            # A session of its own with the pty as its terminal, so Ctrl-C
            # raises SIGINT as in a real terminal.
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            [BIN] + args,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
            preexec_fn=controlling_tty,
        )
        os.close(slave)
        self.buf = b""

    def read_until(self, pattern, timeout):
        """Reads until `pattern` (a regex on the text since the last match) appears."""
        deadline = time.time() + timeout
        rx = re.compile(pattern)
        while True:
            text = self.buf.decode("utf-8", "replace")
            m = rx.search(text)
            if m:
                self.buf = self.buf[len(text[: m.end()].encode("utf-8")) :]
                return text[: m.end()], m
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}; got:\n{text[-2000:]}")
            r, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if r:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    if self.proc.poll() is not None:
                        raise AssertionError(f"hearth exited ({self.proc.returncode}) before {pattern!r}:\n{text[-2000:]}")
                self.buf += chunk

    def send(self, data):
        os.write(self.master, data.encode() if isinstance(data, str) else data)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def turn(term, text, timeout=300):
    term.send(text + "\r")
    out, m = term.read_until(STATS.pattern, timeout)
    term.read_until(r">>> ", 60)
    return out, int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)


def quit_cleanly(term):
    """Ctrl-D: the chat exits with status 0."""
    term.send(b"\x04")
    deadline = time.time() + 30
    while term.proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert term.proc.returncode == 0, term.proc.returncode


def main():
    home = tempfile.mkdtemp(prefix="hearth-interactive-")
    transcript = os.path.join(home, "chat.json")
    # The packaged models stay where they are; only the history file moves.
    models = os.path.join(os.environ.get("HEARTH_HOME") or os.path.expanduser("~/.cache/hearth"), "models")
    os.symlink(models, os.path.join(home, "models"))
    os.environ["HEARTH_HOME"] = home
    # -n 256: the story turn below must still be running 0.3 s after its
    # first word when Ctrl-C arrives (48 tokens took 0.27 s at 175 tok/s on
    # an idle AVX-512 machine); the other turns end at the model's stop.
    term = Terminal(["run", "-m", MODEL, "--temp", "0", "-n", "256", "-t", "2", "-c", "2048"])
    try:
        term.read_until(r"chatting with .*\n", 120)
        term.read_until(r">>> ", 60)

        out1, n1, p1, c1, _ = turn(term, "Hi! What is the capital of France?")
        assert n1 > 0 and c1 == 0, out1
        assert "Paris" in out1, out1

        out2, n2, p2, c2, _ = turn(term, "And of Italy?")
        assert p2 > p1, (p1, p2)
        assert c2 >= p1, f"turn 2 reuses turn 1's prompt from the KV cache: {c2} cached of {p2}"

        # A long answer, stopped with Ctrl-C once it has started.
        term.send("Write a long story about a dragon who learns to bake bread.\r")
        term.read_until(r"bake bread\.", 30)  # the terminal's echo of the line
        term.read_until(r"[A-Za-z]{4,}", 120)  # the answer has begun
        time.sleep(0.3)
        term.send(b"\x03")
        out3, m3 = term.read_until(STATS.pattern, 120)
        assert "stopped" in m3.group(4), out3
        term.read_until(r">>> ", 60)

        out4, n4, p4, c4, _ = turn(term, "Thanks. One word: what colour is the sky?")
        assert n4 > 0, out4
        assert c4 > p2, f"the session survived Ctrl-C: {c4} cached of {p4}"

        term.send(f"/save {transcript}\r")
        term.read_until(r"saved \d+ messages", 30)
        term.read_until(r">>> ", 30)
        saved = json.load(open(transcript))["messages"]
        assert [m["role"] for m in saved] == ["user", "assistant"] * 4, saved
        assert saved[0]["content"] == "Hi! What is the capital of France?"

        term.send("/image nothing.png\r")
        term.read_until(r"needs the model's projector: start with --mmproj", 30)
        term.read_until(r">>> ", 30)

        quit_cleanly(term)
    finally:
        term.close()
    print("PASS interactive chat: two turns with cache reuse, Ctrl-C keeps the session, /save, Ctrl-D")
    commands()
    progress(home)
    images(home)


def progress(home):
    """`hearth run -f big.txt > out` on a terminal: a spinner while the model
    loads and the prefill's percentage on stderr; stdout holds only the
    answer. With stderr not a terminal, neither is printed."""
    big = os.path.join(home, "big.txt")
    with open(big, "w") as f:
        f.write(" ".join(f"Item {i} is a red apple." for i in range(500)) + "\nHow many apples?")
    out_path = os.path.join(home, "answer.txt")
    master, slave = pty.openpty()
    with open(out_path, "w") as out:
        proc = subprocess.Popen([BIN, "run", "-m", "qwen2.5-coder-0.5b", "-f", big, "-n", "4", "--temp", "0",
                                 "-t", "2", "-c", "8192"], stdin=subprocess.DEVNULL, stdout=out, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        r, _, _ = select.select([master], [], [], 1.0)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk and proc.poll() is not None:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    err = seen.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "loading qwen2.5-coder-0.5b" in err, err[:500]
    pct = [int(x) for x in re.findall(r"reading the prompt: (\d+)%", err)]
    assert len(pct) >= 3 and pct == sorted(pct) and pct[-1] < 100, (pct, err[:500])
    answer = open(out_path).read()
    assert answer.strip() and "\x1b" not in answer and "reading the prompt" not in answer, answer
    plain = subprocess.run([BIN, "run", "-m", "qwen2.5-coder-0.5b", "-f", big, "-n", "4", "--temp", "0", "-t", "2",
                            "-c", "8192"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert plain.returncode == 0 and "reading the prompt" not in plain.stderr and "loading" not in plain.stderr
    assert plain.stdout == answer, (plain.stdout, answer)
    print("PASS progress: a load spinner and the prefill's percentage on a terminal, stdout clean")


def commands():
    """Ollama's REPL habits: a \"\"\" message over several lines, /set parameter,
    /set system, /show info|parameters|system, and Ctrl-C during a long
    prompt dropping that message."""
    term = Terminal(["run", "-m", MODEL, "-n", "24", "-t", "2", "-c", "4096"])
    try:
        term.read_until(r"chatting with .*\n", 120)
        term.read_until(r">>> ", 60)
        term.send("/set parameter temperature 0\r")
        term.read_until(r"set temperature to 0", 30)
        term.send("/set parameter top_k banana\r")
        term.read_until(r"error: top_k: 'banana' is not a number", 30)
        term.send("/show parameters\r")
        out, _ = term.read_until(r"num_ctx 4096", 30)
        assert "temperature 0" in out and "num_predict 24" in out, out
        term.send("/show info\r")
        out, _ = term.read_until(r"file .*SmolLM2", 30)
        assert "architecture" in out and "llama" in out, out
        term.send("/set system You answer in one word.\r")
        term.read_until(r"system message set", 30)
        term.send("/show system\r")
        term.read_until(r"You answer in one word\.", 30)
        term.read_until(r">>> ", 30)
        # A message of three lines: one user turn. Each line is typed at its
        # own "... " prompt (the line editor drops input typed ahead of it).
        term.send('"""What colour is\r')
        term.read_until(r"\.\.\. ", 30)
        term.send("the sky\r")
        term.read_until(r"\.\.\. ", 30)
        out1, n1, p1, c1, _ = turn(term, 'on a clear day?"""')
        assert n1 > 0, out1
        out2, n2, p2, c2, _ = turn(term, "And grass?")
        assert c2 >= p1, (p1, p2, c2)
        # A long message, stopped while its prompt is prefilled: dropped.
        term.send('"""\r')
        for i in range(180):
            term.read_until(r"\.\.\. ", 30)
            term.send(f"Line {i}: the quick brown fox jumps over the lazy dog again.\r")
        term.read_until(r"\.\.\. ", 30)
        term.send('end of the long message"""\r')
        term.read_until(r"end of the long message", 60)
        time.sleep(0.15)
        term.send(b"\x03")
        term.read_until(r"stopped during the prompt; the message was dropped", 60)
        term.read_until(r">>> ", 30)
        out3, n3, p3, c3, _ = turn(term, "And snow?")
        assert p3 < p2 + 60, f"the dropped message is not in the prompt: {p3} tokens (turn 2: {p2})"
        assert c3 >= p2, f"the conversation before it is still cached: {c3} of {p3}"
        quit_cleanly(term)
    finally:
        term.close()
    print("PASS interactive commands: \"\"\" multi-line, /set parameter, /set system, /show, a stopped prompt dropped")


def images(home):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fix = os.path.join(root, "tests", "fixtures", "vision", "e2e")
    fx = json.load(open(os.path.join(fix, "e2e.json")))
    text, mmproj = os.path.join(home, "text.gguf"), os.path.join(home, "mmproj.gguf")
    for out, flags in [(text, fx["text_synth_flags"]), (mmproj, fx["mmproj_synth_flags"])]:
        subprocess.run([BIN, "synth", *flags, "-o", out], check=True, capture_output=True)
    png = os.path.join(fix, "square_56x56.png")
    common = ["-m", text, "--mmproj", mmproj, "--temp", "0", "-n", "16", "-t", "2"]
    want = subprocess.run([BIN, "run", *common, "--image", png, "-p", "Describe the image."],
                          check=True, capture_output=True, text=True).stdout.strip()
    assert want, "hearth run --image printed nothing"
    term = Terminal(["run", *common, "-c", "2048"])
    try:
        term.read_until(r"chatting with .*\n", 120)
        term.read_until(r">>> ", 60)
        term.send(f"/image {png}\r")
        term.read_until(r"attached .*square_56x56\.png: 56x56, 4 image tokens", 30)
        term.read_until(r">>> ", 30)
        out1, n1, p1, c1, _ = turn(term, "Describe the image.")
        plain = out1.replace("\r\n", "\n")
        assert "encoded on the CPU" in plain, out1
        assert want in plain, f"the chat's reply differs from hearth run --image's {want!r}:\n{out1}"
        out2, n2, p2, c2, _ = turn(term, "And again?")
        assert c2 >= p1, f"turn 2 reuses the image's KV: {c2} cached of {p2} (turn 1: {p1}):\n{out2}"
        assert "encoded on the" not in out2, out2
        term.send("/image missing.png\r")
        term.read_until(r"error: .*missing\.png", 30)
        term.read_until(r">>> ", 30)
        out3, n3, _, c3, _ = turn(term, "Still there?")
        assert n3 > 0 and c3 >= p2, out3
        quit_cleanly(term)
    finally:
        term.close()
    print("PASS interactive chat with /image: the reply equals hearth run --image's, the image's KV reused")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
