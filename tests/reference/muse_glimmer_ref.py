#!/usr/bin/env python3
"""Independent numpy reference of the Muse Glimmer text model (spec: muse-glimmer-model.md).

Written from the spec only. It loads a `muse_glimmer` GGUF with gguf-py, runs the §3 forward
pass with the §5 KV caches, and implements the §7.2–7.5 host sampler.

CLI:
  python3 tests/reference/muse_glimmer_ref.py MODEL.gguf --tokens 1,2,3 [--precision bf16|f32]
      [--chunk N] [--decode-from K] [--kv ring|flat] [--all-positions] [--out logits.npy]
      [--dump acts.npz] [--generate N [--temperature T --top-k K --top-p P --seed S]]

  --precision bf16  the spec's rounding points (§3.1–3.7): weights dequantized to f32 then
                    rounded to bf16, norm gains rounded to bf16, every linear takes bf16 inputs,
                    accumulates in f32 and rounds its output to bf16; norms, RoPE, softmax and
                    the soft-cap compute in f32 and round where §3 says; residual and KV in bf16.
  --precision f32   the same math with every rounding removed (f32 weights straight from the
                    dequantizer, f32 activations, f32 KV).
  --chunk N         prefill in calls of at most N tokens, honoured literally (a non-first ring
                    chunk > W+1 reproduces the §5.3 quirk, with a warning; > 2W is refused).
                    Default: one call if that is exact (T <= 2W on the ring), else chunks of W.
  --accum f64|f32   how dot products and softmax sums accumulate (default f64, then rounded to
                    f32; see Numerics). f64 makes every row independent of chunking and cache
                    layout, so chunked/one-shot/decode/ring/flat agree bit for bit.
  --decode-from K   prefill tokens[:K] (chunked by --chunk), then feed tokens[K:] one per call.
  --kv ring         §5 literally: 2W-slot ring per sliding layer with the ring_pos mask, flat
                    cache per global layer (default).
  --kv flat         every layer gets a flat cache; sliding layers mask by 0 <= q − k < W. This
                    is the "mathematically intended" result of §5.3, an oracle for the ring.
  --out F.npy       f32 logits: [V] for the last position, or [T, V] with --all-positions.
                    Without --out a JSON summary goes to stdout (logits included).
  --dump F.npz      every named intermediate (per layer), rows concatenated over calls.
  --generate N      after the prompt, decode up to N tokens (§6.3–6.4: greedy if T <= 0, else
                    §7.3 probabilities, §7.4 draw with the §7.5 MT19937/seed_seq RNG).

Hyperparameters are the spec's constants (§1). Shapes come from the tensors, so the small
synthetic models load too: head_dim from `muse_glimmer.attention.key_length` (else 128) and
the window from `muse_glimmer.attention.sliding_window` (else 2048).
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

# ---- §1 constants -------------------------------------------------------------------------
NORM_EPS = 1e-5                       # pre-norms, QK-norm, embedding norm, output norm
POST_NORM_EPS = 1e-8                  # post_attn_norm, post_ffn_norm
ROPE_THETA = 500000.0                 # sliding layers only
ATTN_SCALE = 0.3420629053992187       # 43.7840518911 / 128; replaces 1/sqrt(head_dim)
OUTPUT_MULTIPLIER = 0.19611613513
OUTPUT_SOFT_CAP = 20.0
NOPE_EVERY = 4                        # every_n_layers_nope; pattern [W, W, W, 0]
DEFAULT_HEAD_DIM = 128
DEFAULT_WINDOW = 2048
MAX_SEQ_LEN = 131072
EOS_IDS = (200001, 200008)            # §6.2; <|eom|> (200007) is deliberately not EOS

ARCH = "muse_glimmer"
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


def soft_cap(z: np.ndarray) -> np.ndarray:
    """§3.6: 20·tanh(f32(z) · 0.19611613513 / 20), in f32.

    tanh is evaluated in f64 and rounded, i.e. a correctly rounded f32 tanh (numpy's own f32
    tanh stops at 0.99999994; libm tanhf reaches 1.0, so |logit| can be exactly 20.0 in f32).
    """
    z = np.asarray(z, dtype=F32)
    arg = z * F32(OUTPUT_MULTIPLIER) / F32(OUTPUT_SOFT_CAP)
    return (F32(OUTPUT_SOFT_CAP) * np.tanh(arg.astype(np.float64)).astype(F32)).astype(F32)


def rope_inv_freq(head_dim: int) -> np.ndarray:
    """§3.4.4: inv_freq_j = 1 / 500000^(2j/head_dim), j = 0..head_dim/2−1, in f32."""
    j2 = np.arange(0, head_dim, 2, dtype=F32)
    return (F32(1.0) / np.power(F32(ROPE_THETA), j2 / F32(head_dim))).astype(F32)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, nx: Numerics) -> np.ndarray:
    """Interleaved adjacent-pair RoPE (ggml NORMAL, not NEOX). x: [T, heads, head_dim]."""
    theta = positions.astype(F32)[:, None] * inv_freq[None, :]          # [T, head_dim/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]      # [T, 1, head_dim/2]
    x0, x1 = x[..., 0::2].astype(F32), x[..., 1::2].astype(F32)
    out = np.empty_like(x, dtype=F32)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return nx.r(out)


# ---- §2 layer schedule ---------------------------------------------------------------------
def use_rope(i: int, n_layers: int) -> bool:
    return (n_layers - i - 1) % NOPE_EVERY != 0


def layer_window(i: int, n_layers: int, window: int = DEFAULT_WINDOW) -> int:
    """window(i) = pattern[(i + 4 − (n_layers mod 4)) mod 4], pattern = [W, W, W, 0]; 0 = global."""
    pattern = [window, window, window, 0]
    return pattern[(i + 4 - (n_layers % 4)) % 4]


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
    def __init__(self, n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, window):
        self.n_layers, self.dim, self.ffn_dim, self.vocab = n_layers, dim, ffn_dim, vocab
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.window = window
        self.windows = [layer_window(i, n_layers, window) for i in range(n_layers)]
        self.rope = [use_rope(i, n_layers) for i in range(n_layers)]
        for i in range(n_layers):
            assert self.rope[i] == (self.windows[i] > 0), f"layer {i}: RoPE and window flags disagree (§2)"

    def __repr__(self):
        return (f"Config(n_layers={self.n_layers}, dim={self.dim}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, ffn_dim={self.ffn_dim}, "
                f"vocab={self.vocab}, window={self.window}, "
                f"global_layers={[i for i, w in enumerate(self.windows) if w == 0]})")


_LAYER_ROLES = {  # GGUF suffix -> role (§4.2, §4.3 alias)
    "attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
    "attn_gate": "wog", "attn_output_gate": "wog", "attn_output": "wo",
    "post_attention_norm": "post_attn_norm", "ffn_norm": "ffn_norm", "ffn_gate": "w_gate",
    "ffn_up": "w_up", "ffn_down": "w_down", "post_ffw_norm": "post_ffn_norm",
}
_NORM_ROLES = {"attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm"}


def _meta_int(reader: gguf.GGUFReader, key: str):
    f = reader.fields.get(key)
    return None if f is None else int(f.contents())


class Model:
    """Immutable weights (in the activation dtype) plus the derived config."""

    def __init__(self, path: str, precision: str = "bf16", head_dim: int | None = None,
                 window: int | None = None, accum: str = "f64"):
        self.nx = Numerics(precision, accum)
        reader = gguf.GGUFReader(path)
        arch = reader.fields.get("general.architecture")
        if arch is not None and arch.contents() != ARCH:
            print(f"warning: general.architecture is {arch.contents()!r}, expected {ARCH!r}", file=sys.stderr)
        self.tensor_types = {}
        raw = {}
        layers: dict[int, dict] = {}
        self.ignored = []
        for t in reader.tensors:
            name = t.name
            if "attn_q_norm" in name or "attn_k_norm" in name or name == "rope_freqs.weight":
                self.ignored.append(name)
                continue
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
            if m and m.group(2) in _LAYER_ROLES:
                role = _LAYER_ROLES[m.group(2)]
                slot = layers.setdefault(int(m.group(1)), {})
                if role in slot:
                    raise ValueError(f"{name}: layer {m.group(1)} has two tensors for {role} "
                                     f"(attn_gate and attn_output_gate both present?)")
                slot[role] = t
            elif name in ("token_embd.weight", "output.weight", "output_norm.weight"):
                raw[name] = t
            else:
                self.ignored.append(name)
                continue
            if t.tensor_type not in SUPPORTED_TYPES:
                raise ValueError(f"{name}: unsupported tensor type {t.tensor_type.name}")
            self.tensor_types[name] = t.tensor_type.name

        for need in ("token_embd.weight", "output.weight", "output_norm.weight"):
            if need not in raw:
                raise ValueError(f"missing tensor {need}")
        n_layers = len(layers)
        if sorted(layers) != list(range(n_layers)):
            raise ValueError(f"layer indices are not 0..{n_layers - 1}: {sorted(layers)}")
        for i, slot in layers.items():
            missing = set(_LAYER_ROLES.values()) - set(slot)
            if missing:
                raise ValueError(f"layer {i} lacks {sorted(missing)}")

        # Shapes: GGUF ne = [in, out]; logical [out, in].
        def shape(t):
            return tuple(int(n) for n in reversed(t.shape))

        vocab, dim = shape(raw["token_embd.weight"])
        hd = head_dim or _meta_int(reader, f"{ARCH}.attention.key_length") or DEFAULT_HEAD_DIM
        win = window or _meta_int(reader, f"{ARCH}.attention.sliding_window") or DEFAULT_WINDOW
        q_dim = shape(layers[0]["wq"])[0]
        kv_dim = shape(layers[0]["wk"])[0]
        ffn = shape(layers[0]["w_gate"])[0]
        if q_dim % hd or kv_dim % hd:
            raise ValueError(f"q rows {q_dim} / k rows {kv_dim} not multiples of head_dim {hd}")
        cfg = Config(n_layers, dim, q_dim // hd, kv_dim // hd, hd, ffn, vocab, win)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"n_heads {cfg.n_heads} not a multiple of n_kv_heads {cfg.n_kv_heads}")
        self.cfg = cfg

        expect = {"wq": (q_dim, dim), "wk": (kv_dim, dim), "wv": (kv_dim, dim), "wog": (q_dim, dim),
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
        # Weights: dequantized to f32 (gguf-py), then rounded to the activation dtype.
        # Norm gains: absolute values, no +1 (§4.4), cast to the activation dtype (§4.3).
        self.tok_embd = raw["token_embd.weight"]          # looked up lazily, row by row (§4.6)
        self.output = r(self._deq(raw["output.weight"]))
        self.output_norm = r(self._deq(raw["output_norm.weight"]))
        self.layers = [{role: r(self._deq(t)) for role, t in layers[i].items()} for i in range(n_layers)]

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
    scores = nx.matmul(q.transpose(1, 0, 2), k.transpose(0, 2, 1)) * F32(ATTN_SCALE)  # [H, T, S]
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
    inv_freq = rope_inv_freq(cfg.head_dim)
    group = cfg.n_heads // cfg.n_kv_heads

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

    # §3.2 embedding: scaleless RMSNorm of the looked-up rows.
    x = r(rms_0(model.embed_rows(tokens), NORM_EPS, nx))           # [T, D], the residual stream
    rec("embd", x)

    for i, lw in enumerate(model.layers):
        # §3.4 attention
        h = rms_w(x, lw["attn_norm"], NORM_EPS, nx)
        q = linear(h, lw["wq"], nx).reshape(t_new, cfg.n_heads, cfg.head_dim)
        k = linear(h, lw["wk"], nx).reshape(t_new, cfg.n_kv_heads, cfg.head_dim)
        v = linear(h, lw["wv"], nx).reshape(t_new, cfg.n_kv_heads, cfg.head_dim)
        o = linear(h, lw["wog"], nx).reshape(t_new, cfg.n_heads, cfg.head_dim)
        q = rms_0(q, NORM_EPS, nx)                                    # scaleless QK-norm per head
        k = rms_0(k, NORM_EPS, nx)
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
        y = r(sigmoid(o) * y)                                         # §3.4.7 output gate
        a = linear(y.reshape(t_new, -1), lw["wo"], nx)
        rec(f"blk.{i}.attn_gated", y.reshape(t_new, -1))
        rec(f"blk.{i}.attn_out", a)
        x = r(x + rms_w(a, lw["post_attn_norm"], POST_NORM_EPS, nx))
        rec(f"blk.{i}.resid_attn", x)

        # §3.5 MLP. The product silu(g)·u is rounded once, as the input of W_down.
        h = rms_w(x, lw["ffn_norm"], NORM_EPS, nx)
        g = linear(h, lw["w_gate"], nx)
        u = linear(h, lw["w_up"], nx)
        act = r(g * sigmoid(g) * u)
        m = linear(act, lw["w_down"], nx)
        rec(f"blk.{i}.ffn_norm", h)
        rec(f"blk.{i}.ffn_act", act)
        rec(f"blk.{i}.ffn_out", m)
        x = r(x + rms_w(m, lw["post_ffn_norm"], POST_NORM_EPS, nx))
        rec(f"blk.{i}.resid_ffn", x)

    # §3.6 output head and soft-cap
    hn = rms_w(x, model.output_norm, NORM_EPS, nx)
    z = linear(hn, model.output, nx)
    logits = soft_cap(z)
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
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
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
