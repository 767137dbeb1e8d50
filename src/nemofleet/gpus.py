"""GPU architectures, the catalog of GPU classes, and which of a host's GPUs the plan may use.

Architecture rows hold only what is true of the GPU for every model (native FP4, default batch
sizes); flags that belong to one model's recipe live in recipes.py. Sources: docs/recipes.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .valuetypes import host_number, shown

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class Arch:
    name: str  # ampere, ada, hopper, blackwell, sm12x
    sm: int  # 80, 89, 90, 100, 120
    # NVFP4 runs natively (FP4 tensor cores) only from sm100; below that vLLM runs it
    # weight-only (W4A16: Marlin/Humming dequantise to BF16). docs/recipes.md#nvfp4-below-blackwell
    native_fp4: bool
    # Batch sizes set explicitly, because vLLM's per-GPU defaults (up to 1024 sequences) can
    # exceed the Mamba cache blocks of hybrid models (vllm#49064). docs/recipes.md#batch-sizes
    default_max_num_seqs: int
    default_max_num_batched_tokens: int


ARCHS: dict[str, Arch] = {
    # docs/recipes.md#lightning-a100: 32 sequences / 16384 batched tokens on 1x A100 80 GB
    "ampere": Arch("ampere", 80, False, 32, 16384),
    "ada": Arch("ada", 89, False, 32, 16384),
    # docs/recipes.md#lightning-h100: 256 sequences / 32768 batched tokens on 1x H100
    "hopper": Arch("hopper", 90, False, 256, 32768),
    "blackwell": Arch("blackwell", 100, True, 256, 32768),
    # Blackwell outside the sm100 datacenter family: cc 12.x (GB10/DGX Spark, RTX PRO 6000) and
    # cc 11.0 (Jetson Thor). Native FP4, but not the sm100-only kernels (TRTLLM MoE, FlashInfer's
    # horizontal SSU): docs/recipes.md#sm12x. 16384 batched tokens: the DGX Spark line of
    # docs/recipes.md#lightning-h100.
    "sm12x": Arch("sm12x", 120, True, 256, 16384),
}


@dataclass(frozen=True)
class GpuClass:
    """A GPU model the planner knows, used to say on which shapes a refused model would run."""
    label: str  # as shown to operators: "A100 80 GiB"
    name: str  # as nvidia-smi reports it
    memory_mib: int
    cc: str


# Memory as nvidia-smi reports it (MiB); H200's figure was read on a real H200.
GPU_CLASSES = [
    GpuClass("A10G 22 GiB", "NVIDIA A10G", 23028, "8.6"),
    GpuClass("L40S 45 GiB", "NVIDIA L40S", 46068, "8.9"),
    GpuClass("A100 40 GiB", "NVIDIA A100-SXM4-40GB", 40960, "8.0"),
    GpuClass("A100 80 GiB", "NVIDIA A100-SXM4-80GB", 81920, "8.0"),
    GpuClass("H100 80 GiB", "NVIDIA H100 80GB HBM3", 81559, "9.0"),
    GpuClass("H200 140 GiB", "NVIDIA H200", 143771, "9.0"),
    GpuClass("B200 179 GiB", "NVIDIA B200", 183359, "10.0"),
]

# The GPU classes an inventory may group hosts by (group_data/gpu_<class>.py, the class as
# short_name() names it): every GPU of NAME_TO_CC below with a short name, not only those
# GPU_CLASSES sizes (docs/recipes.md#sm12x names GB10 a target). A class group without a
# group_data file is fine.
CLASS_NAMES = ("A10G", "A10", "A30", "A40", "L4", "L40", "L40S", "A100", "H20", "H100", "H200", "H800", "GH200",
               "B200", "B300", "GB200", "GB300", "GB10")
CLASS_GROUPS = tuple(f"gpu_{n.lower()}" for n in CLASS_NAMES)

# Used when the driver does not report compute_cap (470 drivers).
# Older drivers drop the "NVIDIA " prefix, so the names are matched as regexes.
NAME_TO_CC = [
    (re.compile(r"\bA100\b", re.I), "8.0"),
    (re.compile(r"\bA10G?\b|\bA40\b|\bA30\b|RTX A\d+", re.I), "8.6"),
    (re.compile(r"\bL40S?\b|\bL4\b|RTX 40\d\d", re.I), "8.9"),
    (re.compile(r"\bH100\b|\bH200\b|\bH800\b|GH200", re.I), "9.0"),
    (re.compile(r"\bB200\b|GB200", re.I), "10.0"),
    (re.compile(r"\bB300\b|GB300", re.I), "10.3"),  # Blackwell Ultra: sm103
    (re.compile(r"\bThor\b", re.I), "11.0"),
    (re.compile(r"\bGB10\b", re.I), "12.1"),
    (re.compile(r"RTX PRO 6000|RTX 50\d\d", re.I), "12.0"),
]


class UnsupportedGpu(ValueError):
    pass


def cc_for_name(name: str) -> str | None:
    for rx, cc in NAME_TO_CC:
        if rx.search(name):
            return cc
    return None


def arch_for_cc(cc: str) -> Arch:
    parts = [host_number(p, 0, 99) for p in cc.split(".")]  # nvidia-smi's text: '٩.٠' is no 9.0
    if len(parts) != 2 or None in parts:
        raise UnsupportedGpu(f"compute capability {shown(cc)} is not of the form MAJOR.MINOR")
    sm = parts[0] * 10 + parts[1]
    if sm >= 110:
        return ARCHS["sm12x"]
    if sm >= 100:
        return ARCHS["blackwell"]
    if sm >= 90:
        return ARCHS["hopper"]
    if sm == 89:
        return ARCHS["ada"]
    if sm >= 80:
        return ARCHS["ampere"]
    raise UnsupportedGpu(
        f"compute capability {cc} is older than Ampere (8.0); the vLLM images nemofleet "
        "deploys need sm80 or newer"
    )


def arch_of(gpu) -> Arch:
    cc = gpu.cc or cc_for_name(gpu.name)
    if cc is None:
        raise UnsupportedGpu(f"cannot tell the compute capability of {gpu.name}; use a driver that reports compute_cap")
    return arch_for_cc(cc)


def short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'."""
    m = re.search(r"\b([ABHL]\d{2,3}[SG]?|GH200|GB[23]00|GB10)\b", name)
    return m.group(1) if m else name.replace("NVIDIA ", "")


def label(gpu) -> str:
    """'H100 80 GiB': the unit operators compare with the plan's GiB figures."""
    return f"{short_name(gpu.name)} {gpu.memory_mib * MIB / GIB:.0f} GiB"


def select(gpus: list, wanted: list | None) -> tuple[list, list[str]]:
    """The GPUs the plan may use, and a warning per GPU left out.

    `wanted` (the `gpus` setting) lists indices or UUIDs; None means every GPU without MIG.
    MIG-enabled GPUs cannot be given whole to vLLM, so they are left out with a warning,
    or refused when named explicitly. Raises UnsupportedGpu with one sentence."""
    if wanted is None:
        chosen = list(gpus)
    else:
        chosen = []
        for ref in wanted:
            match = [g for g in gpus if (g.index == ref if isinstance(ref, int) else g.uuid == ref)]
            if not match:
                have = ", ".join(str(g.index) for g in gpus)
                raise UnsupportedGpu(f"gpus names {ref!r}, which this host does not have (GPU indices {have}, or their UUIDs)")
            if match[0] in chosen:
                raise UnsupportedGpu(f"gpus names GPU {match[0].index} twice")
            chosen.append(match[0])
        chosen.sort(key=lambda g: g.index)
    mig = [g for g in chosen if g.mig == "Enabled"]
    if mig and wanted is not None:
        g = mig[0]
        raise UnsupportedGpu(f"gpus selects GPU {g.index}, which has MIG enabled; run nvidia-smi -i {g.index} -mig 0 "
                             "and reset it, or leave it out of gpus")
    warnings = [f"GPU {g.index} ({g.uuid}) has MIG enabled and is left out of the plan (vLLM needs whole GPUs); "
                f"run nvidia-smi -i {g.index} -mig 0 and reset it to serve on it" for g in mig]
    usable = [g for g in chosen if g.mig != "Enabled"]
    if not usable:
        which = ", ".join(str(g.index) for g in mig)
        raise UnsupportedGpu(f"MIG is enabled on GPU {which}, every GPU of this host, and vLLM needs whole GPUs; "
                             f"run nvidia-smi -i {mig[0].index} -mig 0 and reset it")
    return usable, warnings


def groups(gpus: list) -> list[list]:
    """GPUs grouped by model (name and memory), in index order: each group is planned on its own,
    since TP groups and flags must not span GPU models."""
    out: dict[tuple, list] = {}
    for g in gpus:
        out.setdefault((g.name, g.memory_mib), []).append(g)
    return sorted(out.values(), key=lambda grp: grp[0].index)


def tp_groups(gpus: list, tp: int, count: int) -> tuple[list[list], list]:
    """`count` TP groups of `tp` GPUs each out of `gpus` (ANY list of one GPU model: a host's
    GPUs, those `gpus` selects, or those left after unhealthy ones are taken out), and the GPUs
    left idle. Groups aligned on multiples of `tp` by index ({0,1}, {2,3}... for TP2) come first,
    since those GPUs share a PCIe switch / NVLink pair on most boards; the rest are taken in index
    order. E.g. GPUs 0,1,2,4,5,6,7 at TP2 x 3: [0,1], [4,5], [6,7], GPU 2 idle. Pure; raises
    ValueError when count x tp exceeds the GPUs."""
    if tp < 1 or count < 0 or count * tp > len(gpus):
        raise ValueError(f"{count} groups of {tp} GPU(s) need more than {len(gpus)} GPUs")
    ordered = sorted(gpus, key=lambda g: g.index)
    blocks: dict[int, list] = {}
    for g in ordered:
        blocks.setdefault(g.index // tp, []).append(g)
    full = [b for _, b in sorted(blocks.items()) if len(b) == tp]
    chosen = full[:count]
    used = {g.index for b in chosen for g in b}
    rest = [g for g in ordered if g.index not in used]
    while len(chosen) < count:
        chosen.append(rest[:tp])
        rest = rest[tp:]
    chosen.sort(key=lambda b: b[0].index)
    return chosen, rest
