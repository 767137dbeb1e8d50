"""Per-model, per-architecture vLLM flags as data: one table, each row naming its source.

A row applies when the model's family, the GPU architecture and the conditions match. Only
rows of the model's own family (or "*": workarounds of vLLM bugs that hit every model of that
kind) apply, so one model's optimisations never leak onto another. docs/recipes.md quotes
each source; the section is the row's `source`.

The flags the plan itself owns (port, TP, context, batch sizes...) come from settings and are
listed in flagtable.py, the one table of emitted flags, with the setting an operator uses instead
of an extra arg.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import flagtable

ALL_ARCHS = ("ampere", "ada", "hopper", "blackwell", "sm12x")


@dataclass(frozen=True)
class Row:
    family: str  # models.Model.family, or "*"
    archs: tuple[str, ...]
    flags: tuple[tuple[str, object], ...]  # (flag, value) ; None = a switch
    source: str  # docs/recipes.md section
    spec: bool | None = None  # True: only with speculative decoding, False: only without
    precision: str | None = None  # only for this checkpoint precision
    moe: bool | None = None
    # the flag is emitted only where the pinned vLLM has it and does not deprecate it
    if_supported: bool = False


RECIPES: list[Row] = [
    # Lightning on every architecture: the A100 README command and the day-one post's
    # H100 command share these.
    Row("lightning", ALL_ARCHS, (("--enable-prefix-caching", None), ("--mamba-backend", "flashinfer"),
                                 ("--mamba-ssm-cache-dtype", "float16")), "lightning-a100"),
    # --mamba-cache-mode align: in both Lightning commands on v0.27.1; deprecated without
    # effect in 0.33 (derived from prefix caching).
    Row("lightning", ALL_ARCHS, (("--mamba-cache-mode", "align"),), "lightning-a100", if_supported=True),
    # The Hopper optimisations of the day-one post; the A100 README names them unavailable there.
    Row("lightning", ("hopper",), (("--async-scheduling", None), ("--moe-backend", "humming"),
                                   ("--linear-backend", "humming")), "lightning-h100"),
    Row("lightning", ("blackwell",), (("--async-scheduling", None),), "lightning-h100"),
    # Horizontal SSU: sm90 only without speculative decoding, sm100 always (FlashInfer).
    Row("lightning", ("hopper",), (("--mamba-ssu-algorithm", "horizontal"),), "lightning-h100", spec=False),
    Row("lightning", ("blackwell",), (("--mamba-ssu-algorithm", "horizontal"),), "lightning-h100"),
    # Stochastic rounding of the fp16 Mamba cache (needs --mamba-ssm-cache-dtype float16); the
    # day-one post's Jetson line sets it on Blackwell outside sm100 too (docs/recipes.md#sm12x).
    Row("lightning", ("hopper", "blackwell", "sm12x"), (("--enable-mamba-cache-stochastic-rounding", None),
                                                        ("--mamba-cache-philox-rounds", 5)), "lightning-h100"),
    # Nano: the vLLM recipe's flags, on every architecture (FP8 KV works from sm80).
    Row("nano", ALL_ARCHS, (("--async-scheduling", None), ("--kv-cache-dtype", "fp8"),
                            ("--mamba-ssm-cache-dtype", "float32")), "nano"),
    # Super VL: the article's command has nothing beyond what the plan derives from settings
    # and the catalog (TP/EP, context, MTP, parser plugin, mm limits): no rows.
    # vllm#52308: TRTLLM NVFP4 MoE output is corrupt on B200 for non-gated models.
    Row("*", ("blackwell",), (("--moe-backend", "flashinfer_cutlass"),), "nvfp4-moe-b200", precision="nvfp4",
        moe=True),
]

# Emission order and the flags the plan owns: the one flag table, flagtable.py (kept here under
# their old names for the callers of this module)
ORDER, OWNED, owned_setting = flagtable.ORDER, flagtable.OWNED, flagtable.owned_setting


def rows_for(model, arch: str, spec: bool) -> list[Row]:
    return [r for r in RECIPES
            if r.family in (model.family, "*") and arch in r.archs
            and (r.spec is None or r.spec == spec)
            and (r.precision is None or r.precision == model.precision)
            and (r.moe is None or r.moe == model.moe)]


def flags_for(model, arch: str, spec: bool, supported) -> list[tuple[str, object]]:
    """The recipe flags of `model` on `arch`; `supported(flag)` says whether the pinned vLLM
    has a flag undeprecated (for if_supported rows). A later row replaces an earlier value."""
    out: dict[str, object] = {}
    for row in rows_for(model, arch, spec):
        for name, value in row.flags:
            if row.if_supported and not supported(name):
                continue
            out[name] = value
    return list(out.items())


ordered = flagtable.ordered
