"""How containers get their GPUs (Docker's --gpus hook or CDI) and the cgroup policy that keeps them:
the NVML 'Unknown Error' trap of systemd-managed cgroups (NVIDIA/nvidia-docker#1730) and the
cgroup driver Docker runs with once daemon.json holds nemofleet's exec-opts (desired.py decides
daemon.json with it).
"""

from __future__ import annotations

from . import versions

from .plan_types import PlanError

def gpu_access(s, docker_version, cdi_available, cgroup_version, cgroup_driver):
    """(method, daemon.json exec-opts, warnings): how containers get GPUs, and the remedy for the
    NVML 'Unknown Error' trap (NVIDIA/nvidia-docker#1730)."""
    selection, remedy = s.gpu_selection, s.nvml_remedy
    cdi_ok = cdi_available and versions.parse(docker_version) >= (25, 0)
    if selection == "cdi" and not cdi_ok:
        raise PlanError(
            "gpu_selection cdi needs Docker >= 25 and a CDI spec (nvidia-ctk cdi generate); "
            f"this host has Docker {docker_version or 'none'} and {'a' if cdi_available else 'no'} CDI spec")
    method = "cdi" if selection == "cdi" or (selection == "auto" and remedy == "cdi" and cdi_ok) else "gpus"
    # When systemd manages the container cgroups (Docker's systemd cgroup driver, the default on
    # cgroup v2, possible on v1), devices granted by the legacy hook are dropped at every
    # daemon-reload. Judge by the driver Docker has after this run.
    explicit = s.docker_exec_opts
    at_risk = effective_cgroup_driver(explicit, cgroup_driver, cgroup_version) == "systemd" and method == "gpus"
    trap = (f"cgroup v{cgroup_version or '?'} with Docker's systemd cgroup driver and the legacy --gpus hook "
            "loses GPUs after every systemctl daemon-reload (NVML 'Unknown Error')")
    if not at_risk:
        return method, None, []
    if explicit is not None:
        raise PlanError(f"docker_exec_opts keeps the systemd cgroup driver, but {trap}; "
                        "drop native.cgroupdriver=systemd from docker_exec_opts or use CDI (Docker >= 25)")
    if remedy == "none":
        raise PlanError(f"{trap}; set nvml_remedy to cdi or cgroupfs")
    return method, ["native.cgroupdriver=cgroupfs"], [
        f"NVML 'Unknown Error' trap: {trap}, and CDI is not usable here (Docker {docker_version or '?'}"
        f"{'' if cdi_available else ', no CDI spec'}); nemofleet sets exec-opts native.cgroupdriver=cgroupfs "
        "and restarts Docker"]


def effective_cgroup_driver(exec_opts, current: str | None, cgroup_version: int | None) -> str | None:
    """The cgroup driver Docker runs with once daemon.json holds `exec_opts` (None: nemofleet
    leaves exec-opts alone, so the current driver stays). Without a native.cgroupdriver entry,
    Docker >= 20.10 picks systemd on cgroup v2 and cgroupfs on v1."""
    if exec_opts is None:
        return current
    for opt in exec_opts if isinstance(exec_opts, (list, tuple)) else []:
        key, _, value = str(opt).partition("=")
        if key.strip() == "native.cgroupdriver":
            return value.strip()
    return "systemd" if cgroup_version == 2 else "cgroupfs"
