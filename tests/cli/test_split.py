"""Split GGUFs (llama.cpp's gguf-split layout), checked against the `gguf`
package: a packaged model is rewritten as parts by gguf-py's own writer
(`GGUFWriter(split_max_tensors=...)`, what convert_hf_to_gguf.py --split-max-*
writes), then

- `hearth run -m PART` refuses it with a message naming `hearth join`;
- `hearth join PART` writes one file whose metadata (but `split.count`, 0 as
  `llama-gguf-split --merge` writes it) and every tensor (name, type, shape,
  bytes) equal the original's, read back by gguf-py's reader; the model
  answers exactly what the original answers (greedy);
- `hearth pull URL-of-the-first-part` from a local web server downloads every
  part, joins them, removes the parts and prints the joined file; a second
  pull finds it without downloading; `hearth rm` removes it.

Run: HEARTH_BIN=target/release/hearth python3 tests/cli/test_split.py
"""

import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HEARTH_BIN", str(ROOT / "target/release/hearth"))
SPLIT_KEYS = {"split.no", "split.count", "split.tensors.count"}


def hearth(*args, env=None, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=300)
    if check and p.returncode != 0:
        sys.exit(f"hearth {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def fields(reader):
    """{key: (value types, contents)} of a gguf-py reader's metadata, the
    reader's own `GGUF.*` header fields left out."""
    return {f.name: (tuple(f.types), f.contents()) for f in reader.fields.values()
            if not f.name.startswith("GGUF.")}


def write_split(src, out, max_tensors):
    """Rewrites `src` as parts of at most `max_tensors` tensors with gguf-py."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch, split_max_tensors=max_tensors)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()


def same_model(original, joined):
    a, b = gguf.GGUFReader(original), gguf.GGUFReader(joined)
    fa, fb = fields(a), fields(b)
    assert fb.get("split.count", (None, None))[1] == 0, f"split.count of the joined file: {fb.get('split.count')}"
    extra = set(fb) - set(fa) - SPLIT_KEYS
    assert not extra and set(fa) <= set(fb), f"keys differ: {set(fa) ^ set(fb)}"
    for k, v in fa.items():
        assert fb[k] == v, f"{k}: {fb[k]!r} != {v!r}"
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors], "tensor order"
    for ta, tb in zip(a.tensors, b.tensors):
        assert (ta.tensor_type, list(ta.shape)) == (tb.tensor_type, list(tb.shape)), ta.name
        assert np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)), ta.name
    return len(a.tensors)


def answer(model, env=None):
    p = hearth("run", "-m", str(model), "--raw", "-p", "The capital of France is", "-n", "12",
               "--temp", "0", "-t", "2", env=env)
    return p.stdout


def main():
    src = subprocess.run([sys.executable, str(ROOT / "scripts/fetch_models.py"), "smollm2-135m"],
                         check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    tmp = Path(tempfile.mkdtemp(prefix="hearth-split-"))
    parts_dir = tmp / "parts"
    parts_dir.mkdir()
    write_split(src, parts_dir / "smollm2.gguf", max_tensors=100)
    parts = sorted(parts_dir.glob("smollm2-*-of-*.gguf"))
    assert len(parts) >= 2, f"gguf-py wrote {len(parts)} parts"
    n = len(parts)
    for i, p in enumerate(parts):
        f = fields(gguf.GGUFReader(p))
        assert f["split.no"][1] == i and f["split.count"][1] == n, (p, f["split.no"], f["split.count"])
    print(f"gguf-py wrote {n} parts")

    # A part run directly: refused, saying how to join it.
    r = hearth("run", "-m", str(parts[0]), "-p", "hi", "-n", "1", check=False)
    assert r.returncode != 0 and f"part 1 of {n} of a split GGUF" in r.stderr and "hearth join" in r.stderr, r.stderr
    r = hearth("run", "-m", str(parts[1]), "-p", "hi", "-n", "1", check=False)
    assert r.returncode != 0 and f"part 2 of {n}" in r.stderr, r.stderr
    print("a part alone: refused, naming `hearth join`")

    # hearth join: one file equal to the original, answering the same.
    want = answer(src)
    r = hearth("join", str(parts[1]))
    joined = Path(r.stdout.strip().splitlines()[-1])
    assert joined == parts_dir / "smollm2.gguf", joined
    tensors = same_model(src, joined)
    got = answer(joined)
    assert got == want and want.strip(), f"joined answers {got!r}, the original {want!r}"
    print(f"hearth join: {tensors} tensors and the metadata equal the original's; the same answer {want.strip()!r}")
    r = hearth("join", str(parts[0]), check=False)
    assert r.returncode != 0 and "--force" in r.stderr, r.stderr
    (parts_dir / parts[-1].name).rename(tmp / "held")
    r = hearth("join", str(parts[0]), "-o", str(tmp / "x.gguf"), check=False)
    assert r.returncode != 0 and "is missing" in r.stderr and not (tmp / "x.gguf").exists(), r.stderr
    (tmp / "held").rename(parts[-1])
    r = hearth("join", str(tmp / "nothing.gguf"), check=False)
    assert r.returncode != 0 and "not a split GGUF part" in r.stderr, r.stderr
    joined.unlink()
    print("join errors: output exists, a part missing, not a part's name")

    # hearth pull of a split GGUF by URL: every part, joined, parts removed.
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=str(parts_dir))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}/{parts[0].name}"
    env = dict(os.environ, HEARTH_HOME=str(tmp / "home"))
    r = hearth("pull", url, env=env)
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.name == "smollm2.gguf" and path.is_file(), r.stdout
    assert f"joining {n} parts" in r.stderr, r.stderr
    left = sorted(p.name for p in path.parent.iterdir())
    assert left == ["smollm2.gguf", "smollm2.gguf.hearth.json"], left
    same_model(src, path)
    r = hearth("pull", url, env=env)
    assert Path(r.stdout.strip().splitlines()[-1]) == path and "downloading" not in r.stderr, r.stderr
    assert answer(url, env=env) == want
    r = hearth("rm", url, env=env)
    assert not path.exists() and "smollm2.gguf" in r.stdout, r.stdout
    srv.shutdown()
    print(f"hearth pull URL: {n} parts downloaded and joined, parts removed, found again without a download; rm")
    print("split GGUF checks passed")


if __name__ == "__main__":
    main()
