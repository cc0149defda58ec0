#!/usr/bin/env bash
# The DFlash training run on a GPU machine that takes at most 64 MiB per
# transfer (this project's device tool; README.md says how to run it
# anywhere else). Here, first:
#   python3 train/dflash/make_prompts.py --tokenizer ~/.cache/hearth/models/qwen2.5-coder-0.5b-instruct-q4_k_m.tokenizer.json --out .gpu/prompts.jsonl
#   python3 -m pip download --no-deps gguf==0.19.0 -d .gpu/whl
#   split -n 10 -d ~/.cache/hearth/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf /tmp/chunks/part
# Device calls, chained while the machine stays warm (/dev/shm survives):
#   carry .gpu = {whl, prompts.jsonl, part00}: train/dflash/gpu-run.sh stage
#   carry .gpu = {partNN}, NN = 01..08:         train/dflash/gpu-run.sh stage
#   carry .gpu = {part09}:                      train/dflash/gpu-run.sh gen     (joins, checks sha256, generates)
#   (nothing carried):                          train/dflash/gpu-run.sh train   (trains, exports to $OUT)
set -u
cd "$(dirname "$0")/../.."
S=/dev/shm/df
mkdir -p $S
export PYTHONUNBUFFERED=1 TARGET_CACHE=$S/target.pt
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site $S/whl/*.whl 2>/dev/null
  export PYTHONPATH=$S/site
}
case "${1:-}" in
stage)
  for f in .gpu/*; do mv "$f" $S/; done
  ls $S
  ;;
gen)
  for f in .gpu/*; do mv "$f" $S/; done
  if [ ! -f $S/q05.gguf ]; then
    cat $S/part0? > $S/q05.gguf
    echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $S/q05.gguf" | sha256sum -c || exit 1
    rm $S/part0?
  fi
  setup
  python3 train/dflash/train.py gen --target $S/q05.gguf --prompts $S/prompts.jsonl --work $S \
    --budget-s "${GEN_BUDGET:-240}" 2>&1 | grep -v -i warn
  ;;
train)
  setup
  python3 train/dflash/train.py train --target $S/q05.gguf --work $S --out "${OUT:-$S/out}" \
    --budget-s "${TRAIN_BUDGET:-420}" "${@:2}" 2>&1 | grep -v -i warn
  # Files come back from the device tool at <= 16 MiB each.
  if [ -n "${OUT:-}" ] && [ -f "$OUT/drafter.gguf" ]; then
    cp "$OUT/drafter.gguf" $S/drafter.gguf
    split -b 15M -d "$OUT/drafter.gguf" "$OUT/drafter.gguf.part" && rm "$OUT/drafter.gguf"
  fi
  ls -la "${OUT:-$S/out}"
  ;;
*) echo "usage: $0 stage|gen|train [train.py options]"; exit 2 ;;
esac
