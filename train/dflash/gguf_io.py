"""GGUF in and out for the DFlash training pipeline (numpy only, no torch).

- `read_target(path)`: a qwen2/llama-family target's hyperparameters and its
  tensors dequantized to float32 numpy arrays ([out, in] for matrices).
- `write_drafter(path, weights, cfg, target_path)`: a `dflash` GGUF in
  llama.cpp 11434's layout (the keys and tensor names hearth's loader,
  crates/models/src/dflash/config.rs, reads), matrices in Q8_0 (or F16/F32),
  norms in F32, with the target's tokenizer copied in (llama.cpp's draft
  context reads its own vocabulary).
"""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_target(path, names=None):
    """(cfg, tensors): tensors maps GGUF names to float32 arrays."""
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    g = lambda k, d=None: field(r, f"{arch}.{k}", d)
    cfg = {
        "arch": arch,
        "dim": int(g("embedding_length")),
        "n_layers": int(g("block_count")),
        "n_heads": int(g("attention.head_count")),
        "n_kv_heads": int(g("attention.head_count_kv", g("attention.head_count"))),
        "ffn_dim": int(g("feed_forward_length")),
        "eps": float(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "context_length": int(g("context_length", 32768)),
        "eos_ids": [int(field(r, "tokenizer.ggml.eos_token_id"))],
    }
    cfg["head_dim"] = int(g("attention.key_length", cfg["dim"] // cfg["n_heads"]))
    tensors = {}
    for t in r.tensors:
        if names is not None and t.name not in names:
            continue
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        # ggml's [ne0, ne1] is numpy's [ne1, ne0]: [out, in] for a matrix.
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tensors[t.name] = np.ascontiguousarray(a.reshape(shape), dtype=np.float32)
    cfg["vocab_size"] = int(tensors["token_embd.weight"].shape[0]) if "token_embd.weight" in tensors else None
    return cfg, tensors


def tokenizer_fields(target_path):
    """The target's `tokenizer.*` keys (except a mask id) with their GGUF types."""
    r = gguf.GGUFReader(target_path)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.ggml.mask_token_id":
            continue
        t = f.types
        if t[0] == V.ARRAY:
            out.append((key, f.contents(), V.ARRAY, t[-1]))
        else:
            out.append((key, f.contents(), t[0], None))
    return out


MATRIX_TYPES = {"q8_0": Q.Q8_0, "f16": Q.F16, "f32": Q.F32}


def _matrix(w, qtype):
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == Q.F32:
        return w, None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w, qtype), qtype


def write_drafter(path, weights, cfg, target_path, matrix_type="q8_0", name="hearth DFlash drafter"):
    """weights: GGUF tensor name -> float32 array ([out, in] matrices, [n] norms).

    cfg keys: dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, block_size,
    target_layers, rope_theta, eps, mask_token, context_length, vocab_size.
    """
    qtype = MATRIX_TYPES[matrix_type]
    w = gguf.GGUFWriter(path, "dflash")
    w.add_name(name)
    u32 = lambda k, v: w.add_uint32(f"dflash.{k}", int(v))
    u32("context_length", cfg["context_length"])
    u32("embedding_length", cfg["dim"])
    u32("block_count", cfg["n_layers"])
    u32("feed_forward_length", cfg["ffn_dim"])
    u32("attention.head_count", cfg["n_heads"])
    u32("attention.head_count_kv", cfg["n_kv_heads"])
    u32("attention.key_length", cfg["head_dim"])
    u32("attention.value_length", cfg["head_dim"])
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", float(cfg["eps"]))
    w.add_float32("dflash.rope.freq_base", float(cfg["rope_theta"]))
    u32("block_size", cfg["block_size"])
    w.add_array("dflash.target_layers", [int(x) for x in cfg["target_layers"]])
    if cfg.get("vocab_size"):
        u32("vocab_size", cfg["vocab_size"])
    for key, val, vt, sub in tokenizer_fields(target_path):
        w.add_key_value(key, val, vt, sub_type=sub)
    w.add_uint32("tokenizer.ggml.mask_token_id", int(cfg["mask_token"]))
    for tname, arr in weights.items():
        if arr.ndim == 2:
            data, raw = _matrix(arr, qtype)
            if raw is None:
                w.add_tensor(tname, data)
            else:
                w.add_tensor(tname, data, raw_dtype=raw)
        else:
            w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def drafter_tensor_names(n_layers):
    names = ["fc.weight", "enc.output_norm.weight", "output_norm.weight"]
    for i in range(n_layers):
        names += [
            f"blk.{i}.{n}.weight"
            for n in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                "attn_k_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
            )
        ]
    return names


def read_drafter(path):
    """(cfg, float32 tensors) of a dflash GGUF, for the PyTorch reference forward."""
    r = gguf.GGUFReader(path)
    g = lambda k, d=None: field(r, f"dflash.{k}", d)
    cfg = {
        "dim": int(g("embedding_length")),
        "n_layers": int(g("block_count")),
        "n_heads": int(g("attention.head_count")),
        "n_kv_heads": int(g("attention.head_count_kv")),
        "head_dim": int(g("attention.key_length")),
        "ffn_dim": int(g("feed_forward_length")),
        "block_size": int(g("block_size", 16)),
        "target_layers": [int(x) for x in g("target_layers")],
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "eps": float(g("attention.layer_norm_rms_epsilon")),
        "mask_token": int(field(r, "tokenizer.ggml.mask_token_id")),
    }
    tensors = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tensors[t.name] = np.ascontiguousarray(a.reshape(shape), dtype=np.float32)
    return cfg, tensors
