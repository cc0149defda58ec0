#!/usr/bin/env bash
# Image encode time: hearth's CPU vision tower vs llama.cpp's llama-mtmd-cli, on the same
# synthetic full-size Muse Glimmer mmproj (50 blocks, width 1536, F16; generated here with
# `hearth synth --preset muse-glimmer-mmproj`), the same image and thread count, in one run.
#
#   bench/vision-encode.sh SIZE THREADS [ROUNDS]      e.g. bench/vision-encode.sh 896 2 1
#
# SIZE: the side of a square image of the spec's synthetic pattern (896: 64x64 patches,
# 1024 image tokens; 448: 32x32 patches, 256 tokens). llama-mtmd-cli needs a text model of
# the projector's width (6656): a 1-layer qwen2 of that width with SmolLM2's tokenizer is
# synthesized once. llama.cpp's figure is its own "mtmd batch encoding done in N ms" line
# (mtmd_batch_encode; its warmup only reserves the graph and turns flash attention on;
# preprocessing not included);
# hearth's is one MmProj::encode_in call of crates/vision/examples/encode.rs (preprocessing
# included, file load not). Alternates hearth, llama.cpp; machines here are shared, so
# only ratios from one run count.
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:?usage: bench/vision-encode.sh SIZE THREADS [ROUNDS]}"
threads="${2:?usage: bench/vision-encode.sh SIZE THREADS [ROUNDS]}"
rounds="${3:-1}"
bin=$(bash scripts/build-llamacpp.sh | tail -n 1)
cargo build --release -q -p hearth -p hearth-vision --example encode
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
hearth="$target_dir/release/hearth"
encode="$target_dir/release/examples/encode"
cache="${HEARTH_REF_CACHE:-$HOME/.cache/hearth-ref}/vision"
mkdir -p "$cache"
mmproj="$cache/muse-glimmer-mmproj-f16.gguf"
text="$cache/qwen2-d6656-1l.gguf"
[[ -f "$mmproj" ]] || "$hearth" synth --preset muse-glimmer-mmproj --seed 1 -o "$mmproj" >&2
if [[ ! -f "$text" ]]; then
  smol=$(python3 scripts/fetch_models.py smollm2-135m | tail -n 1)
  "$hearth" synth --arch qwen2 --layers 1 --dim 6656 --heads 52 --kv-heads 4 --ffn 256 \
    --tokenizer-from "$smol" -o "$text" >&2
fi
img="$cache/pattern-${size}.png"
[[ -f "$img" ]] || python3 - "$size" "$img" <<'PY'
import struct, sys, zlib
n, path = int(sys.argv[1]), sys.argv[2]
rows = b"".join(b"\0" + bytes(v for x in range(n) for v in (
    (37 * x + 11 * y) % 256, 255 if (x < n // 3 and y < n // 2) else 16, (x * x + 3 * y * y) % 256))
    for y in range(n))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", n, n, 8, 2, 0, 0, 0))
                       + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
echo "machine: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: hearth" >&2
  h=$("$encode" "$mmproj" "$img" --threads "$threads" | tail -n 1)
  echo "  $h" >&2
  echo "round $r/$rounds: llama.cpp" >&2
  l=$("$bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" --image "$img" -p "describe" -n 1 -t "$threads" \
        -c 4096 -b 2048 -ub 2048 --temp 0 2>&1 | grep -E "encoded in|encoding done in" | tr '\n' ' ')
  echo "  $l" >&2
  hm=$(sed -E 's/.*: ([0-9.]+) ms.*/\1/' <<< "$h")
  lm=$(sed -E 's/.*(encoded in|encoding done in) ([0-9]+) ms.*/\2/' <<< "$l")
  python3 -c "import sys; h, l = float(sys.argv[1]), float(sys.argv[2]); print(f'round $r: hearth {h/1e3:.1f} s, llama.cpp {l/1e3:.1f} s, llama.cpp/hearth {l/h:.2f}x')" "$hm" "$lm"
done
