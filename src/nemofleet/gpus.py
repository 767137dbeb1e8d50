"""GPU architectures, the catalog of GPU classes, and which of a host's GPUs the plan may use.

Architecture rows hold only what is true of the GPU for every model (native FP4, default batch
sizes); flags that belong to one model's recipe live in recipes.py. Sources: docs/recipes.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import re
from dataclasses import dataclass

from . import gpu_classes
from .gpu_classes import CLASS_GROUPS, short_name  # noqa: F401  (read from here by the planner)
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


class UnsupportedGpu(ValueError):
    pass


def cc_for_name(name: str) -> str | None:
    """The compute capability of a GPU whose driver does not report it (470), from its class."""
    c = gpu_classes.of(name)
    return c.cc if c else None


def arch_for_cc(cc: str) -> Arch:
    parts = [host_number(p, 0, 99) for p in cc.split(".")]  # nvidia-smi's text: '٩.٠' is no 9.0
    major, minor = (parts + [None, None])[:2] if len(parts) == 2 else (None, None)
    if major is None or minor is None:
        raise UnsupportedGpu(f"compute capability {shown(cc)} is not of the form MAJOR.MINOR")
    sm = major * 10 + minor
    # the lowest sm of each architecture (cc 11.0, Jetson Thor, is sm12x; sm 86-88 are Ampere)
    for floor, name in ((110, "sm12x"), (100, "blackwell"), (90, "hopper"), (89, "ada"), (80, "ampere")):
        if sm >= floor:
            return ARCHS[name]
    raise UnsupportedGpu(
        f"compute capability {cc} is older than Ampere (8.0); the vLLM images nemofleet "
        "deploys need sm80 or newer"
    )


def arch_of(gpu) -> Arch:
    cc = gpu.cc or cc_for_name(gpu.name)
    if cc is None:
        raise UnsupportedGpu(f"cannot tell the compute capability of {gpu.name}; use a driver that reports compute_cap")
    return arch_for_cc(cc)


def label(gpu) -> str:
    """'H100 80 GiB': the unit operators compare with the plan's GiB figures."""
    return f"{short_name(gpu.name)} {gpu.memory_mib * MIB / GIB:.0f} GiB"


def select(gpus: list, wanted: Sequence | None) -> tuple[list, list[str]]:
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
