#!/usr/bin/env bash
# The DFlash training run on this project's GPU machine (the device tool:
# at most 64 MiB travels per call, the repository included, and at most
# 8 files of 16 MiB come back). README.md says how to run it anywhere else.
#
# Here, first (TARGET = the target's GGUF, TOK = its tokenizer.json):
#   mkdir -p .gpu0 .gpu1 ... ; python3 -m pip download --no-deps gguf==0.19.0 -d .gpu0/
#   gzip -c $TOK > .gpu0/tok.json.gz
#   split -b 49M -d $TARGET /tmp/chunks/part   # one part per call, as .gpuN/partNN
# Device calls, chained while the machine stays warm (/dev/shm survives):
#   carry .gpu0 (wheel, tokenizer, part00): gpu-run.sh stage   (starts make_prompts.py there, in the background)
#   carry .gpuN (partNN):                   gpu-run.sh stage
#   carry the last part:                    gpu-run.sh go SHA256   (joins and checks the GGUF, then in the
#                                           background: gen for GEN_BUDGET s, train for TRAIN_BUDGET s, export)
#   gpu-run.sh wait     (tails the log for up to WAIT s; with the shipped drafter in the tree, hands it to
#                        train as its starting point; once gen is done, $OUT gets the answers: answers.npz.partNN)
#   gpu-run.sh fetch    (the exported drafter, fixture and logs into $OUT, split at 15 MiB)
set -u
cd "$(dirname "$0")/../.."
S=/dev/shm/df
mkdir -p $S
export PYTHONUNBUFFERED=1 TARGET_CACHE=$S/target.pt PYTHONPATH=$S/site
DRAFTER=models/drafters/qwen2.5-coder-0.5b-dflash.gguf
take() { for d in .gpu*; do [ -d "$d" ] && for f in "$d"/*; do [ -e "$f" ] && mv "$f" $S/; done; done; }
case "${1:-}" in
stage)
  take
  if ls $S/*.whl >/dev/null 2>&1 && [ ! -d $S/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site $S/*.whl 2>&1 | grep -v -i warn
  fi
  if [ -f $S/tok.json.gz ] && [ ! -f $S/prompts.started ]; then
    gunzip -f $S/tok.json.gz
    # A copy of the sources it reads: the working tree is replaced on every call.
    mkdir -p $S/repo/train && cp -r crates scripts $S/repo/ && cp -r train/dflash $S/repo/train/
    touch $S/prompts.started
    setsid nohup python3 $S/repo/train/dflash/make_prompts.py --tokenizer $S/tok.json \
      --out $S/prompts.jsonl --n "${N_PROMPTS:-52000}" > $S/prompts.log 2>&1 < /dev/null &
  fi
  ls $S; cat $S/prompts.log 2>/dev/null
  ;;
go)
  take
  if [ ! -f $S/target.gguf ]; then
    cat $S/part?? > $S/target.gguf && rm $S/part??
    echo "$2  $S/target.gguf" | sha256sum -c || { rm $S/target.gguf; exit 1; }
  fi
  [ -f $DRAFTER ] && cp $DRAFTER $S/resume.gguf
  cp -r train/dflash $S/repo/train/
  cat > $S/pipeline.sh <<EOF
cd $S/repo
while ! grep -q '^wrote' $S/prompts.log; do sleep 2; done
python3 train/dflash/train.py gen --target $S/target.gguf --prompts $S/prompts.jsonl --work $S/data \
  --budget-s ${GEN_BUDGET:-540} --max-new ${MAX_NEW:-320}
touch $S/gen.done
while [ ! -f $S/resume.gguf ]; do sleep 2; done
python3 train/dflash/train.py train --target $S/target.gguf --work $S/data --out $S/out --resume $S/resume.gguf \
  --budget-s ${TRAIN_BUDGET:-600} ${TRAIN_ARGS:-}
touch $S/train.done
EOF
  setsid nohup bash $S/pipeline.sh > $S/pipeline.log 2>&1 < /dev/null &
  sleep "${WAIT:-60}"
  cat $S/prompts.log; grep -v -i warn $S/pipeline.log | tail -40
  ;;
wait)
  [ -f $DRAFTER ] && [ ! -f $S/resume.gguf ] && cp $DRAFTER $S/resume.gguf
  end=$(( $(date +%s) + ${WAIT:-540} ))
  while [ "$(date +%s)" -lt $end ] && [ ! -f $S/train.done ]; do
    sleep 5
    if [ -f $S/gen.done ] && [ ! -f $S/answers.sent ] && [ -n "${OUT:-}" ]; then
      # The answers (prompt number and answer ids), for a later session's training.
      python3 - <<EOF
import os, numpy as np, torch
w = "$S/data"; n, ids, temp = [], [], []
for f in sorted(os.listdir(w)):
    for s in torch.load(os.path.join(w, f)):
        n.append(s["n"]); temp.append(s["temp"]); ids.append(np.array(s["ids"][s["start"]:], dtype=np.int32))
np.savez_compressed("$S/answers.npz", n=np.array(n, np.int32), temp=np.array(temp, np.float32),
                    lens=np.array([len(x) for x in ids], np.int32), ids=np.concatenate(ids))
EOF
      split -b 15M -d $S/answers.npz "$OUT/answers.npz.part" && cp $S/prompts.jsonl.manifest.json "$OUT/" && touch $S/answers.sent
      ls -la "$OUT"
    fi
  done
  grep -v -i warn $S/pipeline.log | tail -${LINES_SHOWN:-40}
  ;;
fetch)
  ls -la $S/out
  for f in drafter.gguf fixture.json train_log.json; do
    [ -f $S/out/$f ] && split -b 15M -d $S/out/$f "$OUT/$f.part"
  done
  cp $S/pipeline.log "$OUT/pipeline.log"
  ls -la "$OUT"
  ;;
*) echo "usage: $0 stage|go SHA256|wait|fetch"; exit 2 ;;
esac
