#!/usr/bin/env python3
"""Numpy reference of the DFlash drafter (docs/spec/dflash.md), written from the spec,
in exact f32 (accumulation in f64), on top of the Muse Glimmer target reference
(muse_glimmer_ref.py) for the tapped hidden states.

Scenario (the Rust test runs the same):
  1. the target prefills tokens[0:s0]; its taps give context rows for positions 0..s0-1;
  2. draft call 1: c0 = 0, those rows, block [tokens[s0], MASK x (B-1)];
  3. the target runs tokens[s0:s1] (a verify pass); taps give rows s0..s1-1;
  4. draft call 2: c0 = s0, those rows, block [tokens[s1], MASK x (B-1)].
Writes the draft logits of block rows 1..B-1 of both calls, [2(B-1), vocab], as .npy.

The draft context cache is the literal §5 structure: a flat cache (slot c) for global layers,
a ring of 2*W_d slots with the ring_pos validity rule for sliding layers.

Run: python3 tests/reference/dflash_ref.py TARGET.gguf DRAFT.gguf --tokens 1,2,3 --split 20,23 --block 6 --out x.npy
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import gguf  # noqa: E402

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muse_glimmer_ref as mg  # noqa: E402

F32 = np.float32

# §2.1 defaults, used when a key is absent.
DEFAULTS = {
    "dflash.embedding_length": 6656, "dflash.block_count": 5, "dflash.attention.head_count": 32,
    "dflash.attention.head_count_kv": 8, "dflash.attention.key_length": 128,
    "dflash.feed_forward_length": 19968, "dflash.block_size": 16,
    "dflash.target_layers": [2, 14, 26, 38, 50], "dflash.rope.freq_base": 500000.0,
    "dflash.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.mask_token_id": 201818,
    "dflash.attention.sliding_window": None, "dflash.attention.sliding_window_pattern": None,
}


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return DEFAULTS[key]
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


def deq(t) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=F32)


def rms_w(x, g, eps):
    """x * 1/sqrt(mean(x^2) + eps) * g over the last axis; f64 mean, f32 result."""
    x = x.astype(F32)
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True).astype(F32)
    return (x * (F32(1.0) / np.sqrt(ms + F32(eps))) * g).astype(F32)


def mm(x, w):
    """x @ w.T accumulated in f64."""
    return np.matmul(x.astype(np.float64), w.T.astype(np.float64)).astype(F32)


def rope_neox(x, positions, theta):
    """§4: NEOX (half-split) RoPE. x: [T, heads, hd]; pairs (j, j + hd/2)."""
    hd = x.shape[-1]
    half = hd // 2
    j = np.arange(half, dtype=F32)
    inv = (F32(1.0) / np.power(F32(theta), (F32(2.0) * j) / F32(hd))).astype(F32)
    ang = positions.astype(F32)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half].astype(F32), x[..., half:].astype(F32)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(F32)


class Draft:
    def __init__(self, path, target: mg.Model, max_seq_len: int):
        r = gguf.GGUFReader(path)
        arch = r.fields["general.architecture"]
        if arch.parts[arch.data[0]].tobytes().decode() != "dflash":
            raise ValueError("not a dflash GGUF")
        g = lambda k: field(r, k)  # noqa: E731
        self.dim, self.n_layers = int(g("dflash.embedding_length")), int(g("dflash.block_count"))
        self.nh, self.nkv = int(g("dflash.attention.head_count")), int(g("dflash.attention.head_count_kv"))
        self.hd, self.bmax = int(g("dflash.attention.key_length")), int(g("dflash.block_size"))
        self.taps = [int(x) for x in g("dflash.target_layers")]
        self.theta, self.eps = float(g("dflash.rope.freq_base")), float(g("dflash.attention.layer_norm_rms_epsilon"))
        self.mask = int(g("tokenizer.ggml.mask_token_id"))
        w, pat = g("dflash.attention.sliding_window"), g("dflash.attention.sliding_window_pattern")
        self.windows = [int(w) if (pat is not None and s) else 0 for s in (pat or [False] * self.n_layers)]
        if self.dim != target.cfg.dim:
            raise ValueError(f"draft dim {self.dim} != target dim {target.cfg.dim}")
        t = {x.name: x for x in r.tensors}
        need = lambda n: deq(t[n]) if n in t else (_ for _ in ()).throw(ValueError(f"missing {n}"))  # noqa: E731
        self.fc, self.hidden_norm, self.output_norm = need("fc.weight"), need("enc.output_norm.weight"), need("output_norm.weight")
        roles = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        self.layers = [{k: need(f"blk.{i}.{k}.weight") for k in roles} for i in range(self.n_layers)]
        self.target = target
        # §5 context caches: [n_kv, slots, hd]; ring of 2 W_d for sliding layers.
        self.slots = [2 * w if w else max_seq_len for w in self.windows]
        self.k = [np.zeros((self.nkv, s, self.hd), F32) for s in self.slots]
        self.v = [np.zeros((self.nkv, s, self.hd), F32) for s in self.slots]

    def valid_context(self, layer, c1):
        """Slots a block query may read (§5): flat [0, C1); ring: ring_pos(j) >= max(0, C1 - W_d)."""
        w, s = self.windows[layer], self.slots[layer]
        j = np.arange(s)
        if not w:
            return j < c1
        rp = j + np.floor_divide(c1 - 1 - j, s) * s
        return (rp >= 0) & (rp >= c1 - w)

    def forward(self, hn, c0, block):
        """§4: hn [n_new, n_T*D] context rows at c0..; block [B]. Returns logits [B, V] (f32)."""
        tgt = self.target
        n_new, b = hn.shape[0], len(block)
        c1 = c0 + n_new
        ctx = rms_w(mm(hn, self.fc), self.hidden_norm, self.eps)                 # §4.1
        x = tgt._deq(tgt.tok_embd, np.asarray(block, dtype=np.int64))             # §4.2 raw E[b]
        cpos, bpos = np.arange(c0, c1), np.arange(c1, c1 + b)
        group = self.nh // self.nkv
        for i, L in enumerate(self.layers):
            h = rms_w(x, L["attn_norm"], self.eps)
            kc = rms_w(mm(ctx, L["attn_k"]).reshape(n_new, self.nkv, self.hd), L["attn_k_norm"], self.eps)
            kc = rope_neox(kc, cpos, self.theta)
            vc = mm(ctx, L["attn_v"]).reshape(n_new, self.nkv, self.hd)
            slot = cpos % self.slots[i] if self.windows[i] else cpos
            self.k[i][:, slot] = kc.transpose(1, 0, 2)
            self.v[i][:, slot] = vc.transpose(1, 0, 2)
            q = rope_neox(rms_w(mm(h, L["attn_q"]).reshape(b, self.nh, self.hd), L["attn_q_norm"], self.eps), bpos, self.theta)
            kb = rope_neox(rms_w(mm(h, L["attn_k"]).reshape(b, self.nkv, self.hd), L["attn_k_norm"], self.eps), bpos, self.theta)
            vb = mm(h, L["attn_v"]).reshape(b, self.nkv, self.hd)
            valid = self.valid_context(i, c1)
            keys = np.concatenate([self.k[i][:, valid], kb.transpose(1, 0, 2)], axis=1)   # [nkv, S+B, hd]
            vals = np.concatenate([self.v[i][:, valid], vb.transpose(1, 0, 2)], axis=1)
            heads = np.arange(self.nh) // group
            sc = np.matmul(q.transpose(1, 0, 2).astype(np.float64), keys[heads].transpose(0, 2, 1).astype(np.float64))
            sc = (sc / np.sqrt(self.hd)).astype(F32)                                  # [nh, B, S+B], non-causal
            sc = sc - sc.max(-1, keepdims=True)
            p = np.exp(sc).astype(F32)
            p = (p / p.sum(-1, keepdims=True, dtype=np.float64).astype(F32)).astype(F32)
            y = np.matmul(p.astype(np.float64), vals[heads].astype(np.float64)).astype(F32)   # [nh, B, hd]
            x = (x + mm(y.transpose(1, 0, 2).reshape(b, -1), L["attn_output"])).astype(F32)
            h2 = rms_w(x, L["ffn_norm"], self.eps)
            gt, up = mm(h2, L["ffn_gate"]), mm(h2, L["ffn_up"])
            act = (gt / (F32(1.0) + np.exp(-gt)) * up).astype(F32)
            x = (x + mm(act, L["ffn_down"])).astype(F32)
        out = rms_w(x, self.output_norm, self.eps)
        return mm(out, tgt.output)                                                     # §4.4 no cap


def target_taps(model: mg.Model, st: mg.State, tokens, taps):
    """Runs the target on tokens; returns hid [T, n_T*D]: the residual entering each tapped layer (§3)."""
    trace = {}
    mg.forward(model, st, tokens, trace)
    def entering(layer):
        return trace["embd"][0] if layer == 0 else trace[f"blk.{layer - 1}.resid_ffn"][0]
    return np.concatenate([entering(L) for L in taps], axis=1).astype(F32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--split", required=True, help="s0,s1")
    ap.add_argument("--block", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    s0, s1 = (int(x) for x in a.split.split(","))
    if not (0 < s0 < s1 < len(tokens)):
        raise ValueError("need 0 < s0 < s1 < len(tokens)")
    target = mg.Model(a.target, "f32")
    max_len = len(tokens) + a.block + 1
    draft = Draft(a.draft, target, max_len)
    if not 2 <= a.block <= draft.bmax:
        raise ValueError(f"block {a.block} outside 2..{draft.bmax}")
    st = mg.State(target, kv="flat", max_seq_len=max_len)
    out = []
    h0 = target_taps(target, st, tokens[:s0], draft.taps)
    out.append(draft.forward(h0, 0, [tokens[s0]] + [draft.mask] * (a.block - 1))[1:])
    h1 = target_taps(target, st, tokens[s0:s1], draft.taps)
    out.append(draft.forward(h1, s0, [tokens[s1]] + [draft.mask] * (a.block - 1))[1:])
    np.save(a.out, np.concatenate(out, axis=0).astype(F32))


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
