#!/usr/bin/env bash
# Remakes crates/cuda/prebuilt/ (the sm_90 machine code shipped in the binary,
# so a first `--device cuda` run on an H100/H200 does not compile for minutes)
# from the kernel sources, with the NVRTC that CI pins (scripts/requirements.txt).
# Run it after changing crates/cuda/kernels/ and commit the two files.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')
bin=$(cargo test -p hearth-cuda --profile ci --lib --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m["target"]["name"] == "hearth_cuda":
        print(m["executable"])')
(cd crates/cuda && HEARTH_PREBUILD=1 LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$bin" --ignored nvrtc_compiles_kernels_for_sm90)
cat crates/cuda/prebuilt/sm90.key
ls -l crates/cuda/prebuilt/
