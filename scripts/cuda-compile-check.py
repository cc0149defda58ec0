#!/usr/bin/env python3
"""Compiles hearth's CUDA kernels with NVRTC for sm_90 on a machine without a GPU
(NVRTC needs no driver) and prints compile errors, or each kernel's registers,
shared memory and spills (ptxas -v).

    pip install nvidia-cuda-nvrtc-cu12   # once; or set HEARTH_NVRTC=/path/libnvrtc.so.12
    python3 scripts/cuda-compile-check.py [NAME_FILTER] [--root crates/cuda/kernels] [--arch sm_90]

The file order is compile.rs's SOURCE order.
"""
import argparse, ctypes, glob, os, re, sys

# The kernel files in compile.rs's SOURCE order (read from it, so a new or split file is included).
COMPILE_RS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'crates', 'cuda', 'src', 'compile.rs')
FILES = re.findall(r'include_str!\("\.\./kernels/([^"]+)"\)', open(COMPILE_RS).read())


def find_nvrtc():
    if os.environ.get('HEARTH_NVRTC'):
        return os.environ['HEARTH_NVRTC']
    cands = glob.glob('/tmp/nvtools/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.*')
    try:
        import nvidia.cuda_nvrtc as m
        cands += glob.glob(os.path.join(list(m.__path__)[0], 'lib', 'libnvrtc.so.*'))
    except ImportError:
        pass
    cands = [c for c in cands if 'builtins' not in c]
    if not cands:
        sys.exit('no libnvrtc found: pip install nvidia-cuda-nvrtc-cu12 or set HEARTH_NVRTC')
    return cands[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('filter', nargs='?', default='')
    ap.add_argument('--root', default=os.path.join(os.path.dirname(__file__), '..', 'crates', 'cuda', 'kernels'))
    ap.add_argument('--arch', default='sm_90')
    a = ap.parse_args()
    lib = ctypes.CDLL(find_nvrtc())
    src = '\n'.join(open(os.path.join(a.root, f)).read() for f in FILES)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b'hearth_kernels.cu', 0, None, None) == 0
    opts = [f'--gpu-architecture={a.arch}'.encode(), b'--std=c++17', b'-default-device', b'--ptxas-options=-v']
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors='replace')
    if rc != 0:
        print(log)
        sys.exit(1)
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        elif cur and a.filter in cur and ('registers' in line or ('spill' in line and ' 0 bytes spill stores, 0 bytes spill loads' not in line)):
            print(f"{cur:40s} {line.split(':', 1)[-1].strip()}")
    print(f'compiled OK for {a.arch}')


main()
