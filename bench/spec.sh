#!/usr/bin/env bash
# Speculative decoding: decode speed with each drafter against no speculation,
# measured in one run on the same prompts (bench/prompts/*.txt, chat-wrapped).
#
#   bench/spec.sh MODEL N_TOKENS TEMP THREADS CONFIG... [-- PROMPT_GLOB]
#
# CONFIG: none | ngram:K | ngram-adaptive:K | draft:DRAFT_MODEL:K | dflash:DRAFT_GGUF:B:K
#   | dflash-adaptive:DRAFT_GGUF:B:K (--spec-adaptive: K is the most drafted per cycle)
#   | auto (what `hearth run` does by default: the packaged drafter, adaptive)
# HEARTH_BIN=path uses that binary instead of building target/release/hearth.
# ROUNDS=R runs every prompt and config R times (interleaved); each figure is
# then the median round's.
# Every prompt runs every config back to back (A B C, A B C, ...), so load
# changes on a shared machine hit all configs alike. Prints per config the
# decode tok/s over all prompts (generated tokens after the first / decode
# seconds, prefill excluded), the ratio to `none`, mean accepted drafts per
# verify pass, tokens per target forward, acceptance by draft position, and
# at T=0 how many outputs are identical to `none` (they must all be).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: bench/spec.sh MODEL N_TOKENS TEMP THREADS CONFIG...}"
n="${2:?}"; temp="${3:?}"; threads="${4:?}"; shift 4
configs=(); glob="bench/prompts/*.txt"
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--" ]]; then glob="$2"; break; fi
  configs+=("$1"); shift
done
if [[ -n "${HEARTH_BIN:-}" ]]; then
  hearth=$HEARTH_BIN
else
  cargo build --release -q -p hearth
  hearth=target/release/hearth
fi
out=$(mktemp -d)
echo "results in $out" >&2
rounds=${ROUNDS:-1}
for prompt in $glob; do
  name=$(basename "$prompt" .txt)
  for round in $(seq 1 "$rounds"); do
  for cfg in "${configs[@]}"; do
    IFS=: read -r kind a b c <<< "$cfg"
    flags=()
    case "$kind" in
      none) flags=(--spec none) ;;
      auto) flags=(--spec auto) ;;
      ngram) flags=(--spec ngram --n-draft "$a") ;;
      ngram-adaptive) flags=(--spec ngram --n-draft "$a" --spec-adaptive) ;;
      draft) flags=(--spec draft --draft-model "$a" --n-draft "$b") ;;
      dflash) flags=(--spec dflash --draft-model "$a" --block-length "$b" --n-draft "$c") ;;
      dflash-adaptive) flags=(--spec dflash --draft-model "$a" --block-length "$b" --n-draft "$c" --spec-adaptive) ;;
      *) echo "unknown config $cfg" >&2; exit 1 ;;
    esac
    tag=$(echo "$cfg" | tr ':/' '__')
    echo "$name $cfg (round $round)" >&2
    "$hearth" run -m "$model" -f "$prompt" --chat -n "$n" --temp "$temp" --seed 1 -t "$threads" \
      "${flags[@]}" --stats-json "$out/$name.$tag.r$round.json" > "$out/$name.$tag.txt" 2>/dev/null
  done
  done
done
python3 - "$out" "$temp" "$model" "$n" "$threads" "${configs[@]}" <<'PY'
import glob, json, os, platform, sys
out, temp, model, n, threads, configs = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
tag = lambda c: c.replace(":", "_").replace("/", "_")
names = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(f"{out}/*.json")})
def stats(nm, c):
    """The round with the median decode rate (ROUNDS runs of each, interleaved)."""
    js = sorted((json.load(open(p)) for p in glob.glob(f"{out}/{nm}.{tag(c)}.r*.json")),
                key=lambda j: j["decode_tok_s"])
    return js[len(js) // 2]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
rounds = len(glob.glob(f"{out}/{names[0]}.{tag(configs[0])}.r*.json"))
print(f"model {model}, {len(names)} prompts, {n} new tokens, T={temp}, {threads} threads, cpu: {cpu}, "
      f"{rounds} round(s), each figure the median round")
base = None
print(f"{'config':40} {'tok/s':>7} {'ratio':>6} {'mean_acc':>8} {'tok/fwd':>7} {'same':>6}  acceptance by position")
for c in configs:
    toks = secs = fwd = acc = 0.0; same = 0; dr = []; ac = []
    for nm in names:
        j = stats(nm, c)
        g = j["generated_tokens"]
        if g > 1:
            toks += g - 1; secs += (g - 1) / j["decode_tok_s"]
        if "target_forwards" in j:
            fwd += j["target_forwards"]; acc += j["mean_accepted"] * j["target_forwards"]
            for i, (d, a) in enumerate(zip(j["drafted_at"], j["accepted_at"])):
                if i >= len(dr): dr.append(0); ac.append(0)
                dr[i] += d; ac[i] += a
        if open(f"{out}/{nm}.{tag(c)}.txt").read() == open(f"{out}/{nm}.{tag(configs[0])}.txt").read():
            same += 1
    rate = toks / secs
    base = base or rate
    mean = acc / fwd if fwd else 0.0
    by = ", ".join(f"{a / d:.2f}" for d, a in zip(dr, ac) if d)
    print(f"{c:40} {rate:7.2f} {rate / base:6.2f} {mean:8.2f} {mean + 1 if fwd else 1:7.2f} {same:3}/{len(names)}  [{by}]")
# Per prompt: each config's decode rate over the first config's.
def rate_of(nm, c):
    return stats(nm, c)["decode_tok_s"]
print(f"per prompt, decode tok/s over {configs[0]}'s:")
print(f"{'prompt':28}" + "".join(f" {c[:14]:>14}" for c in configs[1:]))
worst = {c: 9e9 for c in configs[1:]}
for nm in names:
    b = rate_of(nm, configs[0])
    rs = [rate_of(nm, c) / b for c in configs[1:]]
    for c, r in zip(configs[1:], rs):
        worst[c] = min(worst[c], r)
    print(f"{nm:28}" + "".join(f" {r:14.2f}" for r in rs))
print(f"{'lowest':28}" + "".join(f" {worst[c]:14.2f}" for c in configs[1:]))
PY
