"""Preflight: can this host serve its plan? Pure checks over HostFacts, one sentence each.

A refused host is failed by the first operation of the deploy, before anything changes;
other hosts continue (pyinfra fails only the host whose command fails).
"""

from __future__ import annotations

import re

from . import factmodel, gpuhealth
from .plan_types import Plan
from . import vllm_flags
from .nvsmi import REFUSED_FIELD
from .settings import Settings
from .valuetypes import Refusal, coded
from .versions import MIN_TOOLKIT
from .versions import parse as vt

# Minimum driver per CUDA version, GA releases (NVIDIA's CUDA 13.2 U2 release notes, table 3;
# docs/recipes.md, "Drivers")
CUDA_MIN_DRIVER = {
    "13.2": "595.45.04", "13.1": "590.44.01", "13.0": "580.65.06", "12.9": "575.51.03",
    "12.8": "570.26", "12.6": "560.28.03", "12.5": "555.42.02", "12.4": "550.54.14",
    "12.3": "545.23.06", "12.2": "535.54.03", "12.1": "530.30.02", "12.0": "525.60.13",
}
MIN_DOCKER = (20, 10)  # --gpus needs 19.03; Debian 12's docker.io is 20.10


def summary(facts: factmodel.Facts) -> str:
    """One line: what this host is (shown by every preflight)."""
    g = facts.gpus
    if not g.gpus:
        return f"GPUs: none ({g.error or 'nvidia-smi lists no GPU'})"
    first = g.gpus[0]
    docker = facts.docker
    return (f"GPUs: {len(g.gpus)}x {first.name} {first.memory_mib} MiB cc {first.cc or '?'}, "
            f"driver {g.driver} (CUDA {facts.cuda or '?'}), toolkit {facts.toolkit.version or 'absent'}, "
            f"Docker {docker.server or ('stopped' if docker.installed else 'absent')}, "
            f"cgroup v{facts.cgroup or '?'}")


def min_driver(cuda: str) -> str | None:
    """The driver CUDA `cuda` needs: the row of CUDA_MIN_DRIVER for it, or for the next CUDA the
    table knows (a version between rows needs at least the next one's driver); None when it is
    newer than every row (the table cannot tell, so the driver check refuses)."""
    rows = sorted((vt(c), d) for c, d in CUDA_MIN_DRIVER.items())
    return next((d for c, d in rows if c >= vt(cuda)), None)


def image_cuda(facts: factmodel.Facts, image: str, setting: str | None = None) -> tuple[str | None, str]:
    """(the CUDA version the image needs, where it comes from): the image's own
    NVIDIA_REQUIRE_CUDA when it is on the host (unless it is newer than the driver table knows
    and vllm_image_cuda says which CUDA to check the driver against), else the vllm_image_cuda
    setting, else nemofleet's version table (vllm_flags.VERSIONS, sources there); (None, "")
    when none says."""
    env = facts.image.env if facts.image is not None else {}
    m = re.search(r"cuda>=([0-9]{1,3}\.[0-9]{1,3})", env.get("NVIDIA_REQUIRE_CUDA", ""))
    if m and not (setting and min_driver(m.group(1)) is None):
        return m.group(1), "image"
    if setting:
        return str(setting), "setting"
    cuda = vllm_flags.get(vllm_flags.version_of_image(image)).cuda
    return (cuda, "table") if cuda else (None, "")


def after_plan(facts: factmodel.Facts, s: Settings, p: Plan) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of the checks over a host and the plan made for it: driver vs the
    image's CUDA, persistence mode, toolkit and Docker, disk for the weights."""
    try:
        refused, warnings = _driver_refusals(facts, s.vllm_image, s.vllm_image_cuda)
    except vllm_flags.UnknownVersion as exc:
        return [Refusal(str(exc), "vllm-version")], []
    refusals = coded("driver", refused)
    off = [str(x.index) for inst in p.instances for x in inst.gpus if x.persistence != "Enabled"]
    if off:
        warnings.append(f"persistence mode is off on GPU {', '.join(off)} (slower starts, lost state between "
                        "jobs); enable nvidia-persistenced")
    refusals += coded("container-runtime", _runtime_refusals(facts.toolkit, facts.docker))
    free = facts.disk_free  # disk for the weights, less what the host holds complete already
    present = sum(p.model.weight_bytes for d in p.downloads if (meta := facts.models.get(d["dir"].rsplit("/", 1)[-1]))
                  is not None and meta.complete and d["repo"] == p.model.repo)
    need = int(max(0, p.model.weight_bytes - present) * 1.1)
    if free is not None and free < need:
        refusals.append(Refusal(f"not enough disk for the weights: {free / 1e9:.1f} GB free under "
                                f"{s.models_root}, {need / 1e9:.1f} GB needed (model + 10%)", "disk"))
    return refusals, warnings


def host_refusal(facts: factmodel.Facts) -> str | None:
    """Before any plan: is there a driver and a GPU (gpu_refusal), and on an NVSwitch system a
    fabric manager of the driver's version (gpuhealth.fabric_refusal: CUDA fails with error 802)?"""
    why = gpu_refusal(facts.gpus)
    if why:
        return Refusal(why, "gpu")
    why = gpuhealth.fabric_refusal(facts.health, facts.gpus.driver, [g.name for g in facts.gpus.gpus])
    return Refusal(why, "fabric") if why else None


def gpu_refusal(g: factmodel.Gpus) -> str | None:
    """Is there a driver, does nvidia-smi answer, does it list a GPU?"""
    if not g.smi:
        return ("no NVIDIA driver: nvidia-smi is not installed; install the NVIDIA data-center "
                "driver (branch 570 or newer) and reboot, or set install_nvidia_driver: true and "
                "nvidia_driver_branch")
    refused = REFUSED_FIELD.search(g.error or "")
    if g.rc == 2 and refused:
        return (f"the NVIDIA driver is too old for nemofleet's GPU query: its nvidia-smi does not know the query field "
                f"{refused.group(1)} (470 and older drivers lack compute_cap); upgrade the NVIDIA data-center driver "
                "(branch 570 or newer, or set install_nvidia_driver: true and nvidia_driver_branch) and reboot")
    if g.rc:
        hint = {9: "load the driver (modprobe nvidia) or reinstall it and reboot",
                6: "check that the GPUs are attached to this machine (lspci | grep -i nvidia)",
                18: "the driver was upgraded without a reboot: reboot the host"}.get(g.rc, "run nvidia-smi on the host")
        return f"nvidia-smi failed (exit {g.rc}: {g.error}); {hint}"
    if not g.gpus:
        return "nvidia-smi lists no GPU; check that the GPUs are attached to this machine"
    return None


def _driver_refusals(facts: factmodel.Facts, image: str, setting: str | None = None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of the driver against the CUDA the image needs (image_cuda)."""
    need_cuda, source = image_cuda(facts, image, setting)
    if need_cuda is None:
        return [f"nemofleet cannot tell which CUDA {image} needs (not pulled on this host, so no "
                "NVIDIA_REQUIRE_CUDA, and not in its version table); set vllm_image_cuda (e.g. 13.0)"], []
    warnings = []
    if source == "table":
        warnings.append(f"the CUDA {image} needs ({need_cuda}) comes from nemofleet's version table, not the image "
                        "(not pulled on this host yet); the image's NVIDIA_REQUIRE_CUDA decides once it is, and "
                        "vllm_image_cuda overrides the table")
    need_driver = min_driver(need_cuda)
    driver = facts.gpus.driver
    if need_driver is None:  # fail closed: the table cannot say which driver this CUDA needs
        newest = max(CUDA_MIN_DRIVER, key=vt)
        said = {"image": "its NVIDIA_REQUIRE_CUDA", "setting": "vllm_image_cuda"}.get(source, "nemofleet's version table")
        return [f"{image} needs CUDA {need_cuda} ({said}), newer "
                f"than nemofleet's driver table knows (its newest row: CUDA {newest}, driver >= "
                f"{CUDA_MIN_DRIVER[newest]}), so driver {driver} cannot be checked against it; set vllm_image_cuda to "
                "the CUDA to check the driver against, or pin an image the table knows"], warnings
    if vt(driver) < vt(need_driver):
        return [f"driver {driver} supports CUDA {facts.cuda or '?'} but {image} needs CUDA {need_cuda} "
                f"(driver >= {need_driver}); install the CUDA forward compatibility package (cuda-compat-"
                f"{need_cuda.replace('.', '-')}, datacenter GPUs) or upgrade the NVIDIA driver and reboot, or pin an "
                "older image"], warnings
    return [], warnings


def _runtime_refusals(tk: factmodel.Toolkit, docker: factmodel.Docker) -> list[str]:
    out = []
    if not (tk.version or tk.hook):
        out.append("the NVIDIA Container Toolkit is not installed (no nvidia-ctk or nvidia-container-runtime-hook); "
                   "install nvidia-container-toolkit or set install_container_toolkit: true")
    elif tk.version and vt(tk.version) < MIN_TOOLKIT:
        out.append(f"NVIDIA Container Toolkit {tk.version} is too old (cgroup v2 needs >= 1.14); upgrade it")
    if not docker.installed:
        out.append("Docker is not installed; install docker-ce 25+ (or Debian's docker.io) first")
    elif not docker.running:
        out.append("Docker is installed but dockerd is not running; systemctl enable --now docker")
    elif vt(docker.server) < MIN_DOCKER:
        out.append(f"Docker {docker.server} is too old; nemofleet needs 20.10 or newer (25+ for CDI)")
    return out
