#!/usr/bin/env bash
# Structured output on qwen2.5-coder-0.5b (CPU):
#  1. validity: 200 `json_schema` requests over the 10 schemas of
#     tests/server/test_structured.py (per schema 1 greedy + 19 sampled at
#     T=0.8 with seeds) through the openai SDK, each answer checked with
#     `jsonschema`, plus the rest of that suite (tool_choice, Pydantic parse);
#  2. overhead: the same prompt with `hearth run` at T=0, plain and under a
#     JSON schema; the constraint's time per token (mask + commit, measured
#     inside the turn) against the decode step's.
#
#   bench/structured.sh            # both
#   N=40 bench/structured.sh       # fewer requests
#   N=0 bench/structured.sh        # the overhead only
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p hearth
bin=target/release/hearth
model=$(python3 scripts/fetch_models.py qwen2.5-coder-0.5b | tail -n 1)
n=${N:-200}

if [[ $n != 0 ]]; then
    echo "== validity: $n json_schema requests =="
    (cd tests/server && HEARTH_BIN="$PWD/../../$bin" HEARTH_STRUCTURED_REQUESTS=$n python3 test_structured.py)
fi

echo "== overhead: hearth run, T=0, 128 tokens =="
schema=$(mktemp --suffix .json)
cat >"$schema" <<'JSON'
{"type": "object", "properties": {
  "todos": {"type": "array", "items": {"type": "object", "properties": {
    "task": {"type": "string"}, "done": {"type": "boolean"},
    "priority": {"type": "string", "enum": ["low", "medium", "high"]}},
    "required": ["task", "done", "priority"]}}},
  "required": ["todos"]}
JSON
prompt="Write a todo list with ten items for moving house, as JSON."
for mode in plain schema; do
    # Plain runs the full 128 tokens; under the schema generation ends with the JSON.
    extra=(--ignore-eos)
    [[ $mode == schema ]] && extra=(--json-schema "$schema")
    stats=$(mktemp --suffix .json)
    "$bin" run -m "$model" -p "$prompt" --temp 0 -n 128 -t 2 "${extra[@]}" \
        --stats-json "$stats" >/dev/null 2>&1
    python3 - "$mode" "$stats" <<'PY'
import json, sys
mode, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
n = s["generated_tokens"]
step = s["decode_ms"] / max(n - 1, 1)
c = s["constraint_ms"] / max(n, 1)
print(f"{mode:6s}: {n} tokens, decode {step:.1f} ms/token ({s['decode_tok_s']:.1f} tok/s), "
      f"constraint {c:.3f} ms/token = {100 * c / step:.2f}% of a decode step")
PY
done
