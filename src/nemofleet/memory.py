"""The memory model: what one GPU of an instance needs before vLLM will start, term by term.

Each term is named, explained and sourced in docs/recipes.md#memory-model, and calibrated
against every published figure there (tests/unit/test_plan.py, one test per figure):

    need = weights + activations + KV(one full-context sequence) + Mamba state x max_num_seqs + draft
    available = gpu_memory_utilization x GPU memory

`need` is a startup minimum: vLLM refuses to start unless one max_model_len sequence fits the
KV cache and every one of max_num_seqs sequences has a Mamba state block (vllm#49064). What is
left of `available` becomes KV cache; `full_context_seqs` says how many max_model_len sequences
it holds at once, which is what max_num_seqs really means at long context.
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
    mamba: int  # max_num_seqs states
    reserve: int  # activations + runtime (CUDA context, graphs, NCCL)
    draft: int
    available: int  # util x GPU memory, per GPU
    # the share of the weights the model's card reserves for activations (0: none); when it is
    # larger than the memory model's own activations and runtime, `reserve` is that share
    reserve_fraction: float = 0.0

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.mamba + self.reserve + self.draft

    @property
    def headroom(self) -> int:
        return self.available - self.need

    @property
    def fits(self) -> bool:
        return self.need <= self.available

    @property
    def full_context_seqs(self) -> int:
        """max_model_len sequences the KV cache holds at once (0: vLLM would not start)."""
        if not self.fits or self.kv <= 0:
            return 0
        return 1 + self.headroom // self.kv

    def summary(self) -> str:
        return f"{self.need / GIB:.1f}/{self.available / GIB:.1f} GiB per GPU"

    def terms(self) -> str:
        floor = f" (the card's {self.reserve_fraction:.0%} of the weights)" if self.reserve_from_card else ""
        parts = [f"weights {gib(self.weights)}", f"activations and runtime {gib(self.reserve)}{floor}",
                 f"KV for one full-context sequence {gib(self.kv)}", f"Mamba state {gib(self.mamba)}"]
        if self.draft:
            parts.append(f"draft {gib(self.draft)}")
        return ", ".join(parts)

    @property
    def reserve_from_card(self) -> bool:
        return bool(self.reserve_fraction) and self.reserve == card_reserve(self.weights, self.reserve_fraction)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "activations": self.reserve, "kv_one_sequence": self.kv,
                "mamba": self.mamba, "draft": self.draft, "need": self.need, "available": self.available,
                "full_context_seqs": self.full_context_seqs}


def gib(b: int) -> str:
    return f"{b / GIB:.1f} GiB"


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
             draft: bool, pp: int = 1) -> Memory:
    """Per-GPU memory of one instance of `model` over `tp` GPUs of `gpu_bytes` each, times `pp`
    pipeline stages (a multi-node group, docs/recipes.md#multi-node: each stage holds its share
    of the layers, so weights, KV cache and Mamba state divide by the stages too)."""
    kv_shards = max(1, min(tp, model.kv_heads))  # KV heads shard up to their count, then replicate
    kv = model.kv_bytes_per_token(kv_dtype_bytes(model, kv_cache_dtype)) * max_model_len // kv_shards // pp
    mamba_per_seq = int(model.mamba_state_bytes_fp32 * _MAMBA_FACTOR.get(mamba_dtype, 1.0))
    act = int(ACT_BYTES_PER_TOKEN_PER_BILLION * max_num_batched_tokens * active_params(model) / 1e9)
    weights = model.weight_bytes // (tp * pp)
    # where the model's card states a reserve (Super VL: 15-25 % of the weights), the term is
    # at least its low end (docs/recipes.md#memory-model)
    fraction = getattr(model, "reserve_fraction", 0.0) or 0.0
    own = act + RUNTIME_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
    return Memory(
        weights=weights,
        kv=kv,
        mamba=mamba_per_seq * max_num_seqs // (tp * pp),  # Mamba heads shard across the TP group
        reserve=max(own, card_reserve(weights, fraction)),
        draft=(model.draft_bytes // tp) if draft else 0,
        available=int(util * gpu_bytes),
        reserve_fraction=fraction,
    )


def total_for(mem: Memory, tp: int, util: float, full_context_seqs: int = 1) -> int:
    """Total GPU memory an instance needs to hold `full_context_seqs` max-length sequences at
    once: the published "safe line" (1) and "comfortable" (long context and concurrency),
    docs/recipes.md#memory-model."""
    per_gpu = mem.need + (full_context_seqs - 1) * mem.kv
    return int(per_gpu * tp / util)
