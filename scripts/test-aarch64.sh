#!/usr/bin/env bash
# The aarch64 (NEON) kernel tests: cross-compiles hearth-kernels and runs its
# tests under qemu user emulation. Installs what it needs when it can:
# the Rust target (rustup) and Debian's gcc-aarch64-linux-gnu and
# qemu-user-static (apt-get, as root or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if ((${#need[@]})); then
    sudo=""
    [[ $(id -u) == 0 ]] || sudo="sudo -n"
    if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"; } >/dev/null; then
        echo "test-aarch64: NEON kernel tests NOT RUN: could not install ${need[*]} (apt-get needs root)" >&2
        exit 0
    fi
fi
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    if ! rustup target add aarch64-unknown-linux-gnu >/dev/null; then
        echo "test-aarch64: NEON kernel tests NOT RUN: could not install the aarch64-unknown-linux-gnu Rust target" >&2
        exit 0
    fi
fi
cargo test --profile ci --target aarch64-unknown-linux-gnu -p hearth-kernels "$@"
