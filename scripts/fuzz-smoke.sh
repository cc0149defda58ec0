#!/usr/bin/env bash
# Bounded smoke run of every cargo-fuzz target in fuzz/ (libFuzzer): builds
# them, then fuzzes each for FUZZ_SECONDS (default 8) starting from its
# committed seed corpus (fuzz/seeds/<target>) in a scratch copy, and fails if
# any target crashes, hangs past 10 s on one input, or fails its checks.
#
#   scripts/fuzz-smoke.sh                  # all targets
#   scripts/fuzz-smoke.sh parse_hermes     # some targets
#   FUZZ_SECONDS=600 scripts/fuzz-smoke.sh # longer runs
#
# Installs cargo-fuzz (crates.io) if it is missing. Works on the stable
# toolchain: the targets are built without a sanitizer (`-s none`; the fuzzed
# code is safe Rust, so panics, overflow checks and the targets' own
# assertions are what catches bugs). The build goes to
# $HEARTH_FUZZ_TARGET_DIR (default ~/.cache/hearth/fuzz-target) so that later
# runs, from any checkout, rebuild only what changed: the first build compiles
# every dependency with coverage instrumentation and takes several minutes on
# 2 cores; after that the whole script takes about 1.5 minutes.
#
# A crash leaves its input in $work/artifacts/<target>/ (printed); reproduce
# with `cargo fuzz run -s none <target> <file>` from fuzz/.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${FUZZ_SECONDS:-8}"
target_dir="${HEARTH_FUZZ_TARGET_DIR:-$HOME/.cache/hearth/fuzz-target}"
all_targets=(gguf_reader chat_template server_request parse_hermes parse_qwen3_xml
    parse_atem parse_muse_glimmer parse_harmony parse_plain)
targets=("${@:-${all_targets[@]}}")

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi

cd "$root/fuzz"
build_start=$SECONDS
# All targets at once: they share every dependency.
nice -n 10 cargo fuzz build -s none --target-dir "$target_dir"
bin_dir="$target_dir/x86_64-unknown-linux-gnu/release"
for t in "${targets[@]}"; do
    [[ -x "$bin_dir/$t" ]] || { echo "fuzz-smoke: $t was not built" >&2; exit 1; }
done
echo "fuzz-smoke: build took $((SECONDS - build_start)) s"

work="$(mktemp -d "${TMPDIR:-/tmp}/hearth-fuzz-smoke.XXXXXX")"
passed=0
failed=0
for t in "${targets[@]}"; do
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    cp "$root/fuzz/seeds/$t/"* "$work/corpus/$t/"
    log="$work/$t.log"
    if "$bin_dir/$t" "$work/corpus/$t" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$t/" >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "fuzz-smoke: $t ok, $runs executions in ${seconds} s"
        passed=$((passed + 1))
    else
        echo "fuzz-smoke: $t FAILED; log $log, input(s):" >&2
        ls "$work/artifacts/$t/" >&2
        grep -m1 -A3 -E 'panicked|ERROR' "$log" >&2 || tail -n 20 "$log" >&2
        failed=$((failed + 1))
    fi
done
echo "fuzz-smoke: $passed passed, $failed failed"
if [[ $failed -eq 0 ]]; then
    rm -rf "$work"
else
    exit 1
fi
