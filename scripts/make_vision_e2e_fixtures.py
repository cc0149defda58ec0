#!/usr/bin/env python3
"""End-to-end image fixtures: llama.cpp 11434's llama-mtmd-cli on a synthetic Muse Glimmer text
model + a synthetic mmproj (both written by `hearth synth`), greedy 32 tokens for 3 images, for
crates/cli/tests/vision_e2e.rs (which runs `hearth run --image` against them).

    python3 scripts/make_vision_e2e_fixtures.py [--bin-dir DIR] [--text-seed N]

Writes tests/fixtures/vision/e2e/:
- e2e.json: the synth flags and the files' sha256, the prompt, llama-mtmd-cli's command and its
  greedy text per image, and llama.cpp's image rows' files;
- <image>.png: the inputs (smooth patterns made here with numpy + Pillow);
- <image>.embd.f32: llama.cpp's rows for each image (mtmd_encode_chunk + mtmd_get_output_embd
  through scripts/mtmd_vision_dump.cpp, [n_tokens, n_embd] f32), so the test can measure how far
  the logits move between hearth's rows and llama.cpp's (the greedy margin check).

Prompt rendering: llama-mtmd-cli always applies a chat template; it runs with --jinja so it renders
the GGUF's own template (the synthetic model carries smollm2-135m's), as `hearth run` does (without
--jinja llama.cpp 11434 falls back to its built-in chatml, which drops the template's default
system message). Both put the media marker before the prompt ("<__media__>Describe the image.").
The mmproj is F32; hearth reproduces llama.cpp's rows bit for bit with its rules and arithmetic
(hearth run --image-rules llama-cpp-exact; the images' grids have no ties; the test reads the
build's ISA from system_info).

Needs the reference build (scripts/build-llamacpp.sh), the mtmd_vision_dump binary
(scripts/make_vision_fixtures.py compiles it), target/release/hearth, Pillow and numpy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_parity_fixtures as mpf  # noqa: E402  (run, sha256, check)

OUT = ROOT / "tests" / "fixtures" / "vision" / "e2e"
HEARTH = ROOT / "target" / "release" / "hearth"
PROMPT = "Describe the image."
N_PREDICT = 32
TEXT_FLAGS = ["--arch", "muse-glimmer", "--layers", "2", "--dim", "256", "--heads", "4",
              "--kv-heads", "2", "--head-dim", "64", "--ffn", "512", "--window", "16"]
MMPROJ_FLAGS = ["--arch", "muse-glimmer-mmproj", "--layers", "4", "--dim", "64", "--heads", "4",
                "--ffn", "128", "--window", "4", "--adapter", "128,96", "--type", "f32",
                "--projection-dim", "256", "--seed", "11"]
# (name, width, height): a table-sized grid (2x2 cells), a non-square one, one resized over
# several windows. None is a grid tie.
IMAGES = [("square_56x56", 56, 56), ("tall_84x112", 84, 112), ("wide_200x130", 200, 130)]


def make_image(path: Path, w: int, h: int, k: int) -> None:
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127.5 + 127.5 * np.sin(x / (5.0 + k) + y / 9.0)
    g = 127.5 + 127.5 * np.cos(x * y / (300.0 * (k + 1)))
    b = (x * (3 + k) + y * 2) % 256
    Image.fromarray(np.stack([r, g, b], -1).round().clip(0, 255).astype(np.uint8)).save(path)


def main() -> None:
    bin_dir = Path(os.path.expanduser("~/.cache/hearth-ref/build-11434.0.0-cpu/bin"))
    if "--bin-dir" in sys.argv:
        bin_dir = Path(sys.argv[sys.argv.index("--bin-dir") + 1])
    seed = int(sys.argv[sys.argv.index("--text-seed") + 1]) if "--text-seed" in sys.argv else 7
    dump = bin_dir.parent / "vision-dump" / "mtmd_vision_dump"
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/hearth-vision-e2e")
    work.mkdir(exist_ok=True)
    text, mmproj = work / "text.gguf", work / "mmproj.gguf"
    text_flags = TEXT_FLAGS + ["--seed", str(seed)]
    mpf.run([str(HEARTH), "synth", *text_flags, "-o", str(text)])
    mpf.run([str(HEARTH), "synth", *MMPROJ_FLAGS, "-o", str(mmproj)])
    records = []
    for k, (name, w, h) in enumerate(IMAGES):
        img = OUT / f"{name}.png"
        make_image(img, w, h, k)
        cmd = [str(bin_dir / "llama-mtmd-cli"), "-m", str(text), "--mmproj", str(mmproj),
               "--image", str(img), "-p", PROMPT, "--temp", "0", "-n", str(N_PREDICT), "-t", "2",
               "--jinja"]
        out = mpf.run(cmd, env=env).stdout
        # llama-mtmd-cli prints a newline before the reply and after it.
        reply = out.decode("utf-8", errors="surrogateescape")
        mpf.check(reply.startswith("\n"), f"{name}: reply framing {reply[:20]!r}")
        reply = reply[1:].rstrip("\n")
        rows_dir = work / name
        rows_dir.mkdir(exist_ok=True)
        head, rec = [json.loads(line) for line in
                     mpf.run([str(dump), str(text), str(mmproj), str(rows_dir), "-t", "2", str(img)],
                             env=env, text=True).stdout.splitlines()]
        (OUT / f"{name}.embd.f32").write_bytes((rows_dir / "0.embd.f32").read_bytes())
        records.append({"image": img.name, "width": w, "height": h, "n_tokens": rec["n_tokens"],
                        "llama_rows": f"{name}.embd.f32", "llama_mtmd_cli_text": reply,
                        "llama_mtmd_cli_args": ["-p", PROMPT, "--temp", "0", "-n", str(N_PREDICT),
                                                "-t", "2", "--jinja"]})
        print(f"{name}: {rec['n_tokens']} tokens: {reply!r}", file=sys.stderr)
    (OUT / "e2e.json").write_text(json.dumps({
        "about": "llama-mtmd-cli (llama.cpp 11434, native CPU build) greedy replies on synthetic "
                 "files; written by scripts/make_vision_e2e_fixtures.py.",
        "llama_cpp": head,
        "prompt": PROMPT,
        "n_predict": N_PREDICT,
        "text_synth_flags": text_flags,
        "text_sha256": mpf.sha256(text),
        "mmproj_synth_flags": MMPROJ_FLAGS,
        "mmproj_sha256": mpf.sha256(mmproj),
        "images": records,
    }, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
