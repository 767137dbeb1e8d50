"""Diagnose the NVML "Unknown Error" trap now: a test container started the way the vLLM units
start theirs must still see its GPU after `systemctl daemon-reload` (NVIDIA/nvidia-docker#1730).

    pyinfra -y inventories/prod.py deploys/gpu_probe.py

The main job runs the same probe by itself whenever what decides GPU access changes.
"""
from nemofleet.deploy import gpu_probe_only

gpu_probe_only()
