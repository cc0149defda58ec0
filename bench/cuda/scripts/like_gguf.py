#!/usr/bin/env python3
"""A synthetic GGUF in a real file's exact layout: the same metadata (tokenizer
included), tensor names, types and shapes, with random but valid quantized
blocks (finite scales) instead of the trained weights. For speed comparisons
of hearth and llama.cpp on a model whose file cannot travel (the device call
carries a few MB): `header` cuts the real file's header (everything before the
tensor data) here, `fill` writes the whole file from it there. Speed does not
depend on the values; llama.cpp and hearth both load the result.

  like_gguf.py header REAL.gguf HEADER.bin
  like_gguf.py fill HEADER.bin OUT.gguf [--seed N]

Needs numpy only (no gguf package: the GGUF header is parsed here).
"""
import struct
import sys

import numpy as np

# ggml type id -> (values per block, bytes per block, offsets of f16 scales within the block)
TYPES = {
    0: (1, 4, None),  # F32 (filled with small normal values)
    1: (1, 2, None),  # F16
    2: (32, 18, [0]),  # Q4_0
    3: (32, 20, [0, 2]),  # Q4_1
    6: (32, 22, [0]),  # Q5_0
    7: (32, 24, [0, 2]),  # Q5_1
    8: (32, 34, [0]),  # Q8_0
    10: (256, 84, [80, 82]),  # Q2_K
    11: (256, 110, [108]),  # Q3_K
    12: (256, 144, [0, 2]),  # Q4_K
    13: (256, 176, [0, 2]),  # Q5_K
    14: (256, 210, [208]),  # Q6_K
    30: (1, 2, None),  # BF16
}


class Reader:
    def __init__(self, buf):
        self.b, self.o = buf, 0

    def u(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.u("Q")
        self.o += n
        return self.b[self.o - n : self.o]

    def value(self, t):
        sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        if t in sizes:
            return self.u(sizes[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.u("I"), self.u("Q")
            if et in sizes:
                self.o += n * struct.calcsize("<" + sizes[et])
            else:
                for _ in range(n):
                    self.value(et)
            return None
        raise SystemExit(f"unknown GGUF value type {t} at byte {self.o}")


def parse(buf):
    r = Reader(buf)
    if r.u("I") != 0x46554747:
        raise SystemExit("not a GGUF file")
    version, n_tensors, n_kv = r.u("I"), r.u("Q"), r.u("Q")
    align = 32
    for _ in range(n_kv):
        key = r.string()
        t = r.u("I")
        v = r.value(t)
        if key == b"general.alignment":
            align = v
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.u("Q") for _ in range(r.u("I"))]
        ty, off = r.u("I"), r.u("Q")
        tensors.append((name.decode(), dims, ty, off))
    data = (r.o + align - 1) // align * align
    return version, tensors, data


def tensor_bytes(dims, ty):
    per, nbytes, _ = TYPES[ty]
    n = int(np.prod(dims))
    return n // per * nbytes


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    mode, src, dst = sys.argv[1:4]
    if mode == "header":
        buf = open(src, "rb").read(64 << 20)
        _, tensors, data = parse(buf)
        open(dst, "wb").write(buf[:data])
        print(f"{dst}: {data} header bytes, {len(tensors)} tensors")
        return
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    head = open(src, "rb").read()
    _, tensors, data = parse(head)
    rng = np.random.default_rng(seed)
    with open(dst, "wb") as f:
        f.write(head[:data])
        f.write(b"\0" * (data - len(head)))
        pos = 0
        for name, dims, ty, off in sorted(tensors, key=lambda t: t[3]):
            if ty not in TYPES:
                raise SystemExit(f"{name}: ggml type {ty} not handled")
            f.write(b"\0" * (off - pos))
            n = tensor_bytes(dims, ty)
            per, nbytes, scales = TYPES[ty]
            if ty == 0:
                blob = (rng.standard_normal(n // 4, dtype=np.float32) * 0.05 + (1.0 if "norm" in name else 0.0)).astype("<f4").tobytes()
            elif ty in (1, 30):
                v = (rng.standard_normal(n // 2, dtype=np.float32) * 0.05).astype(np.float32)
                blob = v.astype("<f2").tobytes() if ty == 1 else (v.view(np.uint32) >> 16).astype("<u2").tobytes()
            else:
                # Random quants, then every f16 scale set to a small positive value.
                blocks = rng.integers(0, 256, size=(n // nbytes, nbytes), dtype=np.uint8)
                d = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
                for s in scales:
                    blocks[:, s : s + 2] = d
                blob = blocks.tobytes()
            f.write(blob)
            pos = off + n
    print(f"{dst}: {len(tensors)} tensors, {data + pos} bytes")


main()
