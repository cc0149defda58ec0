#!/usr/bin/env bash
# Issue 18's CPU goals on this machine (2 threads), through the real server
# and the openai SDK (bench/batching.py):
#  1. aggregate decode tok/s of 1, 4 and 8 concurrent streams (qwen2.5-coder-0.5b,
#     64 tokens each, T=0), default mode and --batch-invariant;
#  2. time to first token of a 2-token request sent 0.5 s into a ~3,000-token
#     prefill (default mode);
#  3. time to first token of a new session whose ~1,400-token prompt shares all
#     but its last ~50 tokens with an existing session, vs that session's cold one;
#  4. save + restore of an ~8K-token session (smollm2-135m, --session-dir);
#  5. the peer in the same run: llama.cpp 11434's llama-server -np 4 -cb
#     (scripts/build-llamacpp.sh) and hearth, 1 and 4 streams each;
#  6. speculating sessions (--spec ngram, and --spec auto: the packaged DFlash
#     drafter), 1 and 4 streams, beside plain decoding in the same run.
#
#   bench/batching.sh                 # all
#   PARTS=1 bench/batching.sh         # some of them (comma-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p hearth
bin=${HEARTH_BIN:-$PWD/target/release/hearth}
qwen=$(python3 scripts/fetch_models.py qwen2.5-coder-0.5b | tail -n 1)
smol=$(python3 scripts/fetch_models.py smollm2-135m | tail -n 1)
parts=${PARTS:-1,2,3,4,5,6}
threads=${THREADS:-2}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

serve() { # model ctx port extra...
    local model=$1 ctx=$2 port=$3
    shift 3
    "$bin" serve -m "$model" -c "$ctx" --port "$port" --model-id bench -t "$threads" "$@" >"$tmp/serve-$port.log" 2>&1 &
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "server on $port did not start" >&2
    cat "$tmp/serve-$port.log" >&2
    return 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
run() { python3 bench/batching.py --base "http://127.0.0.1:$1/v1" "${@:2}"; }

echo "== $(lscpu | sed -n 's/^Model name: *//p'), $threads threads, $(date -u +%F) =="
if [[ $parts == *1* ]]; then
    serve "$qwen" 4096 8601
    run 8601 --streams 1,4,8 --tokens 64 --label "default: "
    stop $!
    serve "$qwen" 4096 8602 --batch-invariant
    run 8602 --streams 1,4,8 --tokens 64 --label "batch-invariant: "
    stop $!
fi
if [[ $parts == *2* ]]; then
    serve "$qwen" 4096 8603
    run 8603 --streams "" --ttft-during-prefill 90 --label "default: "
    stop $!
fi
if [[ $parts == *3* ]]; then
    serve "$qwen" 4096 8604
    run 8604 --streams "" --shared-prefix 1400
    stop $!
fi
if [[ $parts == *5* ]]; then
    # The build for this CPU (scripts/build-llamacpp.sh prints its bin dir;
    # on an AMX machine that is the non-native AVX-512 build).
    llama_server="$(bash scripts/build-llamacpp.sh | tail -n 1)/llama-server"
    "$llama_server" -m "$qwen" -c 8192 -np 4 -cb -t "$threads" --port 8606 >"$tmp/llama.log" 2>&1 &
    for _ in $(seq 600); do
        curl -sf http://127.0.0.1:8606/health >/dev/null 2>&1 && break
        sleep 0.2
    done
    run 8606 --streams 1,4 --tokens 64 --label "llama-server -np 4 -cb: "
    stop $!
    serve "$qwen" 4096 8607
    run 8607 --streams 1,4 --tokens 64 --label "hearth: "
    stop $!
fi
if [[ $parts == *6* ]]; then
    serve "$qwen" 4096 8608
    run 8608 --streams 1,4 --tokens 64 --label "plain: "
    stop $!
    serve "$qwen" 4096 8609 --spec ngram
    run 8609 --streams 1,4 --tokens 64 --label "spec ngram: "
    stop $!
    serve "$qwen" 4096 8610 --spec auto
    run 8610 --streams 1,4 --tokens 64 --label "spec auto (DFlash): "
    stop $!
fi
if [[ $parts == *4* ]]; then
    serve "$smol" 8448 8605 --session-dir "$tmp/sessions"
    run 8605 --streams "" --save-restore 8000 --reps 7
    stop $!
fi
