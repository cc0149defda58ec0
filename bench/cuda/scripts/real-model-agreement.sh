#!/usr/bin/env bash
# A real model on the GPU against llama.cpp's CUDA backend (issue 20):
# qwen2.5-coder-0.5b-instruct Q4_K_M (the packaged file, 491 MB), brought to
# the device machine in 50 MiB chunks because one call carries at most 64 MiB
# all told (working tree included).
#
# Here (the CPU machine):
#   split -b 50M -d MODEL.gguf /tmp/chunks/part          # part00 .. part09 (part09: 19 MB)
#   .gpu/ = hearth.gz, gpu_tests.gz, teacher_top1.gz (stripped, gzipped release builds:
#           target/release/hearth, target/release/deps/gpu-*, examples/teacher_top1),
#           tok.gguf, g3h.bin.gz, COMMIT (vision-gpu.sh), llama-src.tar.xz (llama.cpp 11434's
#           source without models/docs/tests/other backends), part09.
# The tracked tree is 47 MiB, 35 of them the packaged DFlash drafter: for calls
# 1-10 take it out of the index (`git rm -q --cached models/drafters/*.gguf`,
# and list it in .git/info/exclude) so a call's tree is 12 MiB; put it back
# (`git reset -q models/drafters`, un-exclude) for call 11, whose GPU test needs it.
# Commit nothing in between.
#
# Device calls, chained while the machine stays warm (files under /dev/shm survive):
#   1. carry .gpu (above):  real-model-agreement.sh stage && bench/cuda/scripts/vision-gpu.sh tests
#        (stage moves them to /dev/shm/h, unpacks the binaries, starts the llama.cpp
#        CUDA build in the background)
#   2. carry .gpu = {part00}: real-model-agreement.sh stage bench
#        (bench: vision-gpu.sh's `round13` measurements run in the background while
#        the chunks travel; the llama.cpp build beside them runs at nice 19)
#   3..10. carry .gpu = {part01 .. part08}: real-model-agreement.sh stage
#   11. (drafter back in the tree) real-model-agreement.sh run
#
# `run` joins the chunks, checks the sha256, waits for the build and the
# background benchmarks, then:
#   - llama.cpp CUDA (-ngl 99, flash attention) greedily continues each prompt of
#     bench/cuda/prompts-agreement.txt for 256 tokens (scripts/reference/teacher_dump.cpp);
#     the same with -ngl 0 (llama.cpp's CPU backend) as a control;
#   - hearth --device cuda, teacher-forced on llama.cpp's tokens: top-1 agreement
#     over the 6 x 256 positions, and its own greedy 64 tokens vs llama.cpp's;
#   - the same against llama.cpp's CPU continuation, and hearth's CPU backend;
#   - the GPU test that needs this file (DFlash speculative decoding with the
#     packaged drafter gives plain greedy decoding's tokens);
#   - hearth bench --device cuda and llama-bench -ngl 99 -fa 1 on the file.
set -u
cd "$(dirname "$0")/../../.."
S=/dev/shm/h
mkdir -p $S
O=${OUT:-${HEARTH_LOGS:-/tmp/hearth-logs}}  # logs: outside the repository
stage() {
  for f in .gpu/*; do [ -e "$f" ] && mv "$f" $S/; done
  for b in hearth gpu_tests teacher_top1; do
    if [ -f $S/$b.gz ]; then gunzip -f $S/$b.gz && chmod +x $S/$b; fi
  done
  # The llama.cpp CUDA build (background, nice 19): vision-gpu.sh's llama-build phase.
  [ -f $S/llama-src.tar.xz ] && bash bench/cuda/scripts/vision-gpu.sh llama-build
  ls -la $S | grep -vE " \.\.?$"
}
case "${1:-}" in
stage)
  stage
  if [ "${2:-}" = bench ] && [ ! -f $S/BG_STARTED ]; then
    # vision-gpu.sh round13 from a copy of the scripts (the tree is replaced by the next call).
    rm -rf $S/repo && mkdir -p $S/repo && cp -r bench $S/repo/
    touch $S/BG_STARTED
    # (a subshell around this launch kept the caller's stdout open: the call never ended)
    setsid nohup bash -c "cd $S/repo && OUT=$S/bgout bash bench/cuda/scripts/vision-gpu.sh round13 \
      > $S/bg.log 2>&1; echo \$? > $S/BG_DONE" > /dev/null 2>&1 < /dev/null &
    echo "round13 measurements started in the background"
  fi
  ;;
run)
  stage
  cat $S/part00 $S/part01 $S/part02 $S/part03 $S/part04 $S/part05 $S/part06 $S/part07 $S/part08 $S/part09 \
    > $S/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  ln -sf $S/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf $S/q05.gguf
  echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $S/q05.gguf" | sha256sum -c || exit 1
  rm -f $S/part0?
  while [ ! -f $S/BUILT ]; do sleep 5; done
  echo "llama.cpp build exit status: $(cat $S/BUILT)"; tail -3 $S/build.log
  if [ -f $S/BG_STARTED ]; then
    while [ ! -f $S/BG_DONE ]; do sleep 5; done
    echo "background round13 exit status: $(cat $S/BG_DONE)"
    mkdir -p $O && cp $S/bgout/*.log $O/ 2>/dev/null; tail -5 $S/bg.log
  fi
  L=$S/llama.cpp
  g++ -O2 -std=c++17 scripts/reference/teacher_dump.cpp -I$L/include -I$L/ggml/include -L$L/build/bin \
    -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o $S/teacher_dump || exit 1
  P=bench/cuda/prompts-agreement.txt
  {
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
g = 0
for x, y in zip(a, b):
    d = next((i for i, (p, q) in enumerate(zip(x["greedy_ids"], y["greedy_ids"])) if p != q), None)
    g += x["greedy_ids"][:64] == y["greedy_ids"][:64]
    print(f"greedy 256: first difference at {d}")
print(f"llama.cpp CPU and CUDA greedy 64-token continuations identical on {g} of {len(a)}")
PY
  echo "== GPU test on the packaged file and drafter"
  HEARTH_MODELS=$S HEARTH_TOK_GGUF=$S/tok.gguf $S/gpu_tests --ignored --nocapture --exact \
    greedy_speculative_equals_plain_greedy_qwen_05b 2>&1 | grep -vE "^cuda:   gemv" | tail -25
  echo "== speed"
  $S/hearth bench --device cuda -m $S/q05.gguf -p 512 -n 128 -r 3 --roofline 2>&1 | grep -vE "^cuda:   gemv" | tail -6
  $L/build/bin/llama-bench -m $S/q05.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "model|---|pp512|tg128"
  } 2>&1 | tee $O/real-model.log
  ;;
*) echo "usage: $0 stage [bench] | run"; exit 2 ;;
esac
