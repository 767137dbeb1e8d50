"""Model catalog: what nemofleet knows about each Nemotron checkpoint.

Every figure is quoted with its public source in docs/recipes.md: Lightning NVFP4 ~21.6 GB in
52 shards, NemotronHForCausalLM (#lightning-a100); Lightning BF16/NVFP4, 30B total / 3B active,
MTP/DFlash/DSpark draft repos (#lightning-h100); Super VL 120B-A12B: 231.8 GB index total,
KV 8-11 KB/token, Mamba state ~0.2 GB/sequence, ultra_v3 parser shipped in the repo, MTP with 1
speculative token, mm limits (#super-vl); Nano (#nano). The flags each model gets per GPU
architecture are in recipes.py, not here.

When the weights are on the host, the model's own config.json and
model.safetensors.index.json override the catalog (see `Model.with_local_meta`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from . import valuetypes as vt

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
    # KV cache: only the attention layers of the hybrid keep one (docs/recipes.md#memory-model)
    attention_layers: int
    kv_heads: int
    head_dim: int
    # Mamba-2 SSM state per sequence, fp32 (halved with --mamba-ssm-cache-dtype float16)
    mamba_state_bytes_fp32: int
    # parameters computed per token (MoE: the active experts); 0 = dense, every parameter.
    # Activations scale with these, not with the total (docs/recipes.md#memory-model).
    active_params: int = 0
    # recipe family: which rows of recipes.RECIPES apply (lightning | nano | super-vl | generic)
    family: str = "generic"
    # the same model at the other precision (NVFP4 <-> BF16), offered when one fits better
    variant: str | None = None
    # how TP is chosen when tensor_parallel_size is unset: smallest (most instances) or largest
    # (one instance over the GPUs); docs/recipes.md#parallelism
    tp_policy: str = "smallest"
    moe: bool = True
    hybrid: bool = True
    reasoning_parser: str | None = None
    reasoning_parser_plugin: str | None = None  # file in the model dir (super_v3/ultra_v3)
    tool_call_parser: str | None = None
    # speculative decoding: methods this checkpoint supports, and draft repos per method
    speculative: tuple[str, ...] = ()
    drafts: dict[str, Draft] = field(default_factory=dict)
    default_spec_tokens: int = 3
    archs: tuple[str, ...] = ("ampere", "ada", "hopper", "blackwell", "sm12x")
    multimodal_limits: dict[str, int] | None = None
    min_total_bytes: int = 0  # optional floor for the whole deployment (generic models)
    trust_remote_code: bool = True
    default_context: int = 131072  # docs/recipes.md#lightning-a100: 131072 is stable on 80 GB
    default_speculative: str | None = None  # docs/recipes.md#lightning-a100: max throughput, no speculation
    draft_bytes: int = 2 * 10**9  # DFlash/DSpark draft checkpoints, order of magnitude
    # The card's reserve for activations, logits and communication buffers, as a fraction of the
    # weights on a GPU: the memory model's activations-and-runtime term is at least this much
    # (0: the memory model's own term, which plans the published recipes that run tighter).
    # docs/recipes.md#memory-model
    reserve_fraction: float = 0.0
    # The card's "safe line": total GPU memory of one instance below which the plan warns with
    # its figures (0: none stated). docs/recipes.md#super-vl
    safe_line_bytes: int = 0
    # the high end of the card's reserve (Super VL: 25 %): the term never exceeds it (0: no cap)
    reserve_fraction_max: float = 0.0
    # Mamba-2 layers: with attention_layers they size one block of vLLM's shared cache pool
    # (memory.block_bytes); 0: unknown (the checkpoint's hybrid_override_pattern tells it), no block check
    mamba_layers: int = 0
    # the `model:` value as the operator wrote it (a catalog key or its mapping): what the plan's
    # "restore with" lines show; not part of what the model is
    given: Any = field(default=None, compare=False, repr=False)

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * kv_dtype_bytes

    def with_local_meta(self, meta) -> "Model":
        """Override catalog figures with what the downloaded checkpoint says (`meta`: the typed
        factmodel.ModelDir of its directory, None when there is none)."""
        if meta is None:
            return self
        changes: dict = {}
        if meta.total_size:
            changes["weight_bytes"] = meta.total_size
        cfg = meta.config
        if cfg is None:
            return dataclasses.replace(self, **changes)
        if cfg.architectures:
            changes["architecture"] = cfg.architectures[0]
        if cfg.max_position_embeddings:
            changes["max_context"] = cfg.max_position_embeddings
        if cfg.num_key_value_heads:
            changes["kv_heads"] = cfg.num_key_value_heads
        if cfg.head_dim:
            changes["head_dim"] = cfg.head_dim
        pattern = cfg.hybrid_override_pattern
        if pattern:
            changes["attention_layers"] = pattern.count("*")
            changes["mamba_layers"] = pattern.count("M")
        elif cfg.num_hidden_layers and not self.hybrid:
            changes["attention_layers"] = cfg.num_hidden_layers
        return dataclasses.replace(self, **changes)


_LIGHTNING: dict[str, Any] = dict(
    architecture="NemotronHForCausalLM",
    max_context=1_048_576,
    attention_layers=6, kv_heads=2, head_dim=128,
    mamba_state_bytes_fp32=50 * 10**6,
    mamba_layers=23,  # docs/recipes.md#memory-model: 23 layers x 64 heads x 64 x 128
    active_params=3 * 10**9,  # docs/recipes.md#lightning-h100: 30B total, 3B active per token
    family="lightning",
    reasoning_parser="nemotron_v3",
    tool_call_parser="qwen3_coder",
    speculative=("mtp", "dflash", "dspark"),
    drafts={
        "dflash": Draft("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash"),
        "dspark": Draft("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark"),
    },
)

_SUPER_VL: dict[str, Any] = dict(
    precision="bf16",
    weight_bytes=int(231.8 * GB),
    architecture="NemotronH_Nano_VL_V2",
    max_context=1_048_576,
    # 8 KiB/token in BF16: the low end of the published 8-11 KB, which the published
    # "256K context ~ 2 GB per sequence" pins (docs/recipes.md#super-vl); config.json overrides it
    attention_layers=8, kv_heads=2, head_dim=128,
    mamba_state_bytes_fp32=200 * 10**6,  # docs/recipes.md#super-vl: ~0.2 GB per sequence
    active_params=12 * 10**9,  # docs/recipes.md#super-vl: 120B total, 12B active
    family="super-vl",
    tp_policy="largest",  # docs/recipes.md#super-vl: "8 cards on one host with TP=8 to start"
    speculative=("mtp",),
    default_spec_tokens=1,
    multimodal_limits={"image": 8, "video": 2},
    default_context=262144,  # docs/recipes.md#super-vl
    default_speculative="mtp",  # docs/recipes.md#super-vl: built-in MTP head, 1 token
    reserve_fraction=0.15,  # docs/recipes.md#super-vl: "reserve 15%-25%" of the weights, the low end
    reserve_fraction_max=0.25,  # ... and the high end
    safe_line_bytes=400 * GB,  # docs/recipes.md#super-vl: "400 GB of total GPU memory is the safe line"
)

CATALOG: dict[str, Model] = {
    m.key: m
    for m in [
        Model(
            key="nemotron-3.5-lightning-nvfp4",
            repo="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4",
            revision="main", precision="nvfp4", weight_bytes=int(21.6 * GB),
            served_name="nemotron-3.5-lightning", variant="nemotron-3.5-lightning-bf16", **_LIGHTNING,
        ),
        Model(
            key="nemotron-3.5-lightning-bf16",
            repo="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16",
            revision="main", precision="bf16", weight_bytes=int(63.2 * GB),
            served_name="nemotron-3.5-lightning", variant="nemotron-3.5-lightning-nvfp4", **_LIGHTNING,
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
            mamba_state_bytes_fp32=50 * 10**6, mamba_layers=23,  # docs/recipes.md#nano: 23 Mamba-2 layers
            active_params=3_500_000_000,  # docs/recipes.md#nano: 3.5B active of 30B
            family="nano",
            # docs/recipes.md#nano: the parser ships in the model repository as a plugin
            reasoning_parser="nano_v3", reasoning_parser_plugin="nano_v3_reasoning_parser.py",
            tool_call_parser="qwen3_coder",
        ),
    ]
}

_HEX40 = re.compile(r"^[0-9a-f]{40}$")

SPEC_METHODS = ("mtp", "dflash", "dspark")
ARCHS = ("ampere", "ada", "hopper", "blackwell", "sm12x")


class UnknownModel(ValueError):
    pass


def is_commit(revision: str) -> bool:
    return isinstance(revision, str) and bool(_HEX40.match(revision))


# ---------------------------------------------------------------------------- field types
# Every field of Model a `model:` mapping may set, with its type: a function value -> (typed
# value) that raises UnknownModel with the end of one sentence. resolve() parses each given field
# through it once; nothing after resolve() sees an untyped value. A test keeps this table equal to
# the fields of Model.


def _bad(why: str):
    raise UnknownModel(why)


def _checked(problem):
    """The type of a valuetypes *_problem function: its sentence's tail refuses the value."""
    def parse(v):
        why = problem(v)
        return v if why is None else _bad(why)
    return parse


def _optional(parse):
    """`parse`, or None for None."""
    return lambda v: None if v is None else parse(v)


def _int(minimum: int, maximum: int = vt.INT_MAX):
    return _checked(lambda v: vt.int_problem(v, minimum, maximum))


def _number(minimum: float, maximum: float):
    return _checked(lambda v: vt.number_problem(v, minimum, maximum))


def _text(pattern: str, what: str):
    return _checked(lambda v: None if isinstance(v, str) and re.fullmatch(pattern, v) else f"{v!r} is not {what}")


def _choice(choices: tuple):
    return _checked(lambda v: None if isinstance(v, str) and v in choices else f"{v!r} is not one of {', '.join(choices)}")


def _bool(v):
    return v if isinstance(v, bool) else _bad(f"must be true or false, not {v!r}")


_repo = _checked(vt.repo_problem)
_revision = _checked(vt.revision_problem)


@_optional
def _plugin(v):
    if vt.file_name_problem(v) or not v.endswith(".py"):
        _bad(f"{v!r} is not the name of a .py file in the model directory")
    return v


def _tuple_of(choices: tuple, nonempty: bool = False):
    def parse(v):
        if not isinstance(v, (list, tuple)) or any(x not in choices or not isinstance(x, str) for x in v):
            _bad(f"{v!r} must be a list of {', '.join(choices)}")
        if nonempty and not v:
            _bad(f"must name at least one of {', '.join(choices)}")
        if len(set(v)) != len(v):
            _bad(f"{v!r} names an entry twice")
        return tuple(v)
    return parse


def _drafts(v):
    if not isinstance(v, dict):
        _bad(f"must be a mapping {{method: {{repo, revision}}}}, not {v!r}")
    out = {}
    for method, d in v.items():
        if method not in SPEC_METHODS or not isinstance(method, str):
            _bad(f"method {method!r} is not one of {', '.join(SPEC_METHODS)}")
        if isinstance(d, Draft):
            d = {"repo": d.repo, "revision": d.revision}
        if not isinstance(d, dict) or set(d) - {"repo", "revision"} or "repo" not in d:
            _bad(f"{method} must be a mapping {{repo, revision}}, not {d!r}")
        try:
            out[method] = Draft(_repo(d["repo"]), _revision(d.get("revision", "main")))
        except UnknownModel as exc:
            _bad(f"{method}: {exc}")
    return out


@_optional
def _limits(v):
    if not isinstance(v, dict) or not all(isinstance(k, str) and re.fullmatch(r"[a-z][a-z_]{0,31}", k)
                                          and vt.int_problem(n, 0, 1024) is None for k, n in v.items()):
        _bad(f"{v!r} must map a modality (image, video, audio) to a count from 0 to 1024")
    return dict(v)


_NAME = r"[a-z0-9][a-z0-9_.-]{0,127}"
FIELD_TYPES = {
    "key": _text(_NAME, "a catalog key (lower-case letters, digits, '_', '.', '-')"),
    "repo": _repo,
    "revision": _revision,
    "precision": _choice(("bf16", "nvfp4", "fp8")),
    "weight_bytes": _int(1, 10**14),
    "architecture": _text(r"[A-Za-z][A-Za-z0-9_]{0,127}", "an architecture class name"),
    "served_name": _text(r"[A-Za-z0-9][A-Za-z0-9._/:+-]{0,127}", "an API model name (letters, digits, . _ / : + -)"),
    "max_context": _int(1, 2**27),
    "attention_layers": _int(0, 4096),
    "kv_heads": _int(1, 4096),
    "head_dim": _int(1, 65536),
    "mamba_state_bytes_fp32": _int(0, 10**12),
    "active_params": _int(0, 10**14),
    "family": _text(r"[a-z0-9][a-z0-9-]{0,31}", "a recipe family (lightning, nano, super-vl, generic)"),
    "variant": _optional(_text(_NAME, "a catalog key")),
    "tp_policy": _choice(("smallest", "largest")),
    "moe": _bool,
    "hybrid": _bool,
    "reasoning_parser": _optional(_text(r"[a-z0-9_]{1,64}", "a vLLM reasoning parser name")),
    "reasoning_parser_plugin": _plugin,
    "tool_call_parser": _optional(_text(r"[a-z0-9_]{1,64}", "a vLLM tool call parser name")),
    "speculative": _tuple_of(SPEC_METHODS),
    "drafts": _drafts,
    "default_spec_tokens": _int(1, 16),
    "archs": _tuple_of(ARCHS, nonempty=True),
    "multimodal_limits": _limits,
    "min_total_bytes": _int(0, 10**15),
    "trust_remote_code": _bool,
    "default_context": _int(1, 2**27),
    "default_speculative": _optional(_choice(SPEC_METHODS + ("none",))),
    "draft_bytes": _int(0, 10**14),
    "reserve_fraction": _number(0.0, 1.0),
    "safe_line_bytes": _int(0, 10**15),
    "reserve_fraction_max": _number(0.0, 1.0),
    "mamba_layers": _int(0, 10**4),
}


def parse_fields(spec: dict) -> dict:
    """{field: typed value} for the fields a `model:` mapping gives, or UnknownModel with one
    sentence naming the first field that is not of its type."""
    fields = {f.name for f in dataclasses.fields(Model) if f.compare}  # not `given`: what was written
    odd = [k for k in spec if not isinstance(k, str)]
    if odd:
        raise UnknownModel(f"model setting names must be strings; {odd[0]!r} is not one")
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise UnknownModel(f"model settings {', '.join(unknown)} are not known to nemofleet")
    out = {}
    for name, value in spec.items():
        parse = FIELD_TYPES.get(name)
        if parse is None:  # a field added to Model without a type here: refused, never unchecked
            raise UnknownModel(f"model setting {name} has no declared type in nemofleet (models.FIELD_TYPES)")
        try:
            out[name] = parse(value)
        except UnknownModel as exc:
            raise UnknownModel(f"model {name} {exc}") from None
    return out


def resolve(spec: dict | str) -> Model:
    """Resolve a `model:` value from group data.

    A catalog key ("nemotron-3.5-lightning-nvfp4"), or a dict with `catalog:` plus overrides,
    or a generic entry for any HF model id: {"repo": "org/name", "weight_bytes": ..., ...}.
    Every field given is parsed into its type (FIELD_TYPES) or refused in one sentence.
    """
    written = spec
    if isinstance(spec, str):
        spec = {"catalog": spec}
    spec = vt.thawed(spec)  # a typed setting's FrozenMap: read as the mapping it was given as
    if not isinstance(spec, dict):
        raise UnknownModel(f"model must be a catalog name or a mapping, not {type(spec).__name__}")
    spec = dict(spec)
    key = spec.pop("catalog", None)
    if key is not None:
        if not isinstance(key, str) or key not in CATALOG:
            raise UnknownModel(
                f"unknown model {key!r}; known: {', '.join(sorted(CATALOG))}, or give "
                "{'repo': 'org/name', 'weight_bytes': N} for any Hugging Face model"
            )
        base = CATALOG[key]
        given = parse_fields(spec)
    else:
        repo = spec.get("repo")
        if not isinstance(repo, str) or vt.repo_problem(repo):
            raise UnknownModel(f"model repo {repo!r} is not a Hugging Face id of the form org/name")
        if "weight_bytes" not in spec:
            raise UnknownModel(f"generic model {repo} needs weight_bytes (an integer) for the memory budget")
        given = parse_fields(spec)
        name = repo.split("/")[1].lower()
        base = Model(
            key=name if re.fullmatch(_NAME, name) else "generic", repo=repo, revision="main", precision="bf16",
            weight_bytes=given["weight_bytes"], architecture="unknown",
            served_name=name, max_context=32768, attention_layers=32, kv_heads=8,
            head_dim=128, mamba_state_bytes_fp32=0, moe=False, hybrid=False,
            trust_remote_code=False,
        )
    return dataclasses.replace(base, **given, given=written)


def local_dir_name(repo: str) -> str:
    """The repo part of a weights directory name: 'nvidia/X' -> 'nvidia--X' (also the path inside
    the container, which stays the same across commits so a new commit changes only the mount)."""
    return repo.replace("/", "--")


def host_dir_name(repo: str, revision: str) -> str:
    """Weights directory under the models root: one per (repo, commit), so the weights of the
    release before stay on disk for a rollback: 'nvidia--X@0123456789ab'. A revision that is not a
    commit (a plan made offline, before the deploy resolved it) keeps the bare repo name."""
    return f"{local_dir_name(repo)}@{revision[:12]}" if is_commit(revision) else local_dir_name(repo)


def repo_of_dir(name: str) -> str:
    """'nvidia--X@0123456789ab' or 'nvidia--X' -> 'nvidia--X'."""
    return name.split("@", 1)[0]
