"""numpy reference of the Muse Glimmer vision tower as ../shared/spec/vision.md describes the
model's reference (§5-§9), in float64, on the weights of an mmproj GGUF (llama.cpp layout,
read with gguf-py). Used by scripts/fixtures/make_vision_fixtures.py for the fixtures of the
reference rules (the grid of a tie, the transposed zero-padded position table), which
llama.cpp does not implement.

Written from the spec, not from hearth's code. Generalizations of the spec's constants to
the synthetic towers: the attention tile side and the position table side are the table's
side S (32 in the real model), the RoPE frequencies use head_dim/2 pairs (48), the halves
head_dim/4 (24). Activations stay float64 (the reference rounds them to bf16).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Tower:
    def __init__(self, path: str):
        r = GGUFReader(path)
        self.t = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.t[t.name] = a.reshape([int(d) for d in reversed(t.shape)])
        kv = {f.name: f for f in r.fields.values()}

        def num(key):
            f = kv[key]
            return f.parts[f.data[0]][0].item()

        self.d = num("clip.vision.embedding_length")
        self.heads = num("clip.vision.attention.head_count")
        self.layers = num("clip.vision.block_count")
        self.eps = num("clip.vision.attention.layer_norm_epsilon")
        self.patch = num("clip.vision.patch_size")
        self.side = int(round(math.sqrt(self.t["v.position_embd.weight"].shape[0])))


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def patches(rgb: np.ndarray, p: int) -> np.ndarray:
    """§5: rgb [H, W, 3] uint8 (already resized) -> [P, 2·3·p²], both temporal halves."""
    v = ((rgb.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)).astype(np.float64)
    gh, gw = rgb.shape[0] // p, rgb.shape[1] // p
    out = np.zeros((gh * gw, 2 * 3 * p * p))
    for py in range(gh):
        for px in range(gw):
            blk = v[py * p:(py + 1) * p, px * p:(px + 1) * p, :]  # [dy, dx, ch]
            flat = blk.transpose(2, 0, 1).reshape(-1)  # ch·p² + dy·p + dx
            out[py * gw + px] = np.concatenate([flat, flat])
    return out


def pos_embed(table: np.ndarray, side: int, gh: int, gw: int) -> np.ndarray:
    """§6, with its quirk: a [grid_w][grid_h] flattening, zero padding."""
    T = table.reshape(side, side, -1)

    def coord(k, g):
        ny = 0.0 if g == 1 else -1 + 1 / g + k * (2 - 2 / g) / (g - 1)
        return (ny + 1) * (side / 2) - 0.5

    def at(y, x):
        return T[y, x] if 0 <= y < side and 0 <= x < side else np.zeros(T.shape[2])

    out = np.zeros((gh * gw, T.shape[2]))
    for t in range(gh * gw):
        a, b = t // gh, t % gh
        sy, sx = coord(a, gw), coord(b, gh)
        y0, x0 = math.floor(sy), math.floor(sx)
        wy, wx = sy - y0, sx - x0
        top = at(y0, x0) * (1 - wx) + at(y0, x0 + 1) * wx
        bottom = at(y0 + 1, x0) * (1 - wx) + at(y0 + 1, x0 + 1) * wx
        out[t] = top * (1 - wy) + bottom * wy
    return out


def sparse(gh: int, gw: int, tile: int):
    """§8: the permutation and the tile sizes."""
    perm, slens = [], []
    for ty in range((gh + tile - 1) // tile):
        for tx in range((gw + tile - 1) // tile):
            n = 0
            for y in range(ty * tile, min((ty + 1) * tile, gh)):
                for x in range(tx * tile, min((tx + 1) * tile, gw)):
                    perm.append(y * gw + x)
                    n += 1
            if n:
                slens.append(n)
    return np.array(perm), slens


def rope_tables(gh: int, gw: int, hd: int):
    """§7: cos, sin [P, hd/2] for tokens in row-major order."""
    pairs, quarter = hd // 2, hd // 4
    omega = np.array([1.0 / 10000 ** (2 * i / pairs) for i in range(quarter)])
    phi = np.zeros((gh * gw, pairs))
    for t in range(gh * gw):
        r, c = t // gw, t % gw
        phi[t, :quarter] = (c + 1) * omega
        phi[t, quarter:] = (r + 1) * omega
    return np.cos(phi), np.sin(phi)


def rotate(x, cos, sin):
    """x [P, heads, hd]: pair (2j, 2j+1) turned by φ_j."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def encode(tw: Tower, rgb: np.ndarray) -> np.ndarray:
    """§9: resized image [H, W, 3] -> projector rows [N, out], before the final RMSNorm."""
    t, d, p = tw.t, tw.d, tw.patch
    gh, gw = rgb.shape[0] // p, rgb.shape[1] // p
    P = gh * gw
    w = t["v.patch_embd.weight"].reshape(d, -1)
    if w.shape[1] == 3 * p * p:  # folded: zero-pad to [D, 1176] (§11)
        w = np.concatenate([w, np.zeros_like(w)], axis=1)
    x = patches(rgb, p) @ w.T
    x = x + pos_embed(t["v.position_embd.weight"], tw.side, gh, gw)
    x = layer_norm(x, t["v.pre_ln.weight"], t["v.pre_ln.bias"], tw.eps)
    perm, slens = sparse(gh, gw, tw.side)
    inv = np.argsort(perm)
    x = x[perm]
    cos, sin = rope_tables(gh, gw, d // tw.heads)
    cos, sin = cos[perm], sin[perm]
    sparse_mask = np.zeros((P, P), dtype=bool)
    o = 0
    for s in slens:
        sparse_mask[o:o + s, o:o + s] = True
        o += s
    hd = d // tw.heads
    for i in range(tw.layers):
        g = lambda n: t[f"v.blk.{i}.{n}"]  # noqa: E731
        mask = np.ones((P, P), dtype=bool) if (i == tw.layers - 1 or (i + 1) % 4 == 0) else sparse_mask
        h = layer_norm(x, g("ln1.weight"), g("ln1.bias"), tw.eps)
        q = (h @ g("attn_q.weight").T + g("attn_q.bias")).reshape(P, tw.heads, hd)
        k = (h @ g("attn_k.weight").T + g("attn_k.bias")).reshape(P, tw.heads, hd)
        v = (h @ g("attn_v.weight").T + g("attn_v.bias")).reshape(P, tw.heads, hd)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(P, d)
        x = x + a @ g("attn_out.weight").T + g("attn_out.bias")
        h = layer_norm(x, g("ln2.weight"), g("ln2.bias"), tw.eps)
        x = x + gelu(h @ g("ffn_up.weight").T + g("ffn_up.bias")) @ g("ffn_down.weight").T + g("ffn_down.bias")
    x = x[inv]
    x = layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], tw.eps)
    u = np.zeros(((gh // 2) * (gw // 2), 4 * d))
    for oh in range(gh // 2):
        for ow in range(gw // 2):
            g_ = oh * (gw // 2) + ow
            for iy in range(2):
                for ix in range(2):
                    kk = 2 * iy + ix
                    u[g_, kk::4] = x[(2 * oh + iy) * gw + 2 * ow + ix]
    z = gelu(u @ t["mm.0.weight"].T)
    z = gelu(z @ t["mm.1.weight"].T)
    return z @ t["mm.2.weight"].T
