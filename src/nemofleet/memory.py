"""The memory model: what one GPU of an instance needs before vLLM will start, term by term.

Each term is named, explained and sourced in docs/recipes.md#memory-model, and calibrated
against every published figure there (tests/unit/test_plan.py, one test per figure). It follows
the two checks the pinned vLLM makes at startup (docs/recipes.md#vllm-startup-checks):

    pool = gpu_memory_utilization x GPU memory - weights - activations and runtime - draft
    1. pool >= KV(one max_model_len request) + its Mamba state blocks
       (v1/core/kv_cache_utils.py _check_enough_kv_cache_memory over every layer's
       max_memory_usage_bytes: one request, not max_num_seqs of them)
    2. max_num_seqs <= the pool's cache blocks, where the model has Mamba layers
       (config/compilation.py: "max_num_seqs (N) exceeds available Mamba cache blocks (M)",
       vllm#49064: each decode sequence of a full CUDA graph needs one block)

`need` is check 1's startup minimum. The pool becomes KV cache and Mamba state blocks;
`full_context_seqs` says how many max_model_len sequences (KV and state) it holds at once,
which is what max_num_seqs really means at long context.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3

# Activations of the profiling forward pass (max_num_batched_tokens tokens): hidden states,
# MoE dispatch buffers and the sampler's logits grow with the tokens in a batch and with the
# width of the computed path, i.e. the *active* parameters. Per token, per billion active
# parameters; not divided by TP (hidden states are replicated across the TP group).
# Calibrated on the Super VL safe line (docs/recipes.md#memory-model).
ACT_BYTES_PER_TOKEN_PER_BILLION = 16 * 1024
# CUDA context, cuBLAS/FlashInfer workspaces and captured CUDA graphs, per GPU.
RUNTIME_BYTES = int(1.5 * GIB)
# NCCL buffers for TP/EP all-reduce and all-to-all, per GPU when TP > 1.
NCCL_BYTES = int(0.5 * GIB)
# On a unified-memory board (GB10, Jetson Thor) the GPU's memory is the system's: this much stays
# for the OS, page cache and the container runtime (docs/recipes.md#unified-memory).
UNIFIED_OS_RESERVE_BYTES = 20 * GIB

_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "nvfp4": 1, "bfloat16": 2, "float16": 2, "auto": 2}
_MAMBA_FACTOR = {"float16": 0.5, "bfloat16": 0.5, "float32": 1.0, "auto": 1.0, None: 1.0}


@dataclass
class Memory:
    weights: int
    kv: int  # one max_model_len sequence
    mamba: int  # max_num_seqs states (every running sequence holds one)
    reserve: int  # activations + runtime (CUDA context, graphs, NCCL)
    draft: int
    available: int  # util x GPU memory, per GPU
    # the share of the weights the model's card reserves for activations (0: none); when it is
    # larger than the memory model's own activations and runtime, `reserve` is that share
    reserve_fraction: float = 0.0
    mamba_seq: int = 0  # one sequence's Mamba state on this GPU
    # state blocks one request holds in vLLM's startup check (MambaSpec.max_memory_usage_bytes:
    # 2 with --mamba-cache-mode align, else 1, plus one per speculative token)
    mamba_blocks: int = 1
    block_bytes: int = 0  # one block of the shared KV/Mamba pool (0: no Mamba layers)
    max_num_seqs: int = 0

    @property
    def need(self) -> int:
        """vLLM's startup check 1: one max_model_len request's KV and Mamba blocks in the pool."""
        return self.weights + self.reserve + self.draft + self.kv + self.mamba_seq * self.mamba_blocks

    @property
    def pool(self) -> int:
        """What is left for the KV cache and the Mamba state blocks."""
        return self.available - self.weights - self.reserve - self.draft

    @property
    def cache_blocks(self) -> int | None:
        """Blocks of the pool (vLLM's get_num_blocks: pool // page size // layers per group);
        None for a model without Mamba layers."""
        if not self.block_bytes:
            return None
        return max(0, self.pool) // self.block_bytes

    @property
    def blocks_short(self) -> bool:
        """vLLM's startup check 2: more sequences than Mamba cache blocks."""
        blocks = self.cache_blocks
        return blocks is not None and self.max_num_seqs > blocks

    @property
    def headroom(self) -> int:
        return self.available - self.need

    @property
    def fits(self) -> bool:
        return self.need <= self.available and not self.blocks_short

    @property
    def full_context_seqs(self) -> int:
        """max_model_len sequences (KV and Mamba state) the pool holds at once (0: vLLM would not start)."""
        per = self.kv + self.mamba_seq
        if not self.fits or per <= 0:
            return 0
        return max(1, self.pool // per)

    def summary(self) -> str:
        return f"{self.need / GIB:.1f}/{self.available / GIB:.1f} GiB per GPU"

    def terms(self) -> str:
        floor = f" (the card's {self.reserve_fraction:.0%} of the weights)" if self.reserve_from_card else ""
        parts = [f"weights {gib(self.weights)}", f"activations and runtime {gib(self.reserve)}{floor}",
                 f"KV for one full-context sequence {gib(self.kv)}",
                 f"Mamba state of one sequence {size(self.mamba_seq * self.mamba_blocks)}"]
        if self.draft:
            parts.append(f"draft {gib(self.draft)}")
        return ", ".join(parts)

    def blocks_problem(self) -> str:
        """Check 2 in vLLM's words, with the figures."""
        return (f"max_num_seqs {self.max_num_seqs} exceeds the {self.cache_blocks} Mamba cache blocks its "
                f"{gib(max(0, self.pool))} cache pool per GPU holds (one block of {size(self.block_bytes)} per decoding "
                "sequence, or vLLM refuses to start)")

    @property
    def reserve_from_card(self) -> bool:
        return bool(self.reserve_fraction) and self.reserve == card_reserve(self.weights, self.reserve_fraction)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "activations": self.reserve, "kv_one_sequence": self.kv,
                "mamba": self.mamba, "mamba_one_sequence": self.mamba_seq, "draft": self.draft, "need": self.need,
                "available": self.available, "cache_pool": self.pool, "cache_blocks": self.cache_blocks,
                "full_context_seqs": self.full_context_seqs}


def gib(b: int) -> str:
    return f"{b / GIB:.1f} GiB"


def size(b: int) -> str:
    """GiB, or MiB below 1 GiB (a Mamba state block is tens of MiB)."""
    return gib(b) if b >= GIB else f"{b / 1024**2:.0f} MiB"


def seqs_phrase(n: int, max_model_len: int) -> str:
    """'1 full 131072-token sequence' / '5 full 131072-token sequences'."""
    return f"{n} full {max_model_len}-token sequence{'' if n == 1 else 's'}"


def card_reserve(weights_per_gpu: int, fraction: float) -> int:
    """A model card's activation reserve on one GPU: `fraction` of the weights it holds."""
    return int(weights_per_gpu * fraction)


def kv_dtype_bytes(model, kv_cache_dtype: str | None) -> int:
    """Bytes per KV element: the flag's dtype, else the checkpoint's (an NVFP4 checkpoint
    selects an fp8_e4m3 KV cache: docs/recipes.md#lightning-a100)."""
    if kv_cache_dtype in (None, "auto"):
        return 1 if model.precision == "nvfp4" else 2
    return _DTYPE_BYTES.get(kv_cache_dtype, 2)


def active_params(model) -> int:
    # a dense generic model computes every parameter (BF16: 2 bytes each)
    return model.active_params or model.weight_bytes // 2


def estimate(model, *, tp: int, gpu_bytes: int, util: float, max_model_len: int, max_num_seqs: int,
             max_num_batched_tokens: int, kv_cache_dtype: str | None, mamba_dtype: str | None,
             draft: bool, pp: int = 1, mamba_align: bool = False, spec_tokens: int = 0) -> Memory:
    """Per-GPU memory of one instance of `model` over `tp` GPUs of `gpu_bytes` each, times `pp`
    pipeline stages (a multi-node group, docs/recipes.md#multi-node: each stage holds its share
    of the layers, so weights, KV cache and Mamba state divide by the stages too). `mamba_align`:
    --mamba-cache-mode align (two state blocks per request); `spec_tokens`: speculative tokens
    (one more state block each), as vLLM's MambaSpec counts them."""
    kv_shards = max(1, min(tp, model.kv_heads))  # KV heads shard up to their count, then replicate
    kv = model.kv_bytes_per_token(kv_dtype_bytes(model, kv_cache_dtype)) * max_model_len // kv_shards // pp
    mamba_per_seq = int(model.mamba_state_bytes_fp32 * _MAMBA_FACTOR.get(mamba_dtype, 1.0))
    act = int(ACT_BYTES_PER_TOKEN_PER_BILLION * max_num_batched_tokens * active_params(model) / 1e9)
    weights = model.weight_bytes // (tp * pp)
    # where the model's card states a reserve (Super VL: 15-25 % of the weights), the term is
    # held within it: at least its low end, at most its high end (docs/recipes.md#memory-model)
    fraction = getattr(model, "reserve_fraction", 0.0) or 0.0
    high = getattr(model, "reserve_fraction_max", 0.0) or 0.0
    own = act + RUNTIME_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
    reserve = max(own, card_reserve(weights, fraction))
    if high:
        reserve = min(reserve, card_reserve(weights, high))
    seq = mamba_per_seq // (tp * pp)  # Mamba heads shard across the TP group
    return Memory(
        weights=weights,
        kv=kv,
        mamba=seq * max_num_seqs,
        reserve=reserve,
        draft=(model.draft_bytes // tp) if draft else 0,
        available=int(util * gpu_bytes),
        reserve_fraction=fraction,
        mamba_seq=seq,
        mamba_blocks=(2 if mamba_align else 1) + spec_tokens if seq else 0,
        block_bytes=block_bytes(model, seq),
        max_num_seqs=max_num_seqs,
    )


def block_bytes(model, mamba_seq: int) -> int:
    """One block of vLLM's shared pool for a hybrid model: every layer's page is unified to the
    Mamba layer's state (unify_hybrid_kv_cache_specs), and the pool is split into `group size`
    tensors, the group size being the fewer of the layer kinds (the attention layers here, unless
    the two counts are within 1.5x: _get_kv_cache_groups_uniform_page_size), so a block costs
    group size x one layer's state. Without the Mamba layer count (the catalog does not know it; the
    checkpoint's hybrid_override_pattern gives it once the weights are on the host) the block cannot
    be sized, and the check is left to vLLM rather than refusing what it may accept (0: no check)."""
    layers, attn = model.mamba_layers, model.attention_layers
    if not mamba_seq or not layers:
        return 0
    if not attn:
        return mamba_seq
    group = max(layers, attn) if max(layers, attn) < 1.5 * min(layers, attn) else min(layers, attn)
    return max(1, mamba_seq * group // layers)


def total_for(mem: Memory, tp: int, util: float, full_context_seqs: int = 1) -> int:
    """Total GPU memory an instance needs to hold `full_context_seqs` max-length sequences at
    once while every one of max_num_seqs sequences holds its Mamba state: the published "safe
    line" (1) and "comfortable" (long context and concurrency), docs/recipes.md#memory-model."""
    per_gpu = mem.weights + mem.reserve + mem.draft + full_context_seqs * mem.kv + mem.mamba
    return int(per_gpu * tp / util)
