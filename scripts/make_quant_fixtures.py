#!/usr/bin/env python3
"""Writes the quantization fixtures in tests/fixtures/quant/ (read by crates/kernels/tests).

Run from the repository root (Python 3.11, numpy, gguf==0.19.0, gcc):

    bash scripts/build-llamacpp.sh        # once: builds llama.cpp's libggml-base.a
    python3 scripts/make_quant_fixtures.py

Inputs: the packaged models in ~/.cache/hearth/models (override with HEARTH_MODELS) and
llama.cpp's libggml-base.a (HEARTH_GGML_BASE, default under ~/.cache/hearth-ref). Output is
deterministic (fixed seeds), so rerunning reproduces the committed files byte for byte.

Dequantization fixtures (dequant/): for each type, block bytes and the expected f32 values.
  - real: blocks cut from tensors of the packaged models. Only F32, Q4_1, Q5_0, Q8_0, Q4_K
    and Q6_K occur there; F16, BF16, Q4_0, Q5_1, Q2_K, Q3_K, Q5_K and Q8_K get random
    blocks only.
  - random: random bytes whose f16 scales are mostly sane values (plus zeros and f16
    subnormals); some blocks have one special scale (inf, NaN, signaling NaN, -0, 65504). At most one special per block: when two different NaNs meet in one f32
    operation, which payload survives is up to the hardware and compiler.
  Expected values are `gguf.quants.dequantize` output, with two documented exceptions:
  Q8_K (gguf-py has no Q8_K) uses a numpy transcription of ggml's dequantize_row_q8_K
  (`d * q` in f32); F16 signaling NaNs are quieted (quiet bit set), because numpy widens
  f16 sNaN bit for bit while ggml (portable and F16C paths) and IEEE 754 quiet them.
  Every expected file is then checked bit for bit against ggml's own dequantize_row_*.

Quantization fixtures (quantize/): f32 inputs and ggml's quantize_row_*_ref output for
Q4_0 (the q4_0 KV cache), Q8_0, Q8_K, Q4_K, Q5_K, Q6_K. For Q4_0 and Q8_0 the script also
requires `gguf.quants.quantize` to produce the same bytes (gguf-py has no quantizer for the
other four types).

Layout: index.json lists every file with its type, value count and provenance. Binary
files are raw: `.blocks`/`.bin` hold GGUF block bytes, `.f32` little-endian float32.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "quant"
MODELS = Path(os.environ.get("HEARTH_MODELS", Path.home() / ".cache" / "hearth" / "models"))
GGML_BASE = Path(
    os.environ.get(
        "HEARTH_GGML_BASE",
        Path.home() / ".cache/hearth-ref/build-11434.0.0-cpu/ggml/src/libggml-base.a",
    )
)

DEQUANT_TYPES = [
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K,
]
QUANT_TYPES = [T.Q4_0, T.Q8_0, T.Q8_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Real blocks: (model file, tensor, short source name). 4096 values from each, cut from
# about a third of the way into the tensor.
REAL_SOURCES = {
    T.F32: [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.attn_norm.weight", "smollm2"),
        ("gemma-3-270m-q4_k_m.gguf", "output_norm.weight", "gemma3"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.0.attn_q.bias", "qwen05"),
    ],
    T.Q4_1: [("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.ffn_down.weight", "smollm2")],
    T.Q5_0: [
        ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_q.weight", "gemma3"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "token_embd.weight", "qwen05"),
    ],
    T.Q8_0: [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight", "smollm2"),
        ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_v.weight", "gemma3"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "output.weight", "qwen05"),
    ],
    T.Q4_K: [
        ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_output.weight", "gemma3"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.11.ffn_down.weight", "qwen05"),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "token_embd.weight", "qwen15"),
    ],
    T.Q6_K: [
        ("gemma-3-270m-q4_k_m.gguf", "blk.0.ffn_down.weight", "gemma3"),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "output.weight", "qwen15"),
    ],
}
REAL_VALUES = 4096
RANDOM_VALUES = 8192

# Byte offsets of the f16 scale fields inside each block (ggml-common.h).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
F16_SPECIALS = np.array([0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFE21, 0x7BFF, 0x8000], np.uint16)
BF16_SPECIALS = np.array([0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFA1, 0x7F7F, 0x8000], np.uint16)
F32_SPECIALS = np.array(
    [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFA00000, 0x80000000, 0x00000001,
     0x7F7FFFFF], np.uint32)

# A tiny C driver over ggml's own reference kernels: `driver (dequant|quant) TYPE < in > out`.
DRIVER_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define DEQ(name) void dequantize_row_##name(const void *, float *, int64_t);
#define QREF(name) void quantize_row_##name##_ref(const float *, void *, int64_t);
DEQ(q4_0) DEQ(q4_1) DEQ(q5_0) DEQ(q5_1) DEQ(q8_0) DEQ(q2_K) DEQ(q3_K) DEQ(q4_K) DEQ(q5_K)
DEQ(q6_K) DEQ(q8_K)
QREF(q4_0) QREF(q8_0) QREF(q8_K) QREF(q4_K) QREF(q5_K) QREF(q6_K)
void ggml_fp16_to_fp32_row(const uint16_t *, float *, int64_t);
void ggml_bf16_to_fp32_row(const uint16_t *, float *, int64_t);
static void deq_f16(const void *x, float *y, int64_t k) { ggml_fp16_to_fp32_row(x, y, k); }
static void deq_bf16(const void *x, float *y, int64_t k) { ggml_bf16_to_fp32_row(x, y, k); }
static void deq_f32(const void *x, float *y, int64_t k) { memcpy(y, x, 4 * k); }
typedef void (*deq_fn)(const void *, float *, int64_t);
typedef void (*q_fn)(const float *, void *, int64_t);
static const struct { const char *name; int64_t block, size; deq_fn deq; q_fn quant; } types[] = {
  {"F32", 1, 4, deq_f32, 0}, {"F16", 1, 2, deq_f16, 0}, {"BF16", 1, 2, deq_bf16, 0},
  {"Q4_0", 32, 18, dequantize_row_q4_0, quantize_row_q4_0_ref}, {"Q4_1", 32, 20, dequantize_row_q4_1, 0},
  {"Q5_0", 32, 22, dequantize_row_q5_0, 0}, {"Q5_1", 32, 24, dequantize_row_q5_1, 0},
  {"Q8_0", 32, 34, dequantize_row_q8_0, quantize_row_q8_0_ref},
  {"Q2_K", 256, 84, dequantize_row_q2_K, 0}, {"Q3_K", 256, 110, dequantize_row_q3_K, 0},
  {"Q4_K", 256, 144, dequantize_row_q4_K, quantize_row_q4_K_ref},
  {"Q5_K", 256, 176, dequantize_row_q5_K, quantize_row_q5_K_ref},
  {"Q6_K", 256, 210, dequantize_row_q6_K, quantize_row_q6_K_ref},
  {"Q8_K", 256, 292, dequantize_row_q8_K, quantize_row_q8_K_ref},
};
int main(int argc, char **argv) {
  if (argc != 3) return 2;
  size_t cap = 1 << 20, len = 0, n;
  unsigned char *in = malloc(cap);
  while ((n = fread(in + len, 1, cap - len, stdin)) > 0) {
    len += n;
    if (len == cap) in = realloc(in, cap *= 2);
  }
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    if (strcmp(types[t].name, argv[2]) != 0) continue;
    if (strcmp(argv[1], "dequant") == 0) {
      int64_t k = (int64_t)len / types[t].size * types[t].block;
      float *y = malloc(4 * k + 4);
      types[t].deq(in, y, k);
      fwrite(y, 4, k, stdout);
      return 0;
    }
    if (strcmp(argv[1], "quant") == 0 && types[t].quant) {
      int64_t k = (int64_t)len / 4;
      size_t out_len = k / types[t].block * types[t].size;
      void *y = calloc(1, out_len + 1);
      types[t].quant((const float *)in, y, k);
      fwrite(y, 1, out_len, stdout);
      return 0;
    }
  }
  return 3;
}
"""


class Ggml:
    """ggml's reference kernels, through the driver linked against libggml-base.a."""

    def __init__(self, workdir: Path):
        if not GGML_BASE.exists():
            sys.exit(f"{GGML_BASE} not found: run scripts/build-llamacpp.sh or set HEARTH_GGML_BASE")
        src = workdir / "driver.c"
        src.write_text(DRIVER_C)
        self.exe = workdir / "driver"
        subprocess.run(
            ["gcc", "-O1", "-ffp-contract=off", str(src), str(GGML_BASE), "-o", str(self.exe),
             "-lm", "-lstdc++", "-fopenmp", "-lpthread"],
            check=True,
        )

    def _run(self, op: str, qtype: T, data: bytes) -> bytes:
        res = subprocess.run([str(self.exe), op, qtype.name], input=data, capture_output=True)
        if res.returncode != 0:
            raise RuntimeError(f"ggml driver {op} {qtype.name} failed: {res.returncode}")
        return res.stdout

    def dequantize(self, qtype: T, blocks: bytes) -> np.ndarray:
        return np.frombuffer(self._run("dequant", qtype, blocks), dtype="<u4")

    def quantize(self, qtype: T, values: np.ndarray) -> bytes:
        return self._run("quant", qtype, values.astype("<f4").tobytes())


def sane_f16(rng: np.random.Generator, shape) -> np.ndarray:
    """Scale values as a quantizer writes them, plus exact zeros and f16 subnormals."""
    mag = 10.0 ** rng.uniform(-4.5, 0.0, size=shape)
    sign = np.where(rng.random(shape) < 0.8, 1.0, -1.0)
    bits = (sign * mag).astype(np.float16).view(np.uint16)
    kind = rng.random(shape)
    bits = np.where(kind < 0.04, np.uint16(0), bits)
    subnormal = rng.integers(1, 0x400, size=shape, dtype=np.uint16)
    return np.where((kind >= 0.04) & (kind < 0.08), subnormal, bits).astype(np.uint16)


def random_blocks(qtype: T, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = RANDOM_VALUES // block_size
    if qtype == T.F32:
        vals = (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-3, 3, n_blocks))
        bits = vals.astype("<f4").view("<u4")
        special = rng.random(n_blocks) < 0.03
        bits[special] = rng.choice(F32_SPECIALS, special.sum())
        return bits.tobytes()
    if qtype in (T.F16, T.BF16):
        # Uniform bit patterns (subnormals, NaNs of all kinds), plus some infinities and
        # signaling NaNs for sure.
        bits = rng.integers(0, 1 << 16, size=n_blocks, dtype="<u2")
        specials = F16_SPECIALS if qtype == T.F16 else BF16_SPECIALS
        special = rng.random(n_blocks) < 0.02
        bits[special] = rng.choice(specials, special.sum())
        return bits.tobytes()

    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    # Special scales in about one block in ten (one in four for the 32-block k-quant
    # fixtures), cycling through the list so that each one occurs.
    has_special = rng.random(n_blocks) < (0.25 if block_size == 256 else 0.1)
    rows = np.nonzero(has_special)[0]
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks))
        bits = d.astype("<f4").view("<u4")
        bits[rows] = np.resize(F32_SPECIALS, len(rows))
        blocks[:, 0:4] = bits.view(np.uint8).reshape(n_blocks, 4)
        return blocks.tobytes()

    fields = F16_FIELDS[qtype]
    scales = sane_f16(rng, (n_blocks, len(fields)))
    which_field = rng.integers(0, len(fields), n_blocks)
    scales[rows, which_field[rows]] = np.resize(F16_SPECIALS, len(rows))
    for i, off in enumerate(fields):
        blocks[:, off:off + 2] = scales[:, i].astype("<u2").view(np.uint8).reshape(n_blocks, 2)
    return blocks.tobytes()


@functools.cache
def reader(model: str) -> gguf.GGUFReader:
    return gguf.GGUFReader(MODELS / model)


def real_blocks(model: str, tensor: str, qtype: T) -> tuple[bytes, str]:
    t = next(t for t in reader(model).tensors if t.name == tensor)
    assert t.tensor_type == qtype, (model, tensor, t.tensor_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
    total_blocks = len(data) // type_size
    n_blocks = min(REAL_VALUES // block_size, total_blocks)
    first = (total_blocks // 3) // 8 * 8
    first = min(first, total_blocks - n_blocks)
    chunk = data[first * type_size:(first + n_blocks) * type_size].tobytes()
    return chunk, f"{model}:{tensor} blocks {first}..{first + n_blocks}"


def gguf_reference(qtype: T, blocks: bytes) -> tuple[np.ndarray, str]:
    """Expected f32 bits per the gguf package (see the module docstring for the exceptions)."""
    raw = np.frombuffer(blocks, dtype=np.uint8)
    if qtype == T.Q8_K:
        b = raw.reshape(-1, GGML_QUANT_SIZES[T.Q8_K][1])
        d = b[:, 0:4].copy().view("<f4")
        q = b[:, 4:260].view(np.int8).astype(np.float32)
        return (d * q).astype("<f4").reshape(-1).view("<u4"), "numpy: ggml dequantize_row_q8_K (d * q)"
    out = gguf.quants.dequantize(raw.copy(), qtype).astype("<f4").reshape(-1).view("<u4").copy()
    note = f"gguf {gguf_version()} quants.dequantize"
    if qtype == T.F16:
        h = raw.view("<u2")
        snan = ((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0) & ((h & 0x0200) == 0)
        out[snan] |= np.uint32(0x00400000)
        note += f" (f16 signaling NaNs quieted as in ggml: {int(snan.sum())} values)"
    return out, note


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")


def write(rel: str, data: bytes) -> str:
    path = OUT / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return rel


def dequant_fixtures(ggml: Ggml) -> list[dict]:
    entries = []
    cases = []
    for qtype in DEQUANT_TYPES:
        for model, tensor, short in REAL_SOURCES.get(qtype, []):
            blocks, origin = real_blocks(model, tensor, qtype)
            cases.append((qtype, f"real-{short}", blocks, origin))
        seed = 1000 + int(qtype)
        cases.append((qtype, "random", random_blocks(qtype, seed), f"random, seed {seed}"))

    for qtype, source, blocks, origin in cases:
        expected, reference = gguf_reference(qtype, blocks)
        from_ggml = ggml.dequantize(qtype, blocks)
        differ = np.nonzero(expected != from_ggml)[0]
        if len(differ):
            i = differ[0]
            sys.exit(f"{qtype.name} {source}: gguf-py and ggml differ at {len(differ)} values, "
                     f"first {i}: {expected[i]:#010x} vs {from_ggml[i]:#010x}")
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        stem = f"dequant/{qtype.name.lower()}.{source}"
        entries.append({
            "type": qtype.name,
            "source": source,
            "origin": origin,
            "n_blocks": len(blocks) // type_size,
            "n_values": len(blocks) // type_size * block_size,
            "blocks": write(stem + ".blocks", blocks),
            "expected": write(stem + ".f32", expected.astype("<u4").tobytes()),
            "reference": reference + "; equal to ggml dequantize_row_*",
        })
    return entries


def quant_inputs() -> dict[str, tuple[np.ndarray, str]]:
    rng = np.random.default_rng(7)
    n_super = 32
    gaussian = rng.standard_normal((n_super, 256)) * 10.0 ** rng.uniform(-3, 1, (n_super, 1))

    model = reader("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    t = next(t for t in model.tensors if t.name == "blk.0.attn_q.weight")
    weights = gguf.quants.dequantize(np.ascontiguousarray(t.data[:6]), t.tensor_type)
    weights = weights.reshape(-1)[:8192]

    def block(f):
        return np.asarray(f(np.arange(256)), dtype=np.float64)

    edge = [
        block(lambda i: np.zeros(256)),
        block(lambda i: np.full(256, 0.5)),
        block(lambda i: np.full(256, -3.0)),
        block(lambda i: np.where(i == 77, 100.0, 1e-3 * np.sin(i))),  # one outlier
        block(lambda i: i / 255.0),  # all non-negative ramp
        block(lambda i: -(i % 17) - 1.0),  # all negative
        block(lambda i: 1e-6 * np.cos(i * 0.37)),  # f16-subnormal scales
        block(lambda i: np.where((i // 32) % 2 == 0, 0.0, np.sin(i))),  # zero groups
        block(lambda i: (i % 9 - 4) * 0.5),  # many exact ties
        block(lambda i: 1e3 * np.sin(i * 1.3) ** 3),
        rng.standard_normal(256) * np.where(rng.random(256) < 0.05, 50.0, 1.0),  # heavy tails
    ]
    return {
        "gaussian": (gaussian.reshape(-1).astype(np.float32), "N(0,1) per super-block scaled by 10^U(-3,1), seed 7"),
        "real": (weights.astype(np.float32), f"qwen2.5-coder-1.5b {t.name} ({t.tensor_type.name}) dequantized, first 8192 values"),
        "edge": (np.concatenate(edge).astype(np.float32), "zeros, constants, outlier, ramps, tiny, zero groups, ties, large, heavy tails (one 256-block each)"),
    }


def quant_fixtures(ggml: Ggml) -> list[dict]:
    entries = []
    for name, (values, origin) in quant_inputs().items():
        inp = write(f"quantize/{name}.f32", values.astype("<f4").tobytes())
        for qtype in QUANT_TYPES:
            out = ggml.quantize(qtype, values)
            refs = [f"ggml quantize_row_{qtype.name.lower().replace('_k', '_K')}_ref"]
            if qtype in (T.Q4_0, T.Q8_0):
                ours = gguf.quants.quantize(values, qtype).tobytes()
                if ours != out:
                    sys.exit(f"{name}: gguf-py and ggml {qtype.name} quantization differ")
                refs.append(f"gguf {gguf_version()} quants.quantize (identical)")
            entries.append({
                "type": qtype.name,
                "input": inp,
                "input_origin": origin,
                "n_values": len(values),
                "output": write(f"quantize/{name}.{qtype.name.lower()}.bin", out),
                "reference": "; ".join(refs),
            })
    return entries


def main() -> None:
    np.seterr(all="ignore")  # the random blocks make NaNs and infinities on purpose
    for old in OUT.glob("**/*"):
        if old.is_file():
            old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        ggml = Ggml(Path(tmp))
        index = {
            "generator": "scripts/make_quant_fixtures.py",
            "gguf_version": gguf_version(),
            "numpy_version": np.__version__,
            "ggml": str(GGML_BASE.relative_to(Path.home())) if GGML_BASE.is_relative_to(Path.home()) else str(GGML_BASE),
            "format": ".blocks/.bin: raw GGUF block bytes; .f32: little-endian float32 (compare bit patterns)",
            "dequantize": dequant_fixtures(ggml),
            "quantize": quant_fixtures(ggml),
        }
    (OUT / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.glob("**/*") if p.is_file())
    print(f"wrote {len(index['dequantize'])} dequantize and {len(index['quantize'])} quantize "
          f"fixtures to {OUT.relative_to(REPO)} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
