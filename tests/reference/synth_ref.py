#!/usr/bin/env python3
"""Writes a tiny synthetic `muse-glimmer` GGUF in llama.cpp 11434's layout (the keys and
tensors of docs/muse-glimmer-llamacpp.md §1) for developing and testing the numpy reference.

Tensor types follow a Q4_K_M-like mix:
  - Q4_K: token_embd, attn_q, attn_k, attn_gate, attn_output, ffn_gate, ffn_up (or attn_qkv);
  - Q6_K: output;
  - F32: every norm and q/k-norm gain (random positive gains near 1; the q gain around 2.7,
    like the converter's qk_scale_factor), biases and per-tensor scales;
  - attn_v Q6_K on layers {0, 3, 5} else Q4_K; ffn_down Q6_K on {1, 4} else Q4_K.
Options write the optional pieces llama.cpp reads: a fused attn_qkv (+ bias), attn_output.scale,
a per-layer sliding pattern array, no soft-cap key (default 30) or cap 0. The random stream does
not depend on those options, so a fused file holds exactly the separate file's weights.

gguf-py 0.19 can dequantize Q4_K/Q6_K but not quantize them (`gguf.quants.quantize`
raises NotImplementedError), so this file packs K-quant blocks itself: a plain
min/max quantizer (not llama.cpp's error-minimizing search) that emits ggml's block
layout. `test_muse_glimmer_ref.py` checks the packing by round-tripping through
`gguf.quants.dequantize`. `quant="q8_0"` (or "f16", "bf16") writes every linear in that
type instead, converted by gguf-py itself.

Usage: python3 tests/reference/synth_ref.py OUT.gguf [--layers 8 --dim 256 ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import gguf

QK_K = 256  # K-quant super-block size (§4.6)
_T = gguf.GGMLQuantizationType
Q4_K, Q6_K, Q8_0, F16, BF16, F32 = _T.Q4_K, _T.Q6_K, _T.Q8_0, _T.F16, _T.BF16, _T.F32
# quant= choice -> (type of the Q4_K-class tensors, type of the Q6_K-class tensors)
QUANT_MIXES = {"kquant": (Q4_K, Q6_K), "q8_0": (Q8_0, Q8_0), "f16": (F16, F16), "bf16": (BF16, BF16)}


def _f16(x: np.ndarray) -> np.ndarray:
    """Rounds to f16 and returns the f16 values as f32 (what the dequantizer will see)."""
    return x.astype(np.float16).astype(np.float32)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """[rows, k] f32 -> [rows, k/256*144] uint8 Q4_K blocks (layout of spec §4.6).

    w = d·sc_j·q − dmin·mn_j with q in 0..15 and 6-bit sc_j, mn_j per 32-weight sub-block.
    """
    rows, k = w.shape
    assert k % QK_K == 0, f"Q4_K needs the row length ({k}) to be a multiple of 256"
    x = w.reshape(-1, 8, 32).astype(np.float32)              # [nb, sub-block, 32]
    lo = np.minimum(x.min(-1), 0.0)
    hi = np.maximum(x.max(-1), 0.0)
    scale = (hi - lo) / 15.0                                  # [nb, 8]
    mins = -lo                                                # [nb, 8], >= 0
    d = _f16(scale.max(-1) / 63.0)                            # [nb]
    dmin = _f16(mins.max(-1) / 63.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.ceil(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.round(mins / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        eff_scale = d[:, None] * sc                           # [nb, 8]
        eff_min = dmin[:, None] * mn
        q = np.where(eff_scale[..., None] > 0,
                     np.round((x + eff_min[..., None]) / eff_scale[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(-1, 256)     # [nb, 256]

    nb = x.shape[0]
    s = np.zeros((nb, 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)        # low sc_0..3, high bits of sc_4..7
    s[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)        # low mn_0..3, high bits of mn_4..7
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    qs = np.zeros((nb, 128), np.uint8)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = q[:, 64 * c:64 * c + 32] | (q[:, 64 * c + 32:64 * c + 64] << 4)
    blocks = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2),
                             dmin.astype(np.float16).view(np.uint8).reshape(nb, 2), s, qs], axis=1)
    assert blocks.shape[1] == 144
    return blocks.reshape(rows, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """[rows, k] f32 -> [rows, k/256*210] uint8 Q6_K blocks (layout of spec §4.6).

    w = d·sc_j·(q − 32) with q in 0..63 and int8 sc_j per 16-weight sub-block.
    """
    rows, k = w.shape
    assert k % QK_K == 0, f"Q6_K needs the row length ({k}) to be a multiple of 256"
    x = w.reshape(-1, 16, 16).astype(np.float32)             # [nb, sub-block, 16]
    scale = np.abs(x).max(-1) / 31.0                          # [nb, 16]
    d = _f16(scale.max(-1) / 127.0)                           # [nb]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.ceil(scale / d[:, None]), 0).clip(0, 127).astype(np.int8)
        eff = d[:, None] * sc.astype(np.float32)
        q = np.where(eff[..., None] > 0, np.round(x / eff[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 256)  # [nb, 256], 0..63

    nb = x.shape[0]
    ql = np.zeros((nb, 128), np.uint8)
    qh = np.zeros((nb, 64), np.uint8)
    for n in range(2):
        b = q[:, 128 * n:128 * n + 128]
        q0, q1, q2, q3 = b[:, 0:32], b[:, 32:64], b[:, 64:96], b[:, 96:128]
        ql[:, 64 * n:64 * n + 32] = (q0 & 15) | ((q2 & 15) << 4)
        ql[:, 64 * n + 32:64 * n + 64] = (q1 & 15) | ((q3 & 15) << 4)
        qh[:, 32 * n:32 * n + 32] = (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8),
                             d.astype(np.float16).view(np.uint8).reshape(nb, 2)], axis=1)
    assert blocks.shape[1] == 210
    return blocks.reshape(rows, -1)


def quantize(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Returns the bytes to store (uint8 rows for quantized/bf16 types, f16 array for F16)."""
    if qtype == Q4_K:
        return quantize_q4_k(w)
    if qtype == Q6_K:
        return quantize_q6_k(w)
    return gguf.quants.quantize(w.astype(np.float32), qtype)


def _add(writer, name, w, qtype):
    data = quantize(w, qtype)
    if qtype == F16:
        writer.add_tensor(name, data)  # a native numpy dtype: no raw_dtype
    else:
        writer.add_tensor(name, data, raw_dtype=qtype)


def write_synthetic(path, layers=8, dim=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=512,
                    window=16, seed=0, quant="kquant", output_scale=4.0, v_q6k_layers=(0, 3, 5),
                    down_q6k_layers=(1, 4), fused_qkv=False, qkv_bias=False, wo_scale=None,
                    pattern=None, soft_cap=20.0, rope_base=500000.0, rope_base_swa=None,
                    extra_tensor=None, logit_scale=0.19611613513):
    """Writes a random muse-glimmer GGUF at `path`.

    quant: "kquant" (the mix above), or "q8_0" / "f16" / "bf16" for every linear.
    output_scale: multiplies the lm_head init so logits spread enough to exercise the soft-cap.
    fused_qkv / qkv_bias: one attn_qkv (+ attn_qkv.bias) instead of attn_q/k/v (the same values).
    wo_scale: writes attn_output.scale. pattern: a per-layer bool array (else the default period).
    soft_cap: final_logit_softcapping (None: key absent). extra_tensor: a name llama.cpp has no
    place for (to check it is refused).
    Linear weights are N(0, 1/fan_in), so every linear roughly preserves the RMS of its input.
    """
    q_dim = heads * head_dim
    kv_dim = kv_heads * head_dim
    for name, k in (("dim", dim), ("q_dim", q_dim), ("ffn", ffn)):
        assert k % QK_K == 0, f"{name} = {k} is an `in` axis and must be a multiple of 256 for K-quants"
    rng = np.random.default_rng(seed)
    t4, t6 = QUANT_MIXES[quant]

    arch = "muse-glimmer"
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_uint32(f"{arch}.block_count", layers)
    w.add_uint32(f"{arch}.embedding_length", dim)
    w.add_uint32(f"{arch}.feed_forward_length", ffn)
    w.add_uint32(f"{arch}.attention.head_count", heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", kv_heads)
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.attention.value_length", head_dim)
    w.add_uint32(f"{arch}.attention.sliding_window", window)
    if pattern is not None:
        w.add_array(f"{arch}.attention.sliding_window_pattern", [bool(p) for p in pattern])
    w.add_uint32(f"{arch}.context_length", 131072)
    w.add_float32(f"{arch}.rope.freq_base", rope_base)
    if rope_base_swa is not None:
        w.add_float32(f"{arch}.rope.freq_base_swa", rope_base_swa)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if logit_scale is not None:  # None: leave out a key llama.cpp requires
        w.add_float32(f"{arch}.logit_scale", logit_scale)
    if soft_cap is not None:
        w.add_float32(f"{arch}.final_logit_softcapping", soft_cap)
    w.add_string("tokenizer.ggml.model", "no_vocab")
    w.add_uint32(f"{arch}.vocab_size", vocab)

    pending = []  # (name, values, type): written in this order after the draws

    def linear(name, out_f, in_f, qtype, scale=1.0):
        m = rng.standard_normal((out_f, in_f), dtype=np.float32) * np.float32(scale / np.sqrt(in_f))
        pending.append((name, m, qtype))
        return m

    def gain(name, n, lo=0.8, hi=1.2):
        g = rng.uniform(lo, hi, n).astype(np.float32)
        pending.append((name, g, F32))
        return g

    # Embedding rows are RMS-normalised (gainless) after lookup, so their scale is irrelevant.
    pending.append(("token_embd.weight", rng.standard_normal((vocab, dim), dtype=np.float32), t4))
    for i in range(layers):
        p = f"blk.{i}."
        gain(p + "attn_norm.weight", dim)
        mats = [linear(p + n, rows, dim, t) for n, rows, t in (
            ("attn_q.weight", q_dim, t4), ("attn_k.weight", kv_dim, t4),
            ("attn_v.weight", kv_dim, t6 if i in v_q6k_layers else t4))]
        biases = [0.1 * rng.standard_normal(n).astype(np.float32) for n in (q_dim, kv_dim, kv_dim)]
        if fused_qkv:
            del pending[-3:]
            pending.append((p + "attn_qkv.weight", np.concatenate(mats), t4))
            if qkv_bias:
                pending.append((p + "attn_qkv.bias", np.concatenate(biases), F32))
        elif qkv_bias:
            for n, b in zip(("attn_q.bias", "attn_k.bias", "attn_v.bias"), biases):
                pending.append((p + n, b, F32))
        linear(p + "attn_gate.weight", q_dim, dim, t4)
        linear(p + "attn_output.weight", dim, q_dim, t4)
        if wo_scale is not None:
            pending.append((p + "attn_output.scale", np.array([wo_scale], np.float32), F32))
        gain(p + "attn_q_norm.weight", head_dim, 2.2, 3.2)
        gain(p + "attn_k_norm.weight", head_dim)
        gain(p + "post_attention_norm.weight", dim)
        gain(p + "ffn_norm.weight", dim)
        linear(p + "ffn_gate.weight", ffn, dim, t4)
        linear(p + "ffn_up.weight", ffn, dim, t4)
        linear(p + "ffn_down.weight", dim, ffn, t6 if i in down_q6k_layers else t4)
        gain(p + "post_ffw_norm.weight", dim)
    gain("output_norm.weight", dim)
    linear("output.weight", vocab, dim, t6, scale=output_scale)
    if extra_tensor is not None:
        pending.append((extra_tensor, np.ones(head_dim // 2, np.float32), F32))
    for name, values, qtype in pending:
        if qtype == F32:
            w.add_tensor(name, values)
        else:
            _add(w, name, values, qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    for name, default in (("layers", 8), ("dim", 256), ("heads", 4), ("kv-heads", 2), ("head-dim", 64),
                          ("ffn", 512), ("vocab", 512), ("window", 16), ("seed", 0)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--quant", choices=sorted(QUANT_MIXES), default="kquant")
    a = ap.parse_args()
    write_synthetic(a.out, layers=a.layers, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads,
                    head_dim=a.head_dim, ffn=a.ffn, vocab=a.vocab, window=a.window, seed=a.seed,
                    quant=a.quant)


if __name__ == "__main__":
    main()
