"""Model catalog: what nemofleet knows about each Nemotron checkpoint.

Figures come from the seeds: 000 (Lightning NVFP4: ~21.6 GB, 52 shards, NemotronHForCausalLM),
003 (Lightning BF16/NVFP4, MTP/DFlash/DSpark draft repos), 004 (Super VL 120B-A12B: 231.8 GB
index total, KV 8-11 KB/token, Mamba state ~0.2 GB/sequence, 400 GB total "safe line",
ultra_v3 parser shipped in the repo, MTP with 1 speculative token, mm limits) and 002/Nano.

When the weights are on the host, the model's own config.json and
model.safetensors.index.json override the catalog (see `Model.with_local_meta`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

GB = 10**9


@dataclass(frozen=True)
class Draft:
    repo: str
    revision: str = "main"


@dataclass(frozen=True)
class Model:
    key: str
    repo: str
    revision: str  # pin to a 40-hex commit in group data; "main" is accepted with a warning
    precision: str  # bf16 | nvfp4 | fp8
    weight_bytes: int
    architecture: str
    served_name: str
    max_context: int
    # KV cache: only the attention layers of the hybrid keep one (reference §9, seed 004)
    attention_layers: int
    kv_heads: int
    head_dim: int
    # Mamba-2 SSM state per sequence, fp32 (halved with --mamba-ssm-cache-dtype float16)
    mamba_state_bytes_fp32: int
    moe: bool = True
    hybrid: bool = True
    reasoning_parser: str | None = None
    reasoning_parser_plugin: str | None = None  # file in the model dir (super_v3/ultra_v3)
    tool_call_parser: str | None = None
    # speculative decoding: methods this checkpoint supports, and draft repos per method
    speculative: tuple[str, ...] = ()
    drafts: dict[str, Draft] = field(default_factory=dict)
    default_spec_tokens: int = 3
    archs: tuple[str, ...] = ("ampere", "ada", "hopper", "blackwell")
    multimodal_limits: dict[str, int] | None = None
    min_total_bytes: int = 0  # seed 004: the "safe line" for the whole deployment
    trust_remote_code: bool = True
    default_context: int = 131072  # seed 000: 131072 is stable on 80 GB
    default_speculative: str | None = None  # seed 000: max throughput -> no speculation
    # seeds 000/003: --mamba-backend flashinfer --mamba-ssm-cache-dtype float16 for Lightning;
    # seed 004 leaves both at their defaults for Super VL.
    mamba_backend: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    draft_bytes: int = 2 * 10**9  # DFlash/DSpark draft checkpoints, order of magnitude

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * kv_dtype_bytes

    def with_local_meta(self, meta: dict | None) -> "Model":
        """Override catalog figures with what the downloaded checkpoint says."""
        if not meta:
            return self
        changes: dict = {}
        if meta.get("total_size"):
            changes["weight_bytes"] = int(meta["total_size"])
        cfg = meta.get("config") or {}
        archs = cfg.get("architectures")
        if archs:
            changes["architecture"] = archs[0]
        if cfg.get("max_position_embeddings"):
            changes["max_context"] = int(cfg["max_position_embeddings"])
        if cfg.get("num_key_value_heads"):
            changes["kv_heads"] = int(cfg["num_key_value_heads"])
        if cfg.get("head_dim"):
            changes["head_dim"] = int(cfg["head_dim"])
        pattern = cfg.get("hybrid_override_pattern")
        if isinstance(pattern, str) and pattern:
            changes["attention_layers"] = pattern.count("*")
        elif cfg.get("num_hidden_layers") and not self.hybrid:
            changes["attention_layers"] = int(cfg["num_hidden_layers"])
        return dataclasses.replace(self, **changes)


_LIGHTNING = dict(
    architecture="NemotronHForCausalLM",
    max_context=1_048_576,
    attention_layers=6, kv_heads=2, head_dim=128,
    mamba_state_bytes_fp32=50 * 10**6,
    reasoning_parser="nemotron_v3",
    tool_call_parser="qwen3_coder",
    mamba_backend="flashinfer",
    mamba_ssm_cache_dtype="float16",
    speculative=("mtp", "dflash", "dspark"),
    drafts={
        "dflash": Draft("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash"),
        "dspark": Draft("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark"),
    },
)

_SUPER_VL = dict(
    precision="bf16",
    weight_bytes=int(231.8 * GB),
    architecture="NemotronH_Nano_VL_V2",
    max_context=1_048_576,
    attention_layers=10, kv_heads=2, head_dim=128,  # ~10 KB/token in BF16 (seed 004: 8-11)
    mamba_state_bytes_fp32=200 * 10**6,  # seed 004: ~0.2 GB per sequence
    speculative=("mtp",),
    default_spec_tokens=1,
    multimodal_limits={"image": 8, "video": 2},
    min_total_bytes=400 * GB,
    default_context=262144,  # seed 004
    default_speculative="mtp",  # seed 004: built-in MTP head, 1 token
)

CATALOG: dict[str, Model] = {
    m.key: m
    for m in [
        Model(
            key="nemotron-3.5-lightning-nvfp4",
            repo="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4",
            revision="main", precision="nvfp4", weight_bytes=int(21.6 * GB),
            served_name="nemotron-3.5-lightning", **_LIGHTNING,
        ),
        Model(
            key="nemotron-3.5-lightning-bf16",
            repo="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16",
            revision="main", precision="bf16", weight_bytes=int(63.2 * GB),
            served_name="nemotron-3.5-lightning", **_LIGHTNING,
        ),
        Model(
            key="nemotron-3.5-super-vl-base-bf16",
            repo="nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-Base-BF16",
            revision="main", served_name="nemotron-3.5-super-vl",
            reasoning_parser="ultra_v3", reasoning_parser_plugin="ultra_v3_reasoning_parser.py",
            **_SUPER_VL,
        ),
        Model(
            key="nemotron-3.5-super-vl-bf16",
            repo="nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16",
            revision="main", served_name="nemotron-3.5-super-vl",
            reasoning_parser="super_v3", reasoning_parser_plugin="super_v3_reasoning_parser.py",
            tool_call_parser="qwen3_coder",
            **_SUPER_VL,
        ),
        Model(
            key="nemotron-3-nano-bf16",
            repo="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
            revision="main", precision="bf16", weight_bytes=int(63.2 * GB),
            architecture="NemotronHForCausalLM", served_name="nemotron-3-nano",
            max_context=1_048_576, attention_layers=6, kv_heads=2, head_dim=128,
            mamba_state_bytes_fp32=50 * 10**6,
            reasoning_parser="nemotron_v3", tool_call_parser="qwen3_coder",
            mamba_backend="flashinfer", mamba_ssm_cache_dtype="float16",
        ),
    ]
}

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class UnknownModel(ValueError):
    pass


def is_commit(revision: str) -> bool:
    return bool(_HEX40.match(revision))


def resolve(spec: dict | str) -> Model:
    """Resolve a `model:` value from group data.

    A catalog key ("nemotron-3.5-lightning-nvfp4"), or a dict with `catalog:` plus overrides,
    or a generic entry for any HF model id: {"repo": "org/name", "weight_bytes": ..., ...}.
    """
    if isinstance(spec, str):
        spec = {"catalog": spec}
    if not isinstance(spec, dict):
        raise UnknownModel(f"model must be a catalog name or a mapping, not {type(spec).__name__}")
    spec = dict(spec)
    key = spec.pop("catalog", None)
    if key is not None:
        if key not in CATALOG:
            raise UnknownModel(
                f"unknown model {key!r}; known: {', '.join(sorted(CATALOG))}, or give "
                "{'repo': 'org/name', 'weight_bytes': N} for any Hugging Face model"
            )
        base = CATALOG[key]
    else:
        repo = spec.get("repo")
        if not isinstance(repo, str) or not _REPO.match(repo):
            raise UnknownModel(f"model repo {repo!r} is not a Hugging Face id of the form org/name")
        if not isinstance(spec.get("weight_bytes"), int):
            raise UnknownModel(f"generic model {repo} needs weight_bytes (an integer) for the memory budget")
        base = Model(
            key=repo.split("/")[1].lower(), repo=repo, revision="main", precision="bf16",
            weight_bytes=spec["weight_bytes"], architecture="unknown",
            served_name=repo.split("/")[1].lower(), max_context=spec.get("max_context", 32768),
            attention_layers=spec.get("attention_layers", 32), kv_heads=spec.get("kv_heads", 8),
            head_dim=spec.get("head_dim", 128), mamba_state_bytes_fp32=0, moe=False, hybrid=False,
            trust_remote_code=False,
        )
    fields = {f.name for f in dataclasses.fields(Model)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise UnknownModel(f"model settings {', '.join(unknown)} are not known to nemofleet")
    if "drafts" in spec:
        spec["drafts"] = {k: Draft(**v) if isinstance(v, dict) else v for k, v in spec["drafts"].items()}
    model = dataclasses.replace(base, **spec)
    if not isinstance(model.revision, str) or not re.match(r"^[\w./-]+$", model.revision):
        raise UnknownModel(f"revision {model.revision!r} is not a branch, tag or commit")
    return model


def local_dir_name(repo: str) -> str:
    """Directory under the models root: 'nvidia/X' -> 'nvidia--X'."""
    return repo.replace("/", "--")
