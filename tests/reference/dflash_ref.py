#!/usr/bin/env python3
"""Numpy reference of the DFlash and DFlash2 drafters as llama.cpp 11434 defines them
(`dflash`: docs/muse-glimmer-llamacpp.md §2, from src/models/dflash.cpp and the driver in
common/speculative.cpp), written from that math in exact f32 (accumulation in f64), on top of
the Muse Glimmer target reference (muse_glimmer_ref.py) for the tapped hidden states.

Scenario (the Rust test runs the same):
  1. the target prefills tokens[0:s0]; its taps give context rows for positions 0..s0-1;
  2. draft call 1: those rows injected at 0.., block [tokens[s0], MASK x (B-1)] at s0..;
  3. the target runs tokens[s0:s1] (a verify pass); taps give rows s0..s1-1;
  4. draft call 2: those rows injected at s0.., block [tokens[s1], MASK x (B-1)] at s1...
Writes, for block rows 1..B-1 of both calls, the draft logits [2(B-1), vocab] (DFlash1) or
the selector lattice rows [2(B-1), k + k*k] (DFlash2), as .npy.

The math: context g = RMSNorm(fc·f)·enc.output_norm with f the tapped target states (the
input of each listed target layer, concatenated in file order); per layer K = RoPE(RMSNorm_h(
W_k g)·k_norm) and V = W_v g at the context positions. Block: target token embeddings; per layer
h = RMSNorm(x)·attn_norm (DFlash2: conv side 0), Q/K/V likewise at the block positions (NeoX
RoPE, base rope.freq_base, default 10000), attention (scale 1/sqrt(hd)) of every block row over
the context and every block row (non-causal); on a sliding layer row t at position C + t sees
context positions p with C + t − p < W; W_o, (DFlash2: conv side 1), post-norm if present,
residual; the MLP the same way; output norm; the target's LM head (DFlash2: × logit_scale,
cap·tanh(z/cap)). DFlash2 selector: top-k candidates per row (ggml's order: descending, first
two swapped), gate = selector_hidden·hidden, score[p][c] = next[cand_c]·(prev[pred_p]⊙gate) +
z[cand_c], predecessors the anchor (row 1) or the previous row's candidates.

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

# llama.cpp's defaults; REQUIRED keys have none (a missing one is an error).
REQUIRED = object()
DEFAULTS = {
    "dflash.embedding_length": REQUIRED, "dflash.block_count": REQUIRED,
    "dflash.attention.head_count": REQUIRED, "dflash.attention.head_count_kv": None,
    "dflash.attention.key_length": None, "dflash.feed_forward_length": REQUIRED,
    "dflash.block_size": 16, "dflash.target_layers": REQUIRED, "dflash.rope.freq_base": 10000.0,
    "dflash.attention.layer_norm_rms_epsilon": REQUIRED, "tokenizer.ggml.mask_token_id": REQUIRED,
    "dflash.attention.sliding_window": 0, "dflash.attention.sliding_window_pattern": None,
    "dflash.logit_scale": 0.0, "dflash.final_logit_softcapping": 0.0, "dflash.conv_kernel_size": 0,
    "dflash.conv_group_size": 0, "dflash.selector_rank": 0, "dflash.selector_top_k": 0,
}


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        if DEFAULTS[key] is REQUIRED:
            raise ValueError(f"key not found in model: {key}")
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
    """NEOX (half-split) RoPE. x: [T, heads, hd]; pairs (j, j + hd/2)."""
    hd = x.shape[-1]
    half = hd // 2
    j = np.arange(half, dtype=F32)
    inv = (F32(1.0) / np.power(F32(theta), (F32(2.0) * j) / F32(hd))).astype(F32)
    ang = positions.astype(F32)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half].astype(F32), x[..., half:].astype(F32)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(F32)


def top_k_ggml(z, k):
    """ggml's top_k order: the k largest descending (ties: lower id), then the first two swapped."""
    idx = np.lexsort((np.arange(len(z)), -z.astype(np.float64)))[:k].tolist()
    if k > 1:
        idx[0], idx[1] = idx[1], idx[0]
    return idx


class Draft:
    def __init__(self, path, target: mg.Model, max_seq_len: int):
        r = gguf.GGUFReader(path)
        arch = r.fields["general.architecture"]
        if arch.parts[arch.data[0]].tobytes().decode() != "dflash":
            raise ValueError("not a dflash GGUF")
        g = lambda k: field(r, k)  # noqa: E731
        self.dim, self.n_layers = int(g("dflash.embedding_length")), int(g("dflash.block_count"))
        self.nh = int(g("dflash.attention.head_count"))
        self.nkv = int(g("dflash.attention.head_count_kv") or self.nh)
        self.hd = int(g("dflash.attention.key_length") or self.dim // self.nh)
        self.bmax = int(g("dflash.block_size"))
        self.taps = [int(x) for x in g("dflash.target_layers")]
        self.theta, self.eps = float(g("dflash.rope.freq_base")), float(g("dflash.attention.layer_norm_rms_epsilon"))
        self.mask = int(g("tokenizer.ggml.mask_token_id"))
        w, pat = int(g("dflash.attention.sliding_window")), g("dflash.attention.sliding_window_pattern")
        if w > 0 and pat is None:
            raise ValueError("dflash.attention.sliding_window_pattern is required with a window")
        self.windows = [w if (w > 0 and s) else 0 for s in (pat or [False] * self.n_layers)]
        if self.dim != target.cfg.dim:
            raise ValueError(f"draft dim {self.dim} != target dim {target.cfg.dim}")
        t = {x.name: x for x in r.tensors}
        need = lambda n: deq(t[n]) if n in t else (_ for _ in ()).throw(ValueError(f"missing {n}"))  # noqa: E731
        self.fc, self.hidden_norm, self.output_norm = need("fc.weight"), need("enc.output_norm.weight"), need("output_norm.weight")
        roles = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        self.layers = [{k: need(f"blk.{i}.{k}.weight") for k in roles} for i in range(self.n_layers)]
        for i, L in enumerate(self.layers):
            for opt in ("post_attention_norm", "post_ffw_norm"):
                if f"blk.{i}.{opt}.weight" in t:
                    L[opt] = need(f"blk.{i}.{opt}.weight")
        self.dflash2 = "selector_hidden.weight" in t
        if self.dflash2:
            self.K, self.G = int(g("dflash.conv_kernel_size")), int(g("dflash.conv_group_size"))
            self.R, self.top_k = int(g("dflash.selector_rank")), int(g("dflash.selector_top_k"))
            if min(self.K, self.G, self.R, self.top_k) <= 0:
                raise ValueError("DFlash2 model is missing conv/selector metadata")
            self.logit_scale = float(g("dflash.logit_scale"))
            self.softcap = float(g("dflash.final_logit_softcapping"))
            for i, L in enumerate(self.layers):
                for site in ("attn", "ffn"):
                    # ggml {dim, K, 2} -> numpy [2, K, dim]: [side][tap][channel]
                    L[f"{site}_conv_base"] = need(f"blk.{i}.{site}_conv_base").reshape(2, self.K, self.dim)
                    L[f"{site}_conv_proj"] = need(f"blk.{i}.{site}_conv_proj.weight")
            self.sel_prev = need("selector_predecessor.weight")      # [vocab, R]
            self.sel_next = need("selector_successor.weight")        # [vocab, R]
            self.sel_hidden = need("selector_hidden.weight")         # [R, dim]
        self.target = target
        # Flat context caches [n_kv, max_seq_len, hd]: position c in slot c.
        self.k = [np.zeros((self.nkv, max_seq_len, self.hd), F32) for _ in range(self.n_layers)]
        self.v = [np.zeros((self.nkv, max_seq_len, self.hd), F32) for _ in range(self.n_layers)]

    def conv(self, x, dyn, base, side):
        """Grouped dynamic causal convolution inside the block: out[t][c] = sum over taps k <
        min(K, B) of (base[side][k][c] + dyn[t][side][k][c // G]) * x[t − k][c] (zero before
        the block). dyn [B, 2K·(dim/G)] is laid out [side][tap][group]."""
        b, d = x.shape
        ng = d // self.G
        coef = dyn.reshape(b, 2, self.K, ng)[:, side]                       # [B, K, groups]
        w = base[side][None, :, :] + np.repeat(coef, self.G, axis=2)       # [B, K, dim]
        out = np.zeros_like(x, dtype=np.float64)
        for k in range(min(self.K, b)):
            shifted = np.zeros_like(x)
            shifted[k:] = x[:b - k]
            out += w[:, k].astype(np.float64) * shifted
        return out.astype(F32)

    def forward(self, hn, c0, block):
        """hn [n_new, n_T*D] context rows at c0..; block [B]. Returns (logits [B, V], lattice
        [B, k + k*k] or None)."""
        tgt = self.target
        n_new, b = hn.shape[0], len(block)
        c1 = c0 + n_new
        ctx = rms_w(mm(hn, self.fc), self.hidden_norm, self.eps)
        x = tgt._deq(tgt.tok_embd, np.asarray(block, dtype=np.int64))     # raw target embeddings
        cpos, bpos = np.arange(c0, c1), np.arange(c1, c1 + b)
        group = self.nh // self.nkv
        for i, L in enumerate(self.layers):
            kc = rms_w(mm(ctx, L["attn_k"]).reshape(n_new, self.nkv, self.hd), L["attn_k_norm"], self.eps)
            self.k[i][:, cpos] = rope_neox(kc, cpos, self.theta).transpose(1, 0, 2)
            self.v[i][:, cpos] = mm(ctx, L["attn_v"]).reshape(n_new, self.nkv, self.hd).transpose(1, 0, 2)
            h = rms_w(x, L["attn_norm"], self.eps)
            if self.dflash2:
                dyn_a = mm(h, L["attn_conv_proj"])
                h = self.conv(h, dyn_a, L["attn_conv_base"], 0)
            q = rope_neox(rms_w(mm(h, L["attn_q"]).reshape(b, self.nh, self.hd), L["attn_q_norm"], self.eps), bpos, self.theta)
            kb = rope_neox(rms_w(mm(h, L["attn_k"]).reshape(b, self.nkv, self.hd), L["attn_k_norm"], self.eps), bpos, self.theta)
            vb = mm(h, L["attn_v"]).reshape(b, self.nkv, self.hd)
            keys = np.concatenate([self.k[i][:, :c1], kb.transpose(1, 0, 2)], axis=1)   # [nkv, C1+B, hd]
            vals = np.concatenate([self.v[i][:, :c1], vb.transpose(1, 0, 2)], axis=1)
            # Visibility [B, C1+B]: all context (full layer) or p > C1 + t − W (sliding), all block rows.
            vis = np.ones((b, c1 + b), bool)
            if self.windows[i]:
                p = np.arange(c1)[None, :]
                vis[:, :c1] = (c1 + np.arange(b))[:, None] - p < self.windows[i]
            heads = np.arange(self.nh) // group
            sc = np.matmul(q.transpose(1, 0, 2).astype(np.float64), keys[heads].transpose(0, 2, 1).astype(np.float64))
            sc = (sc / np.sqrt(self.hd)).astype(F32)                                  # [nh, B, C1+B]
            sc = np.where(vis[None], sc, F32(-np.inf))
            sc = sc - sc.max(-1, keepdims=True)
            p = np.exp(sc).astype(F32)
            p = (p / p.sum(-1, keepdims=True, dtype=np.float64).astype(F32)).astype(F32)
            y = np.matmul(p.astype(np.float64), vals[heads].astype(np.float64)).astype(F32)   # [nh, B, hd]
            a = mm(y.transpose(1, 0, 2).reshape(b, -1), L["attn_output"])
            if self.dflash2:
                a = self.conv(a, dyn_a, L["attn_conv_base"], 1)
            if "post_attention_norm" in L:
                a = rms_w(a, L["post_attention_norm"], self.eps)
            x = (x + a).astype(F32)
            h2 = rms_w(x, L["ffn_norm"], self.eps)
            if self.dflash2:
                dyn_f = mm(h2, L["ffn_conv_proj"])
                h2 = self.conv(h2, dyn_f, L["ffn_conv_base"], 0)
            gt, up = mm(h2, L["ffn_gate"]), mm(h2, L["ffn_up"])
            act = (gt / (F32(1.0) + np.exp(-gt)) * up).astype(F32)
            m = mm(act, L["ffn_down"])
            if self.dflash2:
                m = self.conv(m, dyn_f, L["ffn_conv_base"], 1)
            if "post_ffw_norm" in L:
                m = rms_w(m, L["post_ffw_norm"], self.eps)
            x = (x + m).astype(F32)
        hidden = rms_w(x, self.output_norm, self.eps)
        z = mm(hidden, tgt.output)
        if not self.dflash2:
            return z, None
        if self.logit_scale:
            z = (z * F32(self.logit_scale)).astype(F32)
        if self.softcap > 0:
            z = (F32(self.softcap) * np.tanh((z / F32(self.softcap)).astype(np.float64))).astype(F32)
        k = self.top_k
        lattice = np.zeros((b, k + k * k), F32)
        prev = None
        for t in range(1, min(b, self.bmax)):
            cand = top_k_ggml(z[t], k)
            gate = mm(hidden[t:t + 1], self.sel_hidden)[0]                           # [R]
            preds = [block[0]] if t == 1 else prev
            for pi in range(k):
                cond = self.sel_prev[preds[0 if len(preds) == 1 else pi]] * gate
                for ci, cid in enumerate(cand):
                    lattice[t, k + pi * k + ci] = F32(np.dot(self.sel_next[cid].astype(np.float64),
                                                             cond.astype(np.float64)) + z[t][cid])
            lattice[t, :k] = cand
            prev = cand
        return z, lattice


def target_taps(model: mg.Model, st: mg.State, tokens, taps):
    """Runs the target on tokens; returns hid [T, n_T*D]: the residual entering each tapped layer,
    concatenated in the listed order."""
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
    for start, (lo, hi) in ((0, (0, s0)), (s0, (s0, s1))):
        h = target_taps(target, st, tokens[lo:hi], draft.taps)
        z, lattice = draft.forward(h, start, [tokens[hi]] + [draft.mask] * (a.block - 1))
        out.append((z if lattice is None else lattice)[1:])
    np.save(a.out, np.concatenate(out, axis=0).astype(F32))


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
