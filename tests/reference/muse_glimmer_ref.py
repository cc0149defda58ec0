#!/usr/bin/env python3
"""Independent numpy reference of the Muse Glimmer text model as llama.cpp 11434 defines it
(`muse-glimmer`: docs/muse-glimmer-llamacpp.md §1, from src/models/muse-glimmer.cpp), written
from that math, not from hearth's code. It loads a `muse-glimmer` GGUF with gguf-py, runs the
forward pass with its own KV caches, and implements a host sampler (the Muse Glimmer spec's §7).

CLI:
  python3 tests/reference/muse_glimmer_ref.py MODEL.gguf --tokens 1,2,3 [--precision f32|bf16]
      [--chunk N] [--decode-from K] [--kv ring|flat] [--all-positions] [--out logits.npy]
      [--dump acts.npz] [--generate N [--temperature T --top-k K --top-p P --seed S]]

  --precision f32   exact f32 math: f32 weights straight from the dequantizer, f32 activations,
                    f32 KV (default; what hearth's Numerics::F32 is checked against).
  --precision bf16  the same math rounding to bf16 at the old spec's points (weights, norm
                    outputs, every linear's output, q/k, residual and KV): a reduced-precision
                    mode for the cross-path checks in test_muse_glimmer_ref.py.
  --chunk N         prefill in calls of at most N tokens, honoured literally (a non-first ring
                    chunk > W+1 reproduces the 2W ring's quirk, with a warning; > 2W is refused).
                    Default: one call if that is exact (T <= 2W on the ring), else chunks of W.
  --accum f64|f32   how dot products and softmax sums accumulate (default f64, then rounded to
                    f32; see Numerics). f64 makes every row independent of chunking and cache
                    layout, so chunked/one-shot/decode/ring/flat agree bit for bit.
  --decode-from K   prefill tokens[:K] (chunked by --chunk), then feed tokens[K:] one per call.
  --kv ring         a 2W-slot ring per sliding layer with the ring_pos mask, a flat cache per
                    full layer (default).
  --kv flat         every layer gets a flat cache; sliding layers mask by 0 <= q − k < W: the
                    plain sliding-window attention, an oracle for the ring.
  --out F.npy       f32 logits: [V] for the last position, or [T, V] with --all-positions.
                    Without --out a JSON summary goes to stdout (logits included).
  --dump F.npz      every named intermediate (per layer), rows concatenated over calls.
  --generate N      after the prompt, decode up to N tokens (greedy if T <= 0, else sampled
                    with the MT19937/seed_seq RNG).

Hyperparameters come from the `muse-glimmer.*` keys with llama.cpp's defaults and required
keys (attention.layer_norm_rms_epsilon, attention.sliding_window and logit_scale required;
final_logit_softcapping 30 when absent, 0 = off; rope.freq_base 10000, rope.freq_base_swa =
rope.freq_base; attention.sliding_window_pattern a per-layer array or a period, default 4:
layer i slides iff i % n < n − 1). The math (§1.3): gainless RMSNorm of the embeddings; per
layer RMSNorm·g, q/k/v (fused attn_qkv or separate, biases, per-tensor *.scale), per-head
RMSNorm·attn_q_norm / ·attn_k_norm, RoPE (adjacent pairs, base freq_base_swa) on sliding
layers only, attention scaled by 1/sqrt(head_dim) (sliding: the last W positions), output
gated by sigmoid(attn_gate·h), W_o (·scale), RMSNorm(eps 1e-8)·post_attention_norm, residual;
RMSNorm·ffn_norm, SwiGLU, RMSNorm(eps 1e-8)·post_ffw_norm, residual; output RMSNorm, LM head,
·logit_scale, cap·tanh(z/cap).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

# The matrices are tiny; OpenBLAS threads cost ~10x more than they save here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import gguf  # noqa: E402

# ---- constants (llama.cpp muse-glimmer.cpp and llama-hparams) -------------------------------
POST_NORM_EPS = 1e-8                  # post_attention_norm, post_ffw_norm (fixed in the graph)
DEFAULT_SOFT_CAP = 30.0               # final_logit_softcapping when the key is absent
DEFAULT_ROPE_BASE = 10000.0
DEFAULT_PERIOD = 4                    # sliding_window_pattern when the key is absent
MAX_SEQ_LEN = 131072
EOS_IDS = (200001, 200008)            # the released tokenizer's <|eot|>, <|end_of_text|>

ARCH = "muse-glimmer"
SUPPORTED_TYPES = {  # §4.5: at least these; anything else fails loudly
    gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16,
    gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K,
    gguf.GGMLQuantizationType.Q6_K,
}

F32 = np.float32


# ---- numerics ------------------------------------------------------------------------------
def bf16(x) -> np.ndarray:
    """Round-to-nearest-even to bfloat16, returned as f32 values (§0)."""
    x = np.ascontiguousarray(x, dtype=F32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, r)


def _identity(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


class Numerics:
    """Where the forward pass rounds, and how dot products accumulate.

    precision: "bf16" rounds at the spec's points (§3.7); "f32" never rounds.
    accum: "f64" sums every dot product / softmax denominator in f64 and rounds the sum to
      f32. That is the value every f32 accumulation order approximates, and it makes each row
      independent of batch shape and cache layout (chunked, one-shot, ring and flat agree bit
      for bit). "f32" uses numpy/BLAS f32 sums, whose order depends on the shapes.
    """

    def __init__(self, precision: str, accum: str = "f64"):
        if precision not in ("bf16", "f32"):
            raise ValueError(f"precision must be bf16 or f32, got {precision!r}")
        if accum not in ("f64", "f32"):
            raise ValueError(f"accum must be f64 or f32, got {accum!r}")
        self.precision, self.accum = precision, accum
        self.r = bf16 if precision == "bf16" else _identity
        self.acc = np.float64 if accum == "f64" else F32

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b accumulated in self.acc, returned as f32."""
        return np.matmul(a.astype(self.acc), b.astype(self.acc)).astype(F32)


def rms_0(x: np.ndarray, eps: float, nx: Numerics) -> np.ndarray:
    """Scaleless RMSNorm over the last axis, f32 inside, output r(u) (§3.1)."""
    x = x.astype(F32)
    u = x * (F32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps)))
    return nx.r(u)


def rms_w(x: np.ndarray, g: np.ndarray, eps: float, nx: Numerics) -> np.ndarray:
    """Weighted RMSNorm: r(r(u) · g), g already in the activation dtype (§3.1)."""
    return nx.r(rms_0(x, eps, nx) * g)


def linear(x: np.ndarray, w: np.ndarray, nx: Numerics) -> np.ndarray:
    """y = W·x. x: [T, in] (already in the activation dtype), w: [out, in]."""
    return nx.r(nx.matmul(x, w.T))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (F32(1.0) / (F32(1.0) + np.exp(-x.astype(F32)))).astype(F32)


def soft_cap(z: np.ndarray, scale: float, cap: float) -> np.ndarray:
    """The LM head's transforms: z·logit_scale, then cap·tanh(z / cap) unless cap is 0, in f32.

    tanh is evaluated in f64 and rounded, i.e. a correctly rounded f32 tanh (numpy's own f32
    tanh stops at 0.99999994; libm tanhf reaches 1.0, so |logit| can be exactly cap in f32).
    """
    z = np.asarray(z, dtype=F32) * F32(scale)
    if cap == 0:
        return z.astype(F32)
    return (F32(cap) * np.tanh((z / F32(cap)).astype(np.float64)).astype(F32)).astype(F32)


def rope_inv_freq(head_dim: int, base: float) -> np.ndarray:
    """inv_freq_j = 1 / base^(2j/head_dim), j = 0..head_dim/2−1, in f32."""
    j2 = np.arange(0, head_dim, 2, dtype=F32)
    return (F32(1.0) / np.power(F32(base), j2 / F32(head_dim))).astype(F32)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, nx: Numerics) -> np.ndarray:
    """Interleaved adjacent-pair RoPE (ggml NORMAL, not NEOX). x: [T, heads, head_dim]."""
    theta = positions.astype(F32)[:, None] * inv_freq[None, :]          # [T, head_dim/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]      # [T, 1, head_dim/2]
    x0, x1 = x[..., 0::2].astype(F32), x[..., 1::2].astype(F32)
    out = np.empty_like(x, dtype=F32)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return nx.r(out)


# ---- layer schedule ------------------------------------------------------------------------
def sliding_by_period(n_layers: int, period: int = DEFAULT_PERIOD) -> list[bool]:
    """llama.cpp's set_swa_pattern(n): layer i slides iff n == 0 or i % n < n − 1, counted from
    the first layer (default period 4: S S S F S S S F ...)."""
    return [period == 0 or i % period < period - 1 for i in range(n_layers)]


# ---- §5 masks ------------------------------------------------------------------------------
def ring_pos(n_written: int, n_slots: int) -> np.ndarray:
    """§5.2: position believed to be in slot j after N writes (floor division; < 0 = empty)."""
    j = np.arange(n_slots, dtype=np.int64)
    return j + ((n_written - 1 - j) // n_slots) * n_slots


def ring_mask(q_positions: np.ndarray, n_written: int, n_slots: int, window: int) -> np.ndarray:
    """[T, n_slots] bool: attend(q, j) iff ring_pos(j) >= 0 and 0 <= q − ring_pos(j) < W."""
    rp = ring_pos(n_written, n_slots)
    d = q_positions.astype(np.int64)[:, None] - rp[None, :]
    return (rp[None, :] >= 0) & (d >= 0) & (d < window)


def flat_mask(q_positions: np.ndarray, kv_len: int, window: int = 0) -> np.ndarray:
    """[T, kv_len] bool: attend iff k <= q (and q − k < window when window > 0)."""
    k = np.arange(kv_len, dtype=np.int64)[None, :]
    q = q_positions.astype(np.int64)[:, None]
    m = k <= q
    if window > 0:
        m &= (q - k) < window
    return m


# ---- §7 sampler ----------------------------------------------------------------------------
def greedy(logits: np.ndarray) -> int:
    """§7.2: argmax, lowest index on ties."""
    return int(np.argmax(logits))


def _order_desc(logits: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """idx sorted by logit descending, ties by lower index (−0 == +0 under float compare)."""
    vals = logits[idx].astype(np.float64)
    return idx[np.lexsort((idx, -vals))]


def sampling_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """§7.3 probability vector for T > 0 (temperature → top-k → top-p → renormalise)."""
    l = np.asarray(logits, dtype=F32)
    v = l.shape[0]
    if not temperature > 0:
        raise ValueError("sampling_probs needs temperature > 0 (T <= 0 is greedy, §7.2)")
    kept = np.arange(v)
    if 0 < top_k < v:
        kept = np.sort(_order_desc(l, kept)[:top_k])
    m = l[kept].max()
    w = np.zeros(v, dtype=F32)
    w[kept] = np.exp((l[kept] - m) / F32(temperature)).astype(F32)
    s = float(np.sum(w[kept].astype(np.float64)))
    if top_p < 1.0:
        threshold = float(F32(top_p)) * s
        a = 0.0
        keep = []
        for i in _order_desc(l, kept):
            a += float(w[i])
            keep.append(i)
            if not a < threshold:
                break
        p = np.zeros(v, dtype=F32)
        p[keep] = w[keep] / F32(a)
        return p
    return (w / F32(s)).astype(F32)


def categorical(p: np.ndarray, r: float) -> int:
    """§7.4: first i with f32 cumulative sum >= r, else V−1."""
    cum = F32(0.0)
    r = F32(r)
    for i, pi in enumerate(p.astype(F32)):
        cum = F32(cum + pi)
        if cum >= r:
            return i
    return len(p) - 1


class StdMt19937:
    """§7.5: 32-bit MT19937 seeded by C++ std::seed_seq{seed & 0xFFFFFFFF, seed >> 32}."""

    N, M = 624, 397

    def __init__(self, seed: int):
        if seed == 0:
            raise ValueError("seed 0 means nondeterministic; pass a nonzero seed for the reference")
        self.mt = self._seed_seq([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], self.N)
        if (self.mt[0] & 0x80000000) == 0 and not any(self.mt[1:]):
            self.mt[0] = 0x80000000
        self.idx = self.N

    @staticmethod
    def _seed_seq(v, n):
        mask = 0xFFFFFFFF
        s = len(v)
        t = 11 if n >= 623 else (7 if n >= 68 else (5 if n >= 39 else (3 if n >= 7 else (n - 1) // 2)))
        p, q = (n - t) // 2, (n - t) // 2 + t
        b = [0x8B8B8B8B] * n

        def tf(x):
            return x ^ (x >> 27)

        m = max(s + 1, n)
        for k in range(m):
            r1 = (1664525 * tf(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n])) & mask
            r2 = (r1 + (s if k == 0 else (k % n + v[k - 1] if k <= s else k % n))) & mask
            b[(k + p) % n] = (b[(k + p) % n] + r1) & mask
            b[(k + q) % n] = (b[(k + q) % n] + r2) & mask
            b[k % n] = r2
        for k in range(m, m + n):
            kk = k % n
            r3 = (1566083941 * tf((b[kk] + b[(k + p) % n] + b[(k - 1) % n]) & mask)) & mask
            r4 = (r3 - kk) & mask
            b[(k + p) % n] ^= r3
            b[(k + q) % n] ^= r4
            b[kk] = r4
        return b

    def next_u32(self) -> int:
        n, m, mt = self.N, self.M, self.mt
        if self.idx >= n:
            for k in range(n):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % n] & 0x7FFFFFFF)
                mt[k] = mt[(k + m) % n] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.idx = 0
        y = mt[self.idx]
        self.idx += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF

    def uniform_f32(self) -> float:
        """libstdc++ generate_canonical<float>: f32(x) / 2^32, clamped below 1."""
        u = F32(self.next_u32()) / F32(4294967296.0)
        if u >= F32(1.0):
            u = np.nextafter(F32(1.0), F32(0.0))
        return float(u)


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: StdMt19937 | None) -> int:
    if not temperature > 0:
        return greedy(logits)  # no RNG draw consumed
    return categorical(sampling_probs(logits, temperature, top_k, top_p), rng.uniform_f32())


# ---- §4 GGUF loading -----------------------------------------------------------------------
class Config:
    def __init__(self, n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, window,
                 sliding, eps, logit_scale, soft_cap, rope_base_swa):
        self.n_layers, self.dim, self.ffn_dim, self.vocab = n_layers, dim, ffn_dim, vocab
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.window, self.eps = window, eps
        self.logit_scale, self.soft_cap, self.rope_base_swa = logit_scale, soft_cap, rope_base_swa
        self.windows = [window if s else 0 for s in sliding]   # 0 = full attention
        self.rope = list(sliding)                              # RoPE on sliding layers only

    def __repr__(self):
        return (f"Config(n_layers={self.n_layers}, dim={self.dim}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, ffn_dim={self.ffn_dim}, "
                f"vocab={self.vocab}, window={self.window}, eps={self.eps}, "
                f"logit_scale={self.logit_scale}, soft_cap={self.soft_cap}, "
                f"rope_base_swa={self.rope_base_swa}, "
                f"full_layers={[i for i, w in enumerate(self.windows) if w == 0]})")


# GGUF suffix -> role. Every tensor of a file must be one of these (or one llama.cpp loads and
# never applies, _UNUSED): llama.cpp refuses files with tensors it has no place for.
_LAYER_ROLES = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
    "attn_v.weight": "wv", "attn_qkv.weight": "wqkv", "attn_q.bias": "bq", "attn_k.bias": "bk",
    "attn_v.bias": "bv", "attn_qkv.bias": "bqkv", "attn_q.scale": "sq", "attn_k.scale": "sk",
    "attn_v.scale": "sv", "attn_qkv.scale": "sqkv", "attn_output.scale": "so",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm", "attn_gate.weight": "wog",
    "attn_output.weight": "wo", "post_attention_norm.weight": "post_attn_norm",
    "ffn_norm.weight": "ffn_norm", "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down", "post_ffw_norm.weight": "post_ffn_norm",
}
_UNUSED = re.compile(r"(attn_gate|ffn_gate|ffn_up|ffn_down)\.scale|\w+\.input_scale")
_REQUIRED = {"attn_norm", "wo", "q_norm", "k_norm", "wog", "post_attn_norm", "ffn_norm", "w_gate",
             "w_up", "w_down", "post_ffn_norm"}


def _meta(reader: gguf.GGUFReader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    v = f.contents()
    return v


def _required(reader, key):
    v = _meta(reader, key)
    if v is None:
        raise ValueError(f"key not found in model: {key}")
    return v


class Model:
    """Immutable weights (in the activation dtype) plus the derived config."""

    def __init__(self, path: str, precision: str = "f32", head_dim: int | None = None,
                 window: int | None = None, accum: str = "f64"):
        self.nx = Numerics(precision, accum)
        reader = gguf.GGUFReader(path)
        arch = _meta(reader, "general.architecture")
        if arch != ARCH:
            raise ValueError(f"general.architecture is {arch!r}, expected {ARCH!r}")
        self.tensor_types = {}
        raw = {}
        layers: dict[int, dict] = {}
        self.unused = []
        for t in reader.tensors:
            name = t.name
            m = re.fullmatch(r"blk\.(\d+)\.(\w+\.\w+)", name)
            if m and m.group(2) in _LAYER_ROLES:
                layers.setdefault(int(m.group(1)), {})[_LAYER_ROLES[m.group(2)]] = t
            elif m and _UNUSED.fullmatch(m.group(2)):
                self.unused.append(name)
                continue
            elif name in ("token_embd.weight", "output.weight", "output_norm.weight"):
                raw[name] = t
            else:
                raise ValueError(f"unexpected tensor {name}: not part of the muse-glimmer layout")
            if t.tensor_type not in SUPPORTED_TYPES:
                raise ValueError(f"{name}: unsupported tensor type {t.tensor_type.name}")
            self.tensor_types[name] = t.tensor_type.name

        for need in ("token_embd.weight", "output.weight", "output_norm.weight"):
            if need not in raw:
                raise ValueError(f"missing tensor {need}")
        n_layers = int(_required(reader, f"{ARCH}.block_count"))
        if sorted(layers) != list(range(n_layers)):
            raise ValueError(f"layer indices are not 0..{n_layers - 1}: {sorted(layers)}")
        for i, slot in layers.items():
            qkv = {"wqkv"} if "wqkv" in slot else {"wq", "wk", "wv"}
            missing = (_REQUIRED | qkv) - set(slot)
            if missing:
                raise ValueError(f"layer {i} lacks {sorted(missing)}")

        # Shapes: GGUF ne = [in, out]; logical [out, in].
        def shape(t):
            return tuple(int(n) for n in reversed(t.shape))

        vocab, dim = shape(raw["token_embd.weight"])
        if int(_required(reader, f"{ARCH}.embedding_length")) != dim:
            raise ValueError("embedding_length differs from token_embd's width")
        n_heads = int(_required(reader, f"{ARCH}.attention.head_count"))
        n_kv = int(_meta(reader, f"{ARCH}.attention.head_count_kv") or n_heads)
        hd = head_dim or int(_meta(reader, f"{ARCH}.attention.key_length") or dim // n_heads)
        ffn = int(_required(reader, f"{ARCH}.feed_forward_length"))
        win = window or int(_required(reader, f"{ARCH}.attention.sliding_window"))
        eps = float(_required(reader, f"{ARCH}.attention.layer_norm_rms_epsilon"))
        logit_scale = float(_required(reader, f"{ARCH}.logit_scale"))
        cap = _meta(reader, f"{ARCH}.final_logit_softcapping")
        cap = DEFAULT_SOFT_CAP if cap is None else float(cap)
        base = float(_meta(reader, f"{ARCH}.rope.freq_base") or DEFAULT_ROPE_BASE)
        base_swa = _meta(reader, f"{ARCH}.rope.freq_base_swa")
        base_swa = base if base_swa is None else float(base_swa)
        pattern = _meta(reader, f"{ARCH}.attention.sliding_window_pattern")
        if pattern is None or np.isscalar(pattern):
            sliding = sliding_by_period(n_layers, DEFAULT_PERIOD if pattern is None else int(pattern))
        else:
            sliding = [bool(x) for x in pattern]
            if len(sliding) != n_layers:
                raise ValueError(f"sliding_window_pattern has {len(sliding)} entries for {n_layers} layers")
        cfg = Config(n_layers, dim, n_heads, n_kv, hd, ffn, vocab, win, sliding, eps, logit_scale,
                     cap, base_swa)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"n_heads {cfg.n_heads} not a multiple of n_kv_heads {cfg.n_kv_heads}")
        self.cfg = cfg
        q_dim, kv_dim = n_heads * hd, n_kv * hd

        expect = {"wq": (q_dim, dim), "wk": (kv_dim, dim), "wv": (kv_dim, dim),
                  "wqkv": (q_dim + 2 * kv_dim, dim), "bq": (q_dim,), "bk": (kv_dim,), "bv": (kv_dim,),
                  "bqkv": (q_dim + 2 * kv_dim,), "sq": (1,), "sk": (1,), "sv": (1,), "sqkv": (1,),
                  "so": (1,), "q_norm": (hd,), "k_norm": (hd,), "wog": (q_dim, dim),
                  "wo": (dim, q_dim), "w_gate": (ffn, dim), "w_up": (ffn, dim), "w_down": (dim, ffn),
                  "attn_norm": (dim,), "post_attn_norm": (dim,), "ffn_norm": (dim,), "post_ffn_norm": (dim,)}
        for i, slot in layers.items():
            for role, t in slot.items():
                if shape(t) != expect[role]:
                    raise ValueError(f"{t.name}: shape {shape(t)}, expected {expect[role]}")
        if shape(raw["output.weight"]) != (vocab, dim):
            raise ValueError(f"output.weight: shape {shape(raw['output.weight'])}, expected {(vocab, dim)}")
        if shape(raw["output_norm.weight"]) != (dim,):
            raise ValueError(f"output_norm.weight: shape {shape(raw['output_norm.weight'])}")

        r = self.nx.r
        # Weights: dequantized to f32 (gguf-py), then rounded to the activation dtype. Gains as
        # stored (the converter already folded Muse Glimmer's +1 into them).
        self.tok_embd = raw["token_embd.weight"]          # looked up lazily, row by row
        self.output = r(self._deq(raw["output.weight"]))
        self.output_norm = r(self._deq(raw["output_norm.weight"]))
        self.layers = []
        for i in range(n_layers):
            lw = {role: self._deq(t) for role, t in layers[i].items()}
            # A fused attn_qkv is the three matrices stacked (q rows, then k, then v); with it,
            # separate biases count only when all three exist (llama.cpp build_qkv).
            if "wqkv" in lw:
                w, s = lw.pop("wqkv"), lw.pop("sqkv", None)
                lw["wq"], lw["wk"], lw["wv"] = w[:q_dim], w[q_dim:q_dim + kv_dim], w[q_dim + kv_dim:]
                for k in ("sq", "sk", "sv"):
                    lw.pop(k, None)
                if s is not None:
                    lw["sq"] = lw["sk"] = lw["sv"] = s
                if "bqkv" in lw:
                    b = lw.pop("bqkv")
                    lw["bq"], lw["bk"], lw["bv"] = b[:q_dim], b[q_dim:q_dim + kv_dim], b[q_dim + kv_dim:]
                elif not all(k in lw for k in ("bq", "bk", "bv")):
                    for k in ("bq", "bk", "bv"):
                        lw.pop(k, None)
            self.layers.append({role: (v if role[0] in "sb" and role != "bqkv" else r(v))
                                for role, v in lw.items()})

    @staticmethod
    def _deq(t, rows=None) -> np.ndarray:
        data = t.data if rows is None else t.data[rows]
        return np.asarray(gguf.quants.dequantize(data, t.tensor_type), dtype=F32)

    def embed_rows(self, tokens: np.ndarray) -> np.ndarray:
        """E[token] in the activation dtype, dequantizing only the requested rows."""
        if np.any(tokens < 0) or np.any(tokens >= self.cfg.vocab):
            raise ValueError(f"token id out of range [0, {self.cfg.vocab})")
        return self.nx.r(self._deq(self.tok_embd, tokens))


# ---- §5 KV cache / per-sequence state ------------------------------------------------------
class State:
    """Per-sequence state: position counter and per-layer K/V buffers [n_kv_heads, slots, head_dim].

    kv="ring": 2W-slot ring on sliding layers, flat max_seq_len cache on global layers (§5).
    kv="flat": flat caches everywhere; sliding layers mask by position distance (the oracle).
    """

    def __init__(self, model: Model, kv: str = "ring", max_seq_len: int = MAX_SEQ_LEN):
        cfg = model.cfg
        if kv not in ("ring", "flat"):
            raise ValueError(f"kv must be ring or flat, got {kv!r}")
        self.kv, self.max_seq_len, self.pos = kv, max_seq_len, 0
        self.k, self.v, self.ring = [], [], []
        for w in cfg.windows:
            ring = kv == "ring" and w > 0
            slots = 2 * w if ring else max_seq_len
            self.ring.append(ring)
            self.k.append(np.zeros((cfg.n_kv_heads, slots, cfg.head_dim), F32))
            self.v.append(np.zeros((cfg.n_kv_heads, slots, cfg.head_dim), F32))


# ---- §3 forward ----------------------------------------------------------------------------
def attention(q, k_cache, v_cache, mask, group, nx):
    """q: [T, H, hd]; caches: [KVH, S, hd]; mask: [T, S]. Returns r(P·V) as [T, H, hd]."""
    kv_of_head = np.arange(q.shape[1]) // group                    # query head h -> KV head ⌊h/group⌋
    k = k_cache[kv_of_head]                                         # [H, S, hd]
    v = v_cache[kv_of_head]
    scale = F32(1.0) / np.sqrt(F32(q.shape[-1]))                     # 1/sqrt(head_dim)
    scores = nx.matmul(q.transpose(1, 0, 2), k.transpose(0, 2, 1)) * scale  # [H, T, S]
    scores = np.where(mask[None], scores, F32(-np.inf))
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores, dtype=F32)                                  # softmax in f32
    p = p / p.sum(-1, keepdims=True, dtype=nx.acc).astype(F32)
    y = nx.matmul(p, v)                                             # [H, T, hd]
    return nx.r(y.transpose(1, 0, 2))


def forward(model: Model, st: State, tokens, trace: dict | None = None) -> np.ndarray:
    """One call: T new tokens at positions st.pos .. st.pos+T−1. Returns soft-capped f32 logits [T, V]."""
    cfg, nx = model.cfg, model.nx
    r = nx.r
    tokens = np.asarray(tokens, dtype=np.int64)
    t_new = len(tokens)
    if t_new == 0:
        raise ValueError("empty token list")
    p0 = st.pos
    n_written = p0 + t_new
    if n_written > st.max_seq_len:
        raise ValueError(f"positions up to {n_written - 1} exceed max_seq_len {st.max_seq_len}")
    positions = np.arange(p0, n_written, dtype=np.int64)
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_base_swa)   # RoPE runs on sliding layers only
    group = cfg.n_heads // cfg.n_kv_heads
    eps = cfg.eps

    def rec(name, x):
        if trace is not None:
            trace.setdefault(name, []).append(np.array(x, dtype=F32))

    # §5.2: masks computed once per call, shared by all layers of a kind.
    masks = {}
    for i, w in enumerate(cfg.windows):
        key = ("ring", w) if st.ring[i] else ("flat", w)
        if key not in masks:
            masks[key] = (ring_mask(positions, n_written, 2 * w, w) if st.ring[i]
                          else flat_mask(positions, n_written, w))

    # Embedding: gainless RMSNorm of the looked-up rows.
    x = r(rms_0(model.embed_rows(tokens), eps, nx))                # [T, D], the residual stream
    rec("embd", x)

    def proj(h, lw, w, s=None, b=None):
        """W·h (·scale, + bias): a scale multiplies the product before the bias is added."""
        y = nx.matmul(h, lw[w].T)
        if s in lw:
            y = y * F32(lw[s][0])
        if b in lw:
            y = y + lw[b]
        return r(y)

    for i, lw in enumerate(model.layers):
        # attention
        h = rms_w(x, lw["attn_norm"], eps, nx)
        q = proj(h, lw, "wq", "sq", "bq").reshape(t_new, cfg.n_heads, cfg.head_dim)
        k = proj(h, lw, "wk", "sk", "bk").reshape(t_new, cfg.n_kv_heads, cfg.head_dim)
        v = proj(h, lw, "wv", "sv", "bv").reshape(t_new, cfg.n_kv_heads, cfg.head_dim)
        o = proj(h, lw, "wog").reshape(t_new, cfg.n_heads, cfg.head_dim)
        q = rms_w(q, lw["q_norm"], eps, nx)                           # per-head QK-norm with gains
        k = rms_w(k, lw["k_norm"], eps, nx)
        if cfg.rope[i]:
            q = rope(q, positions, inv_freq, nx)
            k = rope(k, positions, inv_freq, nx)
        rec(f"blk.{i}.attn_norm", h)
        rec(f"blk.{i}.q", q.reshape(t_new, -1))
        rec(f"blk.{i}.k", k.reshape(t_new, -1))
        rec(f"blk.{i}.v", v.reshape(t_new, -1))
        rec(f"blk.{i}.og", o.reshape(t_new, -1))

        # §5: write before reading; ring slot = p mod 2W, flat slot = p.
        kc, vc = st.k[i], st.v[i]
        slots = positions % kc.shape[1] if st.ring[i] else positions
        kc[:, slots] = k.transpose(1, 0, 2)
        vc[:, slots] = v.transpose(1, 0, 2)
        if st.ring[i]:
            mask = masks[("ring", cfg.windows[i])]
            y = attention(q, kc, vc, mask, group, nx)
        else:
            mask = masks[("flat", cfg.windows[i])]
            y = attention(q, kc[:, :n_written], vc[:, :n_written], mask, group, nx)  # kv_len bound
        y = r(sigmoid(o) * y)                                         # output gate
        a = proj(y.reshape(t_new, -1), lw, "wo", "so")
        rec(f"blk.{i}.attn_gated", y.reshape(t_new, -1))
        rec(f"blk.{i}.attn_out", a)
        x = r(x + rms_w(a, lw["post_attn_norm"], POST_NORM_EPS, nx))
        rec(f"blk.{i}.resid_attn", x)

        # MLP. The product silu(g)·u is rounded once, as the input of W_down.
        h = rms_w(x, lw["ffn_norm"], eps, nx)
        g = linear(h, lw["w_gate"], nx)
        u = linear(h, lw["w_up"], nx)
        act = r(g * sigmoid(g) * u)
        m = linear(act, lw["w_down"], nx)
        rec(f"blk.{i}.ffn_norm", h)
        rec(f"blk.{i}.ffn_act", act)
        rec(f"blk.{i}.ffn_out", m)
        x = r(x + rms_w(m, lw["post_ffn_norm"], POST_NORM_EPS, nx))
        rec(f"blk.{i}.resid_ffn", x)

    # output head, logit scale and soft-cap
    hn = rms_w(x, model.output_norm, eps, nx)
    z = linear(hn, model.output, nx)
    logits = soft_cap(z, cfg.logit_scale, cfg.soft_cap)
    rec("output_norm", hn)
    rec("z", z)
    rec("logits", logits)
    st.pos = n_written
    return logits


# ---- sequence drivers ----------------------------------------------------------------------
def exact_chunk_limit(window: int, first: bool) -> int:
    """§5.3: largest chunk for which the 2W ring gives the exact sliding-window result."""
    return 2 * window if first else window + 1


def default_chunk(model: Model, st: State, n_tokens: int) -> int:
    """One call when that is exact (§5.3), else chunks of W (the spec's recommended cap)."""
    if st.kv == "flat" or not any(model.cfg.windows):
        return n_tokens
    w = model.cfg.window
    return n_tokens if n_tokens <= exact_chunk_limit(w, st.pos == 0) else w


def prefill(model: Model, st: State, tokens, chunk: int | None = None, trace: dict | None = None) -> np.ndarray:
    """Feeds tokens in calls of at most `chunk` (None = default_chunk). Returns logits [T, V].

    An explicit chunk is honoured literally, including the §5.3 quirk (with a warning).
    A ring chunk > 2W is refused: it overwrites the query's own key, leaving rows with no key.
    """
    tokens = list(tokens)
    chunk = chunk or default_chunk(model, st, len(tokens))
    rows = []
    for s in range(0, len(tokens), chunk):
        part = tokens[s:s + chunk]
        if st.kv == "ring" and any(model.cfg.windows):
            w = model.cfg.window
            if len(part) > 2 * w:
                raise ValueError(f"chunk of {len(part)} exceeds the ring size 2W = {2 * w} (§5.3)")
            lim = exact_chunk_limit(w, st.pos == 0)
            if len(part) > lim:
                print(f"warning: chunk of {len(part)} at pos {st.pos} exceeds {lim}: the 2W ring drops "
                      f"part of the window for its first queries (§5.3)", file=sys.stderr)
        rows.append(forward(model, st, part, trace))
    return np.concatenate(rows, axis=0)


def run_sequence(model: Model, tokens, chunk=None, decode_from=None, kv="ring", max_seq_len=None,
                 trace: dict | None = None) -> np.ndarray:
    """Logits for every position of `tokens`: prefill tokens[:decode_from] then decode one by one."""
    tokens = list(tokens)
    st = State(model, kv, max_seq_len or len(tokens))
    k = len(tokens) if decode_from is None else decode_from
    rows = []
    if k > 0:
        rows.append(prefill(model, st, tokens[:k], chunk, trace))
    for t in tokens[k:]:
        rows.append(forward(model, st, [t], trace))
    return np.concatenate(rows, axis=0)


def generate(model: Model, prompt, n, chunk=None, kv="ring", temperature=0.0, top_k=0, top_p=1.0,
             seed=1, eos=EOS_IDS, max_seq_len=None):
    """§6.3–6.4 minus detokenization: returns the generated ids (an EOS is returned, never fed)."""
    st = State(model, kv, max_seq_len or (len(prompt) + n))
    rng = StdMt19937(seed) if temperature > 0 else None
    pending = sample(prefill(model, st, prompt, chunk)[-1], temperature, top_k, top_p, rng)
    out = []
    for _ in range(n):
        tok = pending
        out.append(tok)
        if tok in eos or len(out) == n:
            break
        pending = sample(forward(model, st, [tok])[-1], temperature, top_k, top_p, rng)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--decode-from", type=int, default=None)
    ap.add_argument("--accum", choices=["f64", "f32"], default="f64")
    ap.add_argument("--kv", choices=["ring", "flat"], default="ring")
    ap.add_argument("--max-seq-len", type=int, default=None,
                    help="flat cache slots (default: just enough for the run; the math is the same)")
    ap.add_argument("--head-dim", type=int, default=None, help="override the key_length metadata")
    ap.add_argument("--window", type=int, default=None, help="override the sliding_window metadata")
    ap.add_argument("--all-positions", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--generate", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)

    tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    if not tokens:
        ap.error("--tokens is empty")
    model = Model(a.model, a.precision, a.head_dim, a.window, a.accum)
    print(model.cfg, file=sys.stderr)
    trace = {} if a.dump else None
    logits = run_sequence(model, tokens, a.chunk, a.decode_from, a.kv, a.max_seq_len, trace)
    if a.dump:
        np.savez(a.dump, **{k: np.concatenate(v, axis=0) for k, v in trace.items()})
    result = logits if a.all_positions else logits[-1]
    summary = {"config": repr(model.cfg), "precision": a.precision, "accum": a.accum, "n_tokens": len(tokens),
               "argmax": [int(i) for i in np.argmax(logits, axis=-1)]}
    if a.generate:
        summary["generated"] = generate(model, tokens, a.generate, a.chunk, a.kv, a.temperature,
                                        a.top_k, a.top_p, a.seed,
                                        max_seq_len=a.max_seq_len or len(tokens) + a.generate)
    if a.out:
        np.save(a.out, result.astype(F32))
        print(json.dumps(summary))
    else:
        summary["logits"] = result.tolist()
        print(json.dumps(summary))


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # bad file or bad input: say what, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
