"""The GPU classes nemofleet knows: one row each, read by everything that names or sizes a GPU.

A row says how nvidia-smi names the GPU (a regex: drivers before 470 drop the "NVIDIA " prefix),
its short name (the inventory class group `gpu_<short>` and what operators read), its compute
capability where the driver does not report `compute_cap` (470 drivers), its memory where the
planner offers it as an alternative shape ("would fit on 2x H100 80 GiB"), whether its memory is
the system's (unified), which published command of the seed recipes it follows on sm12x
(docs/recipes.md#sm12x) and whether nemofleet has seen that recipe run on it. Adding a GPU class
is a row here (and a fixture of its nvidia-smi output); nothing else names GPU models.

A leaf module (standard library only), so the fact parsers (nvsmi) and the planner (gpus) read
the same rows without lengthening the import chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    """A shape the planner offers when a model does not fit the host's GPUs."""
    label: str  # "A100 80 GiB"
    name: str  # as nvidia-smi reports it
    memory_mib: int  # as nvidia-smi reports it (H200's was read on a real H200)


@dataclass(frozen=True)
class GpuClass:
    short: str  # "H100": the class group gpu_h100
    match: str  # regex over nvidia-smi's name
    cc: str  # compute capability, for drivers that do not report it
    sizes: tuple[Size, ...] = ()
    group: bool = True  # an inventory may group hosts by it (gpu_<short>)
    unified: bool = False  # its memory is the system's: nvidia-smi prints memory.total [N/A]
    line: str | None = None  # the sm12x command it follows: "jetson" or "dgx-spark" (docs/recipes.md#sm12x)
    verified: bool = True  # nemofleet has seen its recipe run (else the plan says "unverified")


# Most specific first (GB200 before B200): the first row whose regex matches names the GPU.
CLASSES: tuple[GpuClass, ...] = (
    GpuClass("GB200", r"\bGB200\b", "10.0"),
    GpuClass("GB300", r"\bGB300\b", "10.3"),  # Blackwell Ultra: sm103
    GpuClass("GB10", r"\bGB10\b", "12.1", unified=True, line="dgx-spark"),  # DGX Spark
    GpuClass("GH200", r"\bGH200\b", "9.0"),
    GpuClass("A100", r"\bA100\b", "8.0", (Size("A100 40 GiB", "NVIDIA A100-SXM4-40GB", 40960),
                                          Size("A100 80 GiB", "NVIDIA A100-SXM4-80GB", 81920))),
    GpuClass("A10G", r"\bA10G\b", "8.6", (Size("A10G 22 GiB", "NVIDIA A10G", 23028),)),
    GpuClass("A10", r"\bA10\b", "8.6"),
    GpuClass("A30", r"\bA30\b", "8.6"),
    GpuClass("A40", r"\bA40\b", "8.6"),
    GpuClass("L40S", r"\bL40S\b", "8.9", (Size("L40S 45 GiB", "NVIDIA L40S", 46068),)),
    GpuClass("L40", r"\bL40\b", "8.9"),
    GpuClass("L4", r"\bL4\b", "8.9"),
    GpuClass("H100", r"\bH100\b", "9.0", (Size("H100 80 GiB", "NVIDIA H100 80GB HBM3", 81559),)),
    GpuClass("H200", r"\bH200\b", "9.0", (Size("H200 140 GiB", "NVIDIA H200", 143771),)),
    GpuClass("H800", r"\bH800\b", "9.0"),
    GpuClass("H20", r"\bH20\b", "9.0"),
    GpuClass("B200", r"\bB200\b", "10.0", (Size("B200 179 GiB", "NVIDIA B200", 183359),)),
    GpuClass("B300", r"\bB300\b", "10.3"),
    GpuClass("Thor", r"\bThor\b", "11.0", group=False, unified=True, line="jetson"),  # Jetson Thor
    GpuClass("RTX A", r"RTX A\d+", "8.6", group=False),
    GpuClass("RTX 40", r"RTX 40\d\d", "8.9", group=False),
    GpuClass("RTX PRO", r"RTX PRO 6000|RTX 50\d\d", "12.0", group=False, line="dgx-spark", verified=False),
)
_MATCH = tuple((re.compile(c.match, re.I), c) for c in CLASSES)

# the inventory's class groups (group_data/gpu_<class>.py; a class group without a file is fine)
CLASS_GROUPS = tuple(f"gpu_{c.short.lower()}" for c in CLASSES if c.group)
# boards whose GPU shares the system memory and prints memory.total as [N/A]: DGX Spark (GB10) and
# Jetson Thor (docs/recipes.md#unified-memory); no other GPU may be sized from MemTotal
UNIFIED = re.compile("|".join(c.match for c in CLASSES if c.unified), re.I)


def of(name: str) -> GpuClass | None:
    """The class of a GPU by the name nvidia-smi prints, or None for a GPU no row names."""
    return next((c for rx, c in _MATCH if rx.search(name)), None)


def short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; a GPU no row names: its name without 'NVIDIA '."""
    c = of(name)
    return c.short if c is not None and c.group else name.replace("NVIDIA ", "")
