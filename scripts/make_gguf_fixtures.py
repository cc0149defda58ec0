#!/usr/bin/env python3
"""Write GGUF reader fixtures with the independent `gguf` Python package.

    pip install gguf==0.19.0 numpy && python3 scripts/make_gguf_fixtures.py

Outputs (tests/fixtures/gguf/):
  small.gguf        a small file written by gguf-py's GGUFWriter: every metadata
                    value type, arrays of strings, nested arrays, a non-default
                    alignment and tensors of several types.
  small.json        what gguf-py's GGUFReader reads back from it.
  models.json       for each packaged model (fetched by scripts/fetch_models.py):
                    tensor count, tensor types by count, and every tensor's
                    name/type/shape/offset digest as gguf-py reads them.
"""
import hashlib, json, subprocess, sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"


def write_small():
    path = OUT / "small.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 3.25)
    w.add_bool("t.bool", True)
    w.add_string("t.string", "héllo wörld ✓ 🦀")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -1.0e300)
    w.add_array("t.arr_str", ["a", "", "<|im_start|>", "日本語"])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.5])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    w.add_array("t.arr_empty", [])
    rng = np.random.default_rng(7)
    w.add_tensor("f32.weight", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((5,)).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(str(path))
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        meta[f.name] = field_json(f)
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
                "offset": int(t.data_offset), "sha256": hashlib.sha256(bytes(t.data.tobytes())).hexdigest()}
               for t in r.tensors]
    (OUT / "small.json").write_text(json.dumps({"metadata": meta, "tensors": tensors}, indent=1, ensure_ascii=False) + "\n")


def field_json(f):
    types = f.types
    def conv(t, v):
        if t == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8")
        x = v.tolist()[0] if hasattr(v, "tolist") else v
        return x
    if types[0] != gguf.GGUFValueType.ARRAY:
        return {"type": types[0].name, "value": conv(types[0], f.parts[f.data[0]])}
    return {"type": "ARRAY", "value": f.contents()}


def model_summary(path):
    r = gguf.GGUFReader(str(path))
    counts = {}
    digest = hashlib.sha256()
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        digest.update(f"{t.name}|{t.tensor_type.name}|{[int(x) for x in t.shape]}|{int(t.data_offset)}\n".encode())
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    return {"architecture": arch, "tensor_count": len(r.tensors), "tensor_types": counts,
            "metadata_count": sum(1 for k in r.fields if not k.startswith("GGUF.")),
            "tensor_digest": digest.hexdigest()}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_small()
    names = [m["name"] for m in json.loads((ROOT / "models" / "registry.json").read_text())["models"]]
    out = {}
    for n in names:
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_models.py"), n],
                           check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        out[n] = model_summary(p)
    (OUT / "models.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
