#!/usr/bin/env bash
# gemma3-270m (the packaged Q4_K_M file) on the GPU: greedy text on CUDA vs the CPU backend, and speed.
set -u
cd "$(dirname "$0")/../../.."  # the repository root, where .gpu/ is carried
cat /dev/shm/part00 /dev/shm/part01 /dev/shm/part02 /dev/shm/part03 .gpu/part04 > /dev/shm/g3.gguf
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  /dev/shm/g3.gguf" | sha256sum -c || exit 1
H=.gpu/hearth
export HEARTH_HOME=/dev/shm/hh
prompts=(
  "The capital of France is"
  "Write a Python function that reverses a string."
  "List three prime numbers greater than 50."
  "Explain what a hash map is in two sentences."
  "def fibonacci(n):"
  "Translate 'good morning' into Spanish and German."
)
same=0
for i in "${!prompts[@]}"; do
  p=${prompts[$i]}
  $H run -m /dev/shm/g3.gguf --device cuda -p "$p" -n 64 --temp 0 > /tmp/cuda.$i 2> /tmp/cuda.$i.err || { echo "cuda run failed"; cat /tmp/cuda.$i.err; }
  $H run -m /dev/shm/g3.gguf --device cpu -t 16 -p "$p" -n 64 --temp 0 > /tmp/cpu.$i 2> /tmp/cpu.$i.err || { echo "cpu run failed"; cat /tmp/cpu.$i.err; }
  if cmp -s /tmp/cuda.$i /tmp/cpu.$i; then r=identical; same=$((same+1)); else r=DIFFERENT; fi
  echo "== prompt $i: $p -> $r"
  echo "-- cuda: $(tr '\n' ' ' < /tmp/cuda.$i)"
  [ "$r" = identical ] || echo "-- cpu:  $(tr '\n' ' ' < /tmp/cpu.$i)"
  tail -1 /tmp/cuda.$i.err
done
echo "greedy 64-token answers identical on CUDA and CPU: $same of ${#prompts[@]}"
$H bench --device cuda -m /dev/shm/g3.gguf -p 512 -n 128 -r 3 2>&1 | tail -6
$H bench -m /dev/shm/g3.gguf -p 512 -n 128 -r 1 -t 16 2>&1 | tail -4
