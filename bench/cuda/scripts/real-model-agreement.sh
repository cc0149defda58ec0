#!/usr/bin/env bash
# A real model on the GPU against llama.cpp's CUDA backend (issue 20):
# qwen2.5-coder-0.5b-instruct Q4_K_M (the packaged file, 491 MB), brought to
# the device machine in 50 MiB chunks because one call carries at most 64 MiB.
#
# Here (the CPU machine):
#   split -b 50M -d MODEL.gguf /tmp/chunks/part      # part00 .. part09
#   strip copies of target/ci/hearth and target/ci/examples/teacher_top1 into .gpu/,
#   plus .gpu/llama-src.tar.xz (llama.cpp 11434's source without models/docs).
# Device calls, chained while the machine stays warm (files under /dev/shm survive):
#   1. carry .gpu = {llama-src.tar.xz, part09, hearth, teacher_top1}:
#        bench/cuda/scripts/real-model-agreement.sh stage    (moves them to /dev/shm,
#        starts the llama.cpp CUDA build in the background)
#   2..9. carry .gpu = {partNN}: bench/cuda/scripts/real-model-agreement.sh stage
#   10. carry .gpu = {part08}: bench/cuda/scripts/real-model-agreement.sh run
#
# `run` joins the chunks, checks the sha256, waits for the build, then:
#   - llama.cpp CUDA (-ngl 99, flash attention) greedily continues each prompt of
#     bench/cuda/prompts-agreement.txt for 256 tokens (scripts/teacher_dump.cpp);
#     the same with -ngl 0 (llama.cpp's CPU backend) as a control;
#   - hearth --device cuda, teacher-forced on llama.cpp's tokens: top-1 agreement
#     over the 6 x 256 positions, and its own greedy 64 tokens vs llama.cpp's;
#   - the same against llama.cpp's CPU continuation, and hearth's CPU backend;
#   - hearth bench --device cuda and llama-bench -ngl 99 -fa 1 on the file.
set -u
cd "$(dirname "$0")/../../.."
S=/dev/shm/rm
mkdir -p $S
case "${1:-}" in
stage)
  for f in .gpu/*; do mv "$f" $S/; done
  if [ -f $S/llama-src.tar.xz ] && [ ! -d $S/llama.cpp ]; then
    tar xJf $S/llama-src.tar.xz -C $S && rm $S/llama-src.tar.xz
    cd $S/llama.cpp
    setsid nohup bash -c "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $S/cmake.log 2>&1 \
      && cmake --build build -j16 --target llama-bench llama > $S/build.log 2>&1; echo \$? > $S/BUILT" \
      > /dev/null 2>&1 < /dev/null &
    echo "llama.cpp CUDA build started"
  fi
  ls -la $S; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  ;;
run)
  for f in .gpu/*; do mv "$f" $S/; done
  cat $S/part00 $S/part01 $S/part02 $S/part03 $S/part04 $S/part05 $S/part06 $S/part07 $S/part08 $S/part09 > $S/q05.gguf
  echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $S/q05.gguf" | sha256sum -c || exit 1
  while [ ! -f $S/BUILT ]; do sleep 5; done
  echo "llama.cpp build exit status: $(cat $S/BUILT)"; tail -3 $S/build.log
  L=$S/llama.cpp
  g++ -O2 -std=c++17 scripts/teacher_dump.cpp -I$L/include -I$L/ggml/include -L$L/build/bin \
    -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o $S/teacher_dump || exit 1
  O=${OUT:-/tmp}
  P=bench/cuda/prompts-agreement.txt
  echo "== llama.cpp CUDA greedy (256 tokens per prompt)"
  $S/teacher_dump $S/q05.gguf $P 256 $O/llama-cuda.json 99 2>&1 | grep teacher_dump
  echo "== llama.cpp CPU greedy (control)"
  $S/teacher_dump $S/q05.gguf $P 256 $O/llama-cpu.json 0 16 2>&1 | grep teacher_dump
  echo "== hearth --device cuda vs llama.cpp CUDA"
  $S/teacher_top1 $S/q05.gguf $O/llama-cuda.json cuda 64
  echo "== hearth --device cuda vs llama.cpp CPU"
  $S/teacher_top1 $S/q05.gguf $O/llama-cpu.json cuda 64
  echo "== hearth CPU vs llama.cpp CPU (control; this machine's llama.cpp build is not native)"
  $S/teacher_top1 $S/q05.gguf $O/llama-cpu.json cpu 64
  echo "== llama.cpp CPU vs llama.cpp CUDA (their own agreement)"
  python3 - $O/llama-cpu.json $O/llama-cuda.json <<'PY'
import json, sys
a, b = (json.load(open(f))["prompts"] for f in sys.argv[1:3])
same = tot = g = 0
for x, y in zip(a, b):
    n = len(x["greedy_ids"]); tot += n
    d = next((i for i, (p, q) in enumerate(zip(x["greedy_ids"], y["greedy_ids"])) if p != q), None)
    g += x["greedy_ids"][:64] == y["greedy_ids"][:64]
    print(f"greedy 256: first difference at {d}")
print(f"llama.cpp CPU and CUDA greedy 64-token continuations identical on {g} of {len(a)}")
PY
  echo "== speed"
  $S/hearth bench --device cuda -m $S/q05.gguf -p 512 -n 128 -r 3 2>&1 | tail -4
  $L/build/bin/llama-bench -m $S/q05.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "model|---|pp512|tg128"
  ;;
*) echo "usage: $0 stage|run"; exit 2 ;;
esac
