"""GPU architectures and the vLLM features each one supports.

One table, one row per architecture. Every rule cites where it comes from:
seed 000 (Lightning NVFP4 on 1x A100 80 GB, vLLM v0.27.1), seed 003 (vLLM day-one
recipe for Lightning on H100, incl. the Hopper-only backends) and reference.md §9.4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str  # ampere, ada, hopper, blackwell
    sm: int  # 80, 89, 90, 100
    # seed 003 + reference §9.4: the Humming MoE/linear backends are Hopper-optimised
    # (~20% over Marlin); A100 "falls back to default/Marlin" (seed 000 §1).
    humming: bool
    # seed 003: --async-scheduling belongs to the Hopper recipe; seed 000 lists it among
    # the H100-only optimisations unavailable on A100.
    async_scheduling: bool
    # reference §9.4 (FlashInfer 0.7.2): horizontal SSU is OK on SM90 without speculative
    # decoding; MTP/DFlash/DSpark with horizontal "require SM100+". A100: simple/auto only.
    ssu_horizontal: bool
    ssu_horizontal_with_spec: bool
    # reference §9.4: NVFP4 is native on SM100; below that it runs weight-only (W4A16)
    # through Marlin or Humming.
    native_fp4: bool
    # seed 003 (Hopper recipe) enables stochastic rounding of the fp16 Mamba cache;
    # seed 000 (A100) does not. reference §9.4: flashinfer only below SM100.
    stochastic_rounding: bool
    # reference §9.3: default batch sizes per GPU; we set them explicitly because
    # 1024 seqs can exceed the Mamba cache blocks of hybrid models (vllm#49064).
    default_max_num_seqs: int
    default_max_num_batched_tokens: int


ARCHS: dict[str, Arch] = {
    # seed 000: 32 seqs / 16384 batched tokens, verified on 1x A100 80 GB.
    "ampere": Arch("ampere", 80, False, False, False, False, False, False, 32, 16384),
    "ada": Arch("ada", 89, False, False, False, False, False, False, 32, 16384),
    # seed 003: 256 seqs / 32768 batched tokens on H100.
    "hopper": Arch("hopper", 90, True, True, True, False, False, True, 256, 32768),
    "blackwell": Arch("blackwell", 100, False, True, True, True, True, True, 256, 32768),
}

# reference §2.1: used when the driver does not report compute_cap (470 drivers).
# Older drivers drop the "NVIDIA " prefix, so the names are matched as regexes.
NAME_TO_CC = [
    (re.compile(r"\bA100\b", re.I), "8.0"),
    (re.compile(r"\bA10\b|\bA40\b|\bA30\b|RTX A\d+", re.I), "8.6"),
    (re.compile(r"\bL40S?\b|\bL4\b|RTX 40\d\d", re.I), "8.9"),
    (re.compile(r"\bH100\b|\bH200\b|\bH800\b|GH200", re.I), "9.0"),
    (re.compile(r"\bB200\b|\bB300\b|GB200|GB300", re.I), "10.0"),
]


class UnsupportedGpu(ValueError):
    pass


def cc_for_name(name: str) -> str | None:
    for rx, cc in NAME_TO_CC:
        if rx.search(name):
            return cc
    return None


def arch_for_cc(cc: str) -> Arch:
    try:
        major, minor = (int(p) for p in cc.split(".", 1))
    except ValueError as exc:
        raise UnsupportedGpu(f"compute capability {cc!r} is not of the form MAJOR.MINOR") from exc
    sm = major * 10 + minor
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


def short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'."""
    m = re.search(r"\b([ABHL]\d{2,3}S?|GH200|GB[23]00)\b", name)
    return m.group(1) if m else name.replace("NVIDIA ", "")
