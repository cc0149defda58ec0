"""The chat page `hearth serve` opens on, in a real headless browser (Debian's
chromium, driven by Playwright for Python over the DevTools protocol), against
the real server and packaged models:

- the page loads (size and time to interactive printed), sends a message and
  shows the reply streaming in: the reply's text is seen growing several times
  before it ends, and equals the API's own greedy reply to the same request;
- a long reply is stopped mid-stream (Stop): it stops growing, says so, and the
  server counts the request cancelled;
- after a reload the conversation is listed and shown again; a second
  conversation's request carries none of the first's messages and another
  session id, and the first conversation's next turn reuses its KV;
- an image attached to a message (synthetic Muse Glimmer model + mmproj, with
  --mmproj) reaches the model: the reply equals the API's to the same image;
- replies with `<script>`, `<img onerror>`, `javascript:` links and HTML in
  reasoning and tool-call arguments render as inert text (the stream is the
  server's shape, served by the browser's request interception);
- with --api-key the page asks for the key, refuses a wrong one, and works
  with the right one; --no-webui serves no page;
- no request leaves the page's origin (the browser's own network log).

Screenshots go to $WEBUI_SHOTS (default: a temporary folder).

Run: HEARTH_BIN=target/release/hearth python3 tests/webui/test_webui.py
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from common import Server  # noqa: E402

from playwright.sync_api import sync_playwright  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HEARTH_BIN", str(ROOT / "target/release/hearth"))
SHOTS = Path(os.environ.get("WEBUI_SHOTS") or tempfile.mkdtemp(prefix="hearth-webui-"))
KEY = "webui-test-key"


def chromium():
    for c in [os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")]:
        if c and os.path.exists(c):
            return c
    sys.exit("chromium not found (Debian: apt-get install chromium; or set CHROMIUM)")


def post(base, path, body, key=None):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": "Bearer " + key} if key else {})})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def origin_of(url):
    return re.match(r"^[a-z]+://[^/]+", url).group(0)


class Page:
    """A browser page with its network log and console errors."""

    def __init__(self, browser, origin, **kw):
        self.ctx = browser.new_context(viewport=kw.pop("viewport", {"width": 1200, "height": 800}), **kw)
        self.page = self.ctx.new_page()
        self.origin = origin
        self.urls, self.errors, self.bodies = [], [], []
        self.page.on("request", self._request)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _request(self, r):
        self.urls.append(r.url)
        if r.url.endswith("/v1/chat/completions") and r.post_data:
            self.bodies.append(json.loads(r.post_data))

    def open(self):
        t0 = time.monotonic()
        self.page.goto(self.origin + "/")
        self.page.wait_for_selector("#model option", state="attached", timeout=30000)
        return time.monotonic() - t0

    def send(self, text):
        self.page.fill("#input", text)
        self.page.keyboard.press("Enter")

    def reply_text(self):
        return self.page.evaluate(
            "() => { const m = [...document.querySelectorAll('.msg.assistant .body')]; "
            "return m.length ? m[m.length - 1].innerText : ''; }")

    def wait_reply_done(self, timeout=120):
        self.page.wait_for_selector("#send:not([hidden])", timeout=timeout * 1000)

    def foreign(self):
        return [u for u in self.urls if not (u.startswith(self.origin + "/") or u.startswith("data:")
                                             or u.startswith("blob:"))]

    def shot(self, name):
        self.page.screenshot(path=str(SHOTS / name))

    def close(self):
        self.ctx.close()


def metric(base, name, key=None):
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": "Bearer " + key} if key else {})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def chat_checks(browser, srv):
    base = srv.base.removesuffix("/v1")
    p = Page(browser, base)
    try:
        tti = p.open()
        html = urllib.request.urlopen(base + "/").read()
        assets = re.findall(rb'(?:src|href)="(/ui/[^"]+)"', html)
        size = len(html) + sum(len(urllib.request.urlopen(base + a.decode()).read()) for a in assets)
        assert len(assets) == 2 and all(re.search(rb"-[0-9a-f]{12}\.(js|css)$", a) for a in assets), assets
        print(f"page: {size} bytes (HTML+JS+CSS), interactive in {tti * 1000:.0f} ms (models listed)")
        with urllib.request.urlopen(base + "/") as r:
            csp = r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp, csp
        import http.client
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
        c.request("GET", "/", headers={"Host": "evil.example"})
        assert c.getresponse().status == 403, "a foreign Host got the page"
        print("the page carries a same-origin-only CSP; a foreign Host gets 403 for it as for the API")

        # 1. A streamed reply, seen growing, equal to the API's greedy reply.
        p.page.click("#settings-open")
        p.page.fill("#set-temperature", "0")
        p.page.fill("#set-max-tokens", "96")
        p.page.click("#settings-save")
        question = "Write a Python function that adds two numbers."
        p.send(question)
        lengths = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            n = len(p.reply_text())
            if not lengths or n != lengths[-1]:
                lengths.append(n)
            if p.page.is_visible("#send"):
                break
            time.sleep(0.005)
        p.wait_reply_done()
        final = p.reply_text()
        growing = [n for n in lengths if 0 < n < len(final)]
        assert len(growing) >= 3, f"the reply did not stream in: lengths seen {lengths}, final {len(final)}"
        body = p.bodies[-1]
        assert body["stream"] is True and body["session_id"].startswith("web-"), body
        api = post(srv.base, "/chat/completions",
                   {"model": body["model"], "messages": body["messages"], "temperature": 0, "max_tokens": 96})
        want = api["choices"][0]["message"]["content"]
        got_md = p.page.evaluate("() => JSON.parse(localStorage.getItem('hearth.conversations'))[0].messages[1].content")
        assert got_md == want, f"page reply {got_md!r} != API reply {want!r}"
        stats = p.page.inner_text(".msg.assistant .stats")
        assert re.search(r"prompt \d+ tokens, \d+ reused · prefill [\d.]+ tok/s · decode [\d.]+ tok/s", stats), stats
        print(f"streamed reply: seen at {len(growing)} lengths before its end, equal to the API's ({len(want)} chars); {stats}")
        p.shot("chat.png")

        # 2. Stop a long reply mid-stream.
        p.page.click("#settings-open")
        p.page.fill("#set-max-tokens", "")
        p.page.click("#settings-save")
        cancelled = metric(base, "hearth_cancelled_requests_total")
        p.send("Write a short poem about the sea.")
        p.page.wait_for_function("() => { const m = [...document.querySelectorAll('.msg.assistant .body')];"
                                 " return m.length >= 2 && m[m.length - 1].innerText.length > 200; }", timeout=120000)
        p.page.click("#stop")
        p.wait_reply_done(30)
        n0 = len(p.reply_text())
        time.sleep(1.5)
        assert len(p.reply_text()) == n0, "the reply kept growing after Stop"
        assert p.page.is_visible(".msg.assistant .stopped"), "no 'stopped' mark"
        for _ in range(50):
            if metric(base, "hearth_cancelled_requests_total") > cancelled:
                break
            time.sleep(0.1)
        assert metric(base, "hearth_cancelled_requests_total") > cancelled, "the server did not see the stop"
        print(f"stop: the reply stopped at {n0} chars, marked stopped, the server counted it cancelled")

        # 3. Reload: the conversation is still there.
        first_id = body["session_id"]
        p.page.reload()
        p.page.wait_for_selector("#conversations li", timeout=10000)
        titles = p.page.eval_on_selector_all("#conversations li span", "els => els.map(e => e.innerText)")
        assert titles == [question], titles
        shown = p.page.inner_text("#messages")
        again = p.page.eval_on_selector_all(".msg.assistant .body", "els => els.map(e => e.innerText)")
        assert question in shown and again[0] == final and len(again) == 2, (shown[:300], again, final[:200])
        print("reload: the conversation is listed and shown again")

        # 4. A second conversation sees nothing of the first.
        p.page.click("#new-chat")
        p.send("What is 2 + 2?")
        p.wait_reply_done()
        second = p.bodies[-1]
        assert second["session_id"] != first_id, second["session_id"]
        assert [m["content"] for m in second["messages"] if m["role"] != "system"] == ["What is 2 + 2?"], second["messages"]
        titles = p.page.eval_on_selector_all("#conversations li span", "els => els.map(e => e.innerText)")
        assert titles == ["What is 2 + 2?", question], titles
        # Regenerate (greedy: the same reply again), edit and resend, a server error shown.
        before = p.reply_text()
        p.page.hover(".msg.assistant")
        p.page.click(".msg.assistant .regenerate")
        p.wait_reply_done()
        assert p.reply_text() == before and p.page.locator(".msg").count() == 2, p.page.inner_text("#messages")
        assert p.bodies[-1]["messages"] == second["messages"], p.bodies[-1]["messages"]
        p.page.hover(".msg.user")
        p.page.click(".msg.user .edit")
        assert p.page.input_value("#input") == "What is 2 + 2?" and p.page.locator(".msg").count() == 0
        p.page.fill("#input", "What is 3 + 3?")
        p.page.keyboard.press("Enter")
        p.wait_reply_done()
        assert [m["content"] for m in p.bodies[-1]["messages"] if m["role"] != "system"] == ["What is 3 + 3?"]
        assert p.page.locator(".msg").count() == 2
        p.page.click("#settings-open")
        p.page.fill("#set-temperature", "-3")
        p.page.click("#settings-save")
        p.send("this one fails")
        p.wait_reply_done()
        err = p.page.inner_text(".msg.assistant .error")
        assert "temperature" in err and "HTTP 400" in err, err
        p.page.click("#settings-open")
        p.page.fill("#set-temperature", "0")
        p.page.click("#settings-save")
        print(f"regenerate (the same greedy reply), edit and resend, a server error shown: {err!r}")
        # Back to the first: its next turn reuses its session's KV.
        p.page.click("#conversations li:nth-child(2)")
        p.page.click("#settings-open")
        p.page.fill("#set-max-tokens", "8")
        p.page.click("#settings-save")
        p.send("And one more?")
        p.wait_reply_done()
        third = p.bodies[-1]
        assert third["session_id"] == first_id and len(third["messages"]) >= 5, third
        stats = p.page.eval_on_selector_all(".msg.assistant .stats", "els => els.map(e => e.innerText)")[-1]
        prompt, reused = map(int, re.search(r"prompt (\d+) tokens, (\d+) reused", stats).groups())
        assert reused > prompt // 2, f"the first conversation's KV was not reused: {stats}"
        print(f"second conversation: its own session, none of the first's messages; back in the first: {stats}")

        # 5. Hostile replies render inert.
        xss_checks(p)
        assert not p.errors, p.errors
        bad = p.foreign()
        assert not bad, f"requests left the origin: {bad}"
        print(f"network: {len(p.urls)} requests, all to {base}")
        # Export, then import into a browser profile that has nothing.
        with p.page.expect_download() as dl:
            p.page.click("#export")
        exported = SHOTS / "export.json"
        dl.value.save_as(str(exported))
        data = json.loads(exported.read_text())
        assert len(data["conversations"]) == 3, [c["title"] for c in data["conversations"]]
        q = Page(browser, base)
        try:
            q.open()
            q.page.set_input_files("#import-file", str(exported))
            q.page.wait_for_function("() => document.querySelectorAll('#conversations li').length == 3")
            q.page.click("#conversations li:last-child")
            assert q.page.eval_on_selector_all(".msg.assistant .body", "els => els.map(e => e.innerText)")[0] == final
        finally:
            q.close()
        print("export / import: 3 conversations out, and back in a fresh browser profile")
        p.page.click("#conversations li:last-child")
        p.page.set_viewport_size({"width": 390, "height": 760})
        p.page.wait_for_timeout(500)  # the sidebar's slide-out
        assert not p.page.is_visible("#new-chat") or p.page.evaluate(
            "() => document.getElementById('sidebar').getBoundingClientRect().right <= 0"), "sidebar over the chat"
        p.shot("phone.png")
    finally:
        p.close()


XSS = ('Hello <script>window.__xss = 1</script> and <img src=x onerror="window.__xss = 2"> '
       '[click](javascript:window.__xss=3) <a href="javascript:window.__xss=4">a</a>\n\n'
       '```html\n<script>window.__xss = 5</script>\n```\n**bold** <b onmouseover="window.__xss=6">b</b>')


def xss_checks(p):
    def sse(route):
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"index": 0, "delta": {"reasoning_content": '<img src=y onerror="window.__xss=7">'}}]}]
        for piece in re.findall(r".{1,7}", XSS, re.S):
            chunks.append({"choices": [{"index": 0, "delta": {"content": piece}}]})
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                       "function": {"name": "<img src=z onerror=window.__xss=8>",
                                    "arguments": '{"html": "<script>window.__xss=9</script>"}'}}]}}]})
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    p.page.route("**/v1/chat/completions", sse)
    p.page.click("#new-chat")
    p.send("say something nasty")
    p.wait_reply_done()
    p.page.unroute("**/v1/chat/completions")
    p.page.hover(".msg.assistant .body")
    flag = p.page.evaluate("() => window.__xss")
    assert flag is None, f"model output ran as code: window.__xss = {flag}"
    found = p.page.evaluate("""() => {
        const m = [...document.querySelectorAll('.msg.assistant')].pop();
        return {
          script: m.querySelectorAll('script').length,
          img: m.querySelectorAll('img').length,
          handlers: [...m.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
          jsLinks: [...m.querySelectorAll('a')].filter(a => !/^https?:|^mailto:/.test(a.href)).length,
          text: m.innerText,
        };
    }""")
    assert found["script"] == found["img"] == found["handlers"] == found["jsLinks"] == 0, found
    for literal in ["<script>window.__xss = 1</script>", '<img src=x onerror="window.__xss = 2">',
                    "<img src=z onerror=window.__xss=8>", "bold"]:
        assert literal in found["text"], (literal, found["text"])
    assert p.page.locator(".msg.assistant strong").last.inner_text() == "bold"
    print("hostile reply: <script>, <img onerror>, javascript: links and HTML in reasoning and tool calls shown as text, none ran")


def image_checks(browser, home):
    fix = ROOT / "tests/fixtures/vision/e2e"
    fx = json.loads((fix / "e2e.json").read_text())
    text, mmproj = Path(home) / "text.gguf", Path(home) / "mmproj.gguf"
    for out, flags in [(text, fx["text_synth_flags"]), (mmproj, fx["mmproj_synth_flags"])]:
        subprocess.run([BIN, "synth", *flags, "-o", str(out)], check=True, capture_output=True)
    srv = Server("--mmproj", str(mmproj), model=str(text), ctx=2048)
    base = srv.base.removesuffix("/v1")
    p = Page(browser, base)
    try:
        p.open()
        assert p.page.is_visible("#attach-button"), "no image button with --mmproj"
        p.page.click("#settings-open")
        p.page.fill("#set-temperature", "0")
        p.page.fill("#set-max-tokens", "16")
        p.page.click("#settings-save")
        png = fix / "square_56x56.png"
        p.page.set_input_files("#attach", str(png))
        p.page.wait_for_selector("#attachments img")
        p.send("Describe the image.")
        p.wait_reply_done(180)
        body = p.bodies[-1]
        parts = body["messages"][-1]["content"]
        assert [x["type"] for x in parts] == ["text", "image_url"], parts
        assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,"), parts[1]["image_url"]["url"][:40]
        api = post(srv.base, "/chat/completions",
                   {"model": body["model"], "messages": body["messages"], "temperature": 0, "max_tokens": 16})
        want = api["choices"][0]["message"]["content"]
        got = p.page.evaluate("() => JSON.parse(localStorage.getItem('hearth.conversations'))[0].messages[1].content")
        assert got == want and want, f"page {got!r} != API {want!r}"
        assert p.page.is_visible(".msg.user .images img")
        assert api["usage"]["prompt_tokens_details"].get("image_tokens", 0) > 0, api["usage"]
        assert not p.foreign() and not p.errors, (p.foreign(), p.errors)
        p.shot("image.png")
        print(f"image: attached, sent as a data: URL, the reply equals the API's ({want!r})")
    finally:
        p.close()
        srv.stop()


def key_checks(browser, model):
    srv = Server("--api-key", KEY, model=model, api_key=KEY)
    base = srv.base.removesuffix("/v1")
    p = Page(browser, base)
    try:
        p.page.goto(base + "/")
        p.page.wait_for_selector("#key-dialog[open]", timeout=10000)
        p.page.fill("#key-input", "wrong")
        p.page.click("#key-save")
        p.page.wait_for_selector("#key-error:not([hidden])")
        assert "refused" in p.page.inner_text("#key-error")
        p.page.fill("#key-input", KEY)
        p.page.click("#key-save")
        p.page.wait_for_selector("#key-dialog:not([open])", state="attached")
        p.page.wait_for_selector("#model option", state="attached")
        p.page.click("#settings-open")
        p.page.fill("#set-max-tokens", "8")
        p.page.click("#settings-save")
        p.send("hi")
        p.wait_reply_done()
        assert p.reply_text().strip() and not p.page.query_selector(".msg.assistant .error"), p.page.inner_text("#messages")
        # Without the key the API still refuses; the page itself needs none.
        try:
            post(srv.base, "/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
            raise AssertionError("the API answered without the key")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        assert not p.foreign() and not p.errors, (p.foreign(), p.errors)
        print("api key: asked for, a wrong key refused, the right one kept and used")
    finally:
        p.close()
        srv.stop()
    srv = Server("--no-webui", model=model)
    try:
        try:
            urllib.request.urlopen(srv.base.removesuffix("/v1") + "/")
            raise AssertionError("--no-webui still serves the page")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        print("--no-webui: no page")
    finally:
        srv.stop()


def main():
    model = subprocess.run([sys.executable, str(ROOT / "scripts/fetch_models.py"), "smollm2-135m"],
                           check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    home = tempfile.mkdtemp(prefix="hearth-webui-home-")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            srv = Server(model=model, ctx=4096)
            try:
                chat_checks(browser, srv)
            finally:
                srv.stop()
            image_checks(browser, home)
            key_checks(browser, model)
        finally:
            browser.close()
    print(f"screenshots in {SHOTS}")
    print("web page checks passed")


if __name__ == "__main__":
    main()
