#!/usr/bin/env python3
"""Sessions saved to disk and ring checkpoints, against the real `hearth serve`:

- `POST /v1/sessions/{id}/save` then `/restore` (`--session-dir`): a restored
  session continues exactly as the uninterrupted one did (same greedy reply,
  its prompt reused from the file); a damaged file, one saved with another
  model, a missing one, and a server without --session-dir are refused with
  errors that say so;
- interval checkpoints (serve --checkpoint-every): a session sharing only
  part of another's long prompt starts from the donor's checkpoint inside it;
- checkpoints (gemma3-270m, sliding window 512, no ring slack): a second turn
  that diverges from the first at the assistant's reply cannot roll the rings
  back that far, but the checkpoint taken after the first prompt restores the
  state there: the reply equals that of a session that never moved past the
  first prompt, and the whole first prompt is reused; a session saved to a
  file and restored keeps its checkpoints (the same reply, the same reuse).

Run: python3 tests/server/test_sessions.py
"""
import re
import shutil
import sys
import tempfile
from pathlib import Path

from common import MODEL_ID, Server, http, model_path, run_tests

DIR = None
QWEN = None


def setup():
    global DIR, QWEN
    DIR = Path(tempfile.mkdtemp(prefix="hearth-sessions-"))
    QWEN = Server("--session-dir", str(DIR), ctx=2048)


def teardown():
    if QWEN is not None:
        assert QWEN.stop() == 0
    if DIR is not None:
        shutil.rmtree(DIR, ignore_errors=True)


def chat(server, session, messages, max_tokens=16, **extra):
    r = server.client().chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=max_tokens,
                                                temperature=0, extra_body={"session_id": session, **extra})
    return r.choices[0].message.content, r.usage


def post(server, path):
    return http(server, "POST", path, {})


def test_save_and_restore_continue_like_the_uninterrupted_session():
    first = [{"role": "user", "content": "Write a haiku about the sea."}]
    r1, _ = chat(QWEN, "s1", first)
    status, body = post(QWEN, "/v1/sessions/s1/save")
    assert status == 200, body
    saved_tokens = body["tokens"]
    assert saved_tokens > 20 and (DIR / "s1.hsession").stat().st_size == body["bytes"]
    second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": "Now one about mountains."}]
    r2, _ = chat(QWEN, "s1", second)
    # Gone from memory, back from the file.
    status, _ = http(QWEN, "DELETE", "/v1/sessions/s1")
    assert status == 200
    status, body = post(QWEN, "/v1/sessions/s1/restore")
    assert status == 200 and body["tokens"] == saved_tokens, body
    again, usage = chat(QWEN, "s1", second)
    assert again == r2, (again, r2)
    cached = usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= saved_tokens and cached >= saved_tokens - 20, (cached, saved_tokens)


def test_bad_session_files_are_refused():
    chat(QWEN, "s2", [{"role": "user", "content": "Hi"}], max_tokens=2)
    assert post(QWEN, "/v1/sessions/s2/save")[0] == 200
    data = bytearray((DIR / "s2.hsession").read_bytes())
    data[len(data) // 2] ^= 0x40
    (DIR / "s3.hsession").write_bytes(bytes(data))
    status, body = post(QWEN, "/v1/sessions/s3/restore")
    assert status == 400 and "damaged" in body["error"]["message"], body
    (DIR / "s4.hsession").write_bytes(b"GGUF" + bytes(100))
    status, body = post(QWEN, "/v1/sessions/s4/restore")
    assert status == 400 and "not a hearth session file" in body["error"]["message"], body
    status, body = post(QWEN, "/v1/sessions/nothing-here/restore")
    assert status == 404, body
    status, body = post(QWEN, "/v1/sessions/no-such-session/save")
    assert status == 404, body
    # A session file from another model.
    other = Server("--session-dir", str(DIR), ctx=512, model=model_path("smollm2-135m"))
    try:
        status, body = post(other, "/v1/sessions/s2/restore")
        assert status == 400 and "different model" in body["error"]["message"], body
    finally:
        other.stop()
    # The server still serves, and the good file still restores.
    assert post(QWEN, "/v1/sessions/s2/restore")[0] == 200


def test_without_a_session_dir_saving_is_off():
    plain = Server(ctx=512, model=model_path("smollm2-135m"))
    try:
        status, body = post(plain, "/v1/sessions/x/save")
        assert status == 400 and "--session-dir" in body["error"]["message"], body
    finally:
        plain.stop()


def test_a_new_session_starts_from_another_sessions_prefix():
    """The shared prefix cache: a new named session whose prompt begins like
    another's copies that KV instead of prefilling it, and continues exactly
    as a session that computed the prefix itself; anonymous requests never
    take part, and sessions share only within their cache_salt."""
    system = {"role": "system", "content": "You are a careful coding agent. " + " ".join(
        f"Rule {i}: keep functions short, name things clearly, and test edge case {i}." for i in range(20))}
    task_a = [system, {"role": "user", "content": "Write a Python function that reverses a string."}]
    task_b = [system, {"role": "user", "content": "Write a Python function that adds two numbers."}]
    before = QWEN.metrics().get(("hearth_shared_prefix_tokens_total", ""), 0)
    _, ua = chat(QWEN, "agent-a", task_a, max_tokens=8)
    b, ub = chat(QWEN, "agent-b", task_b, max_tokens=8)
    shared = ub.prompt_tokens_details.cached_tokens
    assert shared > 200, ub
    assert QWEN.metrics()[("hearth_shared_prefix_tokens_total", "")] - before == shared
    assert re.search(r"llm_turn_stats session_id=agent-b reason=shared_prefix ", QWEN.logs())
    # The reference computed the prefix itself (task A, then task B in the
    # same session: it rolls back to the same prefix).
    chat(QWEN, "agent-ref", task_a, max_tokens=8)
    ref, ur = chat(QWEN, "agent-ref", task_b, max_tokens=8)
    assert ur.prompt_tokens_details.cached_tokens == shared, (ur, ub)
    assert b == ref, (b, ref)
    # Anonymous (no session id, the same tenant: no salt): the prefix cache
    # serves it too, from the named sessions that hold task B's prompt.
    r = QWEN.client().chat.completions.create(model=MODEL_ID, messages=task_b, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= shared, (r.usage, shared)

    # cache_salt (vLLM's field) separates tenants: another salt shares nothing,
    # the same salt shares.
    def salted(session, salt):
        r = QWEN.client().chat.completions.create(
            model=MODEL_ID, messages=task_b, max_tokens=2, temperature=0,
            extra_body={"session_id": session, "cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens
    assert salted("tenant-x-1", "tenant-x") == 0
    assert salted("tenant-y-1", "tenant-y") == 0
    assert salted("tenant-x-2", "tenant-x") > 200


def test_the_kv_memory_budget_bounds_the_resident_sessions():
    """--cache-ram MIB (alias of --kv-budget-mib): sessions are the prefix
    cache, and the budget bounds how many states stay resident; past it the
    least recently used idle session is evicted, and its next turn prefills
    its prompt again while a resident session reuses its own."""
    smol = model_path("smollm2-135m")
    probe = Server(ctx=1024, model=smol)
    try:
        mib = float(re.search(r"sessions x ([\d.]+) MiB KV", probe.logs()).group(1))
    finally:
        assert probe.stop() == 0
    budget = int(mib * 2.5)  # room for 2 states
    server = Server("--max-sessions", "8", "--cache-ram", str(budget), ctx=1024, model=smol)
    try:
        assert server.metrics()[("hearth_session_capacity", "")] == 2
        ask = [{"role": "user", "content": "Name three prime numbers. " * 8}]
        _, first = chat(server, "budget-a", ask, max_tokens=2)
        assert first.prompt_tokens_details.cached_tokens == 0
        _, again = chat(server, "budget-a", ask, max_tokens=2)
        assert again.prompt_tokens_details.cached_tokens > 0, again
        chat(server, "budget-b", [{"role": "user", "content": "Say hi."}], max_tokens=2)
        assert server.metrics()[("hearth_session_evictions_total", "")] == 0
        chat(server, "budget-c", [{"role": "user", "content": "Say bye."}], max_tokens=2)
        assert server.metrics()[("hearth_session_evictions_total", "")] == 1
        _, back = chat(server, "budget-a", ask, max_tokens=2)
        assert back.prompt_tokens_details.cached_tokens == 0, back
    finally:
        assert server.stop() == 0


def test_evicted_sessions_come_back_from_the_session_dir():
    """With --session-dir, an evicted session is written to DIR/.evicted and
    its next request brings it back: the reply equals the uninterrupted
    session's (QWEN, never evicted), the whole resident prefix is reused;
    deleting a spilled session removes its file and it starts over."""
    spill_dir = DIR / "spill-test"
    small = Server("--session-dir", str(spill_dir), "--max-sessions", "2", ctx=2048)
    try:
        def turns(server, session):
            first = [{"role": "user", "content": "List three prime numbers, separated by commas."}]
            r1, u1 = chat(server, session, first)
            second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": "And two more."}]
            return u1, second
        u1, second = turns(small, "a")
        chat(small, "b", [{"role": "user", "content": "Name a color."}], max_tokens=4)
        # A third session evicts the least recently used one: a.
        chat(small, "c", [{"role": "user", "content": "Name a fruit."}], max_tokens=4)
        assert (spill_dir / ".evicted" / "a.hsession").exists()
        m = small.metrics()
        assert m[("hearth_session_spills_total", "")] == 1, m
        assert m[("hearth_session_evictions_total", "")] == 1, m
        got, usage = chat(small, "a", second)
        assert not (spill_dir / ".evicted" / "a.hsession").exists()
        assert small.metrics()[("hearth_session_unspills_total", "")] == 1
        _, ref_second = turns(QWEN, "spill-ref")
        assert ref_second == second
        want, ref_usage = chat(QWEN, "spill-ref", second)
        assert got == want, (got, want)
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached == ref_usage.prompt_tokens_details.cached_tokens and cached >= u1.prompt_tokens, (usage, ref_usage)
        assert re.search(r"session evicted: a \(least recently used; capacity 2, kept in --session-dir\)", small.logs())
        # b was evicted to bring a back; deleting it removes its file, and
        # its next request starts over.
        assert (spill_dir / ".evicted" / "b.hsession").exists()
        assert http(small, "DELETE", "/v1/sessions/b")[0] == 200
        assert not (spill_dir / ".evicted" / "b.hsession").exists()
        _, ub = chat(small, "b", [{"role": "user", "content": "Name a color."}], max_tokens=4)
        assert ub.prompt_tokens_details.cached_tokens == 0, ub
        assert http(small, "DELETE", "/v1/sessions/b")[0] == 200
        assert http(small, "DELETE", "/v1/sessions/b")[0] == 404
    finally:
        assert small.stop() == 0


def test_checkpoint_brings_a_ring_back_past_its_slack():
    gemma = Server("--session-dir", str(DIR), ctx=2048, model=model_path("gemma3-270m"))
    try:
        text = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(70))
        first = [{"role": "user", "content": f"{text}\nWhich fact mentions 49?"}]
        second = first + [{"role": "assistant", "content": "Fact 7."},
                          {"role": "user", "content": "And which mentions 64?"}]
        # Session g generates 12 tokens, so its rings move 12 positions past
        # the end of the first prompt; the second turn parts from the first
        # at the assistant's message (the client re-rendered it), 12
        # positions back: more than the rings' slack (0).
        _, u1 = chat(gemma, "g", first, max_tokens=12)
        assert u1.prompt_tokens > 600, u1  # past the 512-token window
        warm, u2 = chat(gemma, "g", second, max_tokens=12)
        # The reference: a session whose state stopped at the end of the
        # first prompt (one token sampled, none fed), continued with the
        # same suffix: the state a correct checkpoint restores.
        chat(gemma, "ref", first, max_tokens=1)
        ref, u3 = chat(gemma, "ref", second, max_tokens=12)
        assert warm == ref, (warm, ref)
        assert u2.prompt_tokens_details.cached_tokens == u1.prompt_tokens, (u1, u2)
        assert u3.prompt_tokens_details.cached_tokens == u1.prompt_tokens, (u1, u3)
        reasons = re.findall(r"llm_turn_stats session_id=g reason=(\w+)", gemma.logs())
        assert reasons == ["new", "checkpoint"], reasons
        # The checkpoint is in the session file: after save, DELETE and
        # restore, session h parts from its rings the same way.
        chat(gemma, "h", first, max_tokens=12)
        status, body = post(gemma, "/v1/sessions/h/save")
        assert status == 200, body
        assert http(gemma, "DELETE", "/v1/sessions/h")[0] == 200
        status, body = post(gemma, "/v1/sessions/h/restore")
        assert status == 200 and body["tokens"] == u1.prompt_tokens + 11, body
        restored, u4 = chat(gemma, "h", second, max_tokens=12)
        assert restored == ref, (restored, ref)
        assert u4.prompt_tokens_details.cached_tokens == u1.prompt_tokens, (u1, u4)
        reasons = re.findall(r"llm_turn_stats session_id=h reason=(\w+)", gemma.logs())
        assert reasons == ["new", "checkpoint"], reasons
        # Without the checkpoint the state would start over: a whole-prompt
        # prefill, which on this model gives another reply (its prefill is
        # not split at the same place), so the check above tells them apart.
        # A new named session with the second prompt starts from the donors'
        # checkpoint at the first prompt's end (their rings moved on): the
        # shared prefix cache on a sliding-window model, same reply.
        fork, uf = chat(gemma, "fork", second, max_tokens=12)
        assert uf.prompt_tokens_details.cached_tokens == u1.prompt_tokens, (u1, uf)
        assert fork == ref, (fork, ref)
        assert re.search(r"llm_turn_stats session_id=fork reason=shared_prefix ", gemma.logs())
        # (A request of another tenant: a named one, or an anonymous one of
        # this tenant, would now start from another session's checkpoint.)
        r = gemma.client().chat.completions.create(model=MODEL_ID, messages=second, max_tokens=12, temperature=0,
                                                   extra_body={"cache_salt": "cold"})
        cold = r.choices[0].message.content
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        print(f"  checkpoint reply {warm!r}; one-pass cold prefill {cold!r}")
    finally:
        gemma.stop()


def test_ring_slack_lets_sliding_window_sessions_share_a_prefix():
    """gemma3-270m (window 512): with no ring slack a new session cannot start
    from another's system prompt (the donor's rings moved past it and its
    only checkpoint is at its prompt's end); with --ring-slack 512 it can,
    and continues exactly as a session that computed the prefix itself."""
    system = {"role": "system", "content": "You answer in one short sentence. " + " ".join(
        f"Rule {i}: mention the number {i} only if asked." for i in range(40))}
    task_a = [system, {"role": "user", "content": "What is rule 3 about?"}]
    task_b = [system, {"role": "user", "content": "What is rule 7 about?"}]
    for slack, shares in (("0", False), ("512", True)):
        gemma = Server("--ring-slack", slack, ctx=2048, model=model_path("gemma3-270m"))
        try:
            chat(gemma, "a", task_a, max_tokens=8)
            b, ub = chat(gemma, "b", task_b, max_tokens=8)
            shared = ub.prompt_tokens_details.cached_tokens
            if not shares:
                assert shared == 0, ub
                continue
            assert shared > 300, ub
            assert re.search(r"llm_turn_stats session_id=b reason=shared_prefix ", gemma.logs())
            # The reference computed the prefix itself (A, then B in the same
            # session: it rolls back to the same prefix, within the slack).
            chat(gemma, "ref", task_a, max_tokens=8)
            ref, ur = chat(gemma, "ref", task_b, max_tokens=8)
            assert ur.prompt_tokens_details.cached_tokens == shared, (ur, ub)
            assert b == ref, (b, ref)
        finally:
            assert gemma.stop() == 0


def test_interval_checkpoints_let_a_session_share_part_of_a_long_prompt():
    """gemma3-270m (window 512, no ring slack): two sessions share a ~700-token
    system prompt and part after it. Without interval checkpoints the second
    shares nothing (the donor's only checkpoint is at its prompt's end, past
    the common prefix, and its rings cannot roll back); with
    --checkpoint-every 256 the donor also kept its rings at the end of its
    first 512-token prefill chunk, and the second session starts there. Its
    reply equals that of a session that computed the prefix itself and rolled
    back to its own checkpoint at the same position."""
    system = {"role": "system", "content": "You answer in one short sentence. " + " ".join(
        f"Rule {i}: the colour of box {i} is shade {i * 7 % 11}." for i in range(45))}
    task_a = [system, {"role": "user", "content": "What colour is box 3?"}]
    task_b = [system, {"role": "user", "content": "What colour is box 9?"}]
    for every, shares in (("0", False), ("256", True)):
        gemma = Server("--checkpoint-every", every, ctx=2048, model=model_path("gemma3-270m"))
        try:
            _, ua = chat(gemma, "a", task_a, max_tokens=8)
            assert ua.prompt_tokens > 600, ua  # the first prefill chunk (512) ends inside the system prompt
            b, ub = chat(gemma, "b", task_b, max_tokens=8)
            shared = ub.prompt_tokens_details.cached_tokens
            if not shares:
                assert shared == 0, ub
                continue
            assert shared == 512, ub
            assert re.search(r"llm_turn_stats session_id=b reason=shared_prefix ", gemma.logs())
            # The reference has a salt of its own, so it takes nothing from a
            # or b: it prefills task A itself (512 + the rest), then rolls
            # back to its own checkpoint for task B.
            _, ur1 = chat(gemma, "ref", task_a, max_tokens=8, cache_salt="ref")
            assert ur1.prompt_tokens_details.cached_tokens == 0, ur1
            ref, ur = chat(gemma, "ref", task_b, max_tokens=8, cache_salt="ref")
            assert ur.prompt_tokens_details.cached_tokens == 512, ur
            reasons = re.findall(r"llm_turn_stats session_id=ref reason=(\w+)", gemma.logs())
            assert reasons == ["new", "checkpoint"], reasons
            assert b == ref, (b, ref)
        finally:
            assert gemma.stop() == 0


if __name__ == "__main__":
    sys.exit(run_tests(globals(), setup, teardown))
