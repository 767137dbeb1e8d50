"""The serving plan: a pure function from (host facts, host data) to vLLM instances.

Deploy code and templates only render a Plan; every decision is made here, so it can be
unit-tested without hosts and printed by `nemofleet plan` before hardware exists.
A plan either succeeds completely or raises PlanError with one sentence: never half a plan.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

from . import gpus as gpu_table
from . import models as catalog
from . import vllm_flags

GIB = 1024**3
MIB = 1024**2
DEFAULT_IMAGE = "vllm/vllm-openai:v0.27.1"
CONTAINER_PORT = 8000
TP_SIZES = (1, 2, 4, 8)
# reference §9 / seed 004: activations, logits (131072 vocab), CUDA graphs; NCCL buffers
# for expert parallelism when TP > 1. Fraction of the per-GPU weights.
RESERVE_TP1 = 0.15
RESERVE_TPN = 0.20
CUDA_CONTEXT_BYTES = int(1.5 * GIB)

# Reference GPU classes used to say what *would* fit a model that does not fit here.
REFERENCE_GPUS = [
    ("H200", 143771 * MIB), ("B200", 183359 * MIB), ("H100", 81559 * MIB), ("A100 80 GB", 81920 * MIB),
]


class PlanError(ValueError):
    """One sentence saying why this host cannot serve what the inventory asks for."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    cc: str
    mig: str = "Disabled"
    persistence: str = "Enabled"
    bus_id: str = ""


@dataclass
class Memory:
    weights: int
    kv: int
    mamba: int
    reserve: int
    draft: int
    available: int  # util x GPU memory, per GPU

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.mamba + self.reserve + self.draft

    def summary(self) -> str:
        return f"{self.need / GIB:.1f}/{self.available / GIB:.1f} GiB per GPU"


@dataclass
class Instance:
    name: str  # container name; unit is nemofleet-vllm-<name>.service
    gpus: list[Gpu]
    host_port: int
    tp: int
    ep: bool
    args: list[str]  # everything after the image name (model path first)
    memory: Memory
    max_model_len: int
    max_num_seqs: int

    @property
    def unit(self) -> str:
        return f"nemofleet-vllm-{self.name}.service"

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


@dataclass
class Mount:
    host: str
    container: str


@dataclass
class Plan:
    host: str
    model: catalog.Model
    image: str
    vllm_version: str
    instances: list[Instance]
    gpu_method: str  # cdi | gpus
    mounts: list[Mount]
    downloads: list[dict]  # {repo, revision, dir}
    env: dict[str, str]
    bind_address: str
    served_name: str
    warnings: list[str] = field(default_factory=list)
    docker_exec_opts: list[str] | None = None  # daemon.json exec-opts the plan needs

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "model": self.model.key,
            "repo": self.model.repo,
            "revision": self.model.revision,
            "image": self.image,
            "vllm_version": self.vllm_version,
            "gpu_method": self.gpu_method,
            "served_name": self.served_name,
            "warnings": self.warnings,
            "instances": [
                {
                    "name": i.name, "unit": i.unit, "gpus": [g.index for g in i.gpus],
                    "gpu_uuids": i.gpu_uuids, "port": i.host_port, "tp": i.tp, "ep": i.ep,
                    "max_model_len": i.max_model_len, "max_num_seqs": i.max_num_seqs,
                    "memory_need_bytes": i.memory.need, "memory_available_bytes": i.memory.available,
                    "args": i.args,
                }
                for i in self.instances
            ],
        }


# ---------------------------------------------------------------------------- settings

_SETTINGS = {
    # key: (type, description) -- host.data keys the plan reads
    "model": ((str, dict), "catalog key or model mapping"),
    "vllm_image": (str, "image reference"),
    "max_model_len": (int, "context length"),
    "max_num_seqs": (int, "concurrent sequences per instance"),
    "max_num_batched_tokens": (int, "tokens per batch"),
    "gpu_memory_utilization": ((int, float), "fraction of each GPU's memory for vLLM"),
    "tensor_parallel_size": (int, "GPUs per instance"),
    "instances": (int, "vLLM instances on the host"),
    "speculative": ((str, type(None)), "mtp | dflash | dspark | none"),
    "num_speculative_tokens": (int, "speculative tokens"),
    "kv_cache_dtype": ((str, type(None)), "KV cache dtype"),
    "vllm_extra_args": (dict, "extra flags {flag: value|true}"),
    "instance_extra_args": (dict, "extra flags per instance {instance: {flag: value|true}}"),
    "port_base": (int, "first host port"),
    "bind_address": (str, "address the ports are published on"),
    "models_root": (str, "weights directory on the host"),
    "gpu_selection": (str, "auto | cdi | gpus"),
    "nvml_remedy": (str, "cdi | cgroupfs | none"),
    "instance_prefix": (str, "container name prefix"),
    "drain_seconds": (int, "vLLM --shutdown-timeout"),
    "hf_endpoint": (str, "Hugging Face mirror URL"),
    "image_registry_rewrite": (dict, "image prefix rewrites {prefix: replacement}"),
}

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,40}$")


def _setting(data: dict, key: str, default=None):
    value = data.get(key, default)
    if value is None and default is None:
        return None
    typ, what = _SETTINGS[key]
    if isinstance(value, bool) and typ in (int, (int, float)):
        raise PlanError(f"{key} ({what}) must be a number, not {value!r}")
    if not isinstance(value, typ):
        tname = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise PlanError(f"{key} ({what}) must be {tname}, not {value!r}")
    return value


def _mem_gib(b: int) -> str:
    return f"{b / GIB:.0f} GiB"


# ---------------------------------------------------------------------------- memory


def _kv_dtype_bytes(model: catalog.Model, kv_cache_dtype: str | None) -> int:
    if kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return 1
    if kv_cache_dtype == "nvfp4":
        return 1  # plus scales; round up
    if kv_cache_dtype in (None, "auto") and model.precision == "nvfp4":
        return 1  # seed 000: the NVFP4 checkpoint selects an fp8_e4m3 KV cache
    return 2


def estimate(model, tp, gpu_bytes, util, max_model_len, max_num_seqs, kv_cache_dtype, spec) -> Memory:
    kv_shards = max(1, min(tp, model.kv_heads))
    mamba_per_seq = model.mamba_state_bytes_fp32 // (2 if model.mamba_ssm_cache_dtype in ("float16", "bfloat16") else 1)
    weights = model.weight_bytes // tp
    return Memory(
        weights=weights,
        # vLLM must fit at least one sequence of max_model_len in the KV cache; the rest is elastic
        kv=model.kv_bytes_per_token(_kv_dtype_bytes(model, kv_cache_dtype)) * max_model_len // kv_shards,
        # ... and one Mamba state per max_num_seqs (vllm#49064)
        mamba=mamba_per_seq * max_num_seqs // tp,
        reserve=int(weights * (RESERVE_TP1 if tp == 1 else RESERVE_TPN)) + CUDA_CONTEXT_BYTES,
        draft=(model.draft_bytes // tp) if spec in ("dflash", "dspark") else 0,
        available=int(util * gpu_bytes),
    )


def _fits(model, tp, gpu_bytes, util, mml, seqs, kvd, spec) -> tuple[bool, Memory]:
    mem = estimate(model, tp, gpu_bytes, util, mml, seqs, kvd, spec)
    return mem.need <= mem.available and tp * gpu_bytes >= model.min_total_bytes, mem


def what_would_fit(model, util, mml, seqs, kvd, spec) -> str:
    options = []
    for name, size in REFERENCE_GPUS:
        for tp in TP_SIZES:
            if _fits(model, tp, size, util, mml, seqs, kvd, spec)[0]:
                options.append(f"{tp}x {name}")
                break
    if not options:
        return "no single host of up to 8 GPUs"
    return " or ".join(options[:3]) + (" with TP" if any(not o.startswith("1x") for o in options[:3]) else "")


# ---------------------------------------------------------------------------- flags


def _flags(model, arch, v, tp, mml, util, seqs, batched, kvd, spec, spec_tokens, draft_paths,
           model_path, drain, extra) -> list[tuple[str, object]]:
    f: list[tuple[str, object]] = [("--served-model-name", model.served_name)]
    if model.trust_remote_code:
        f.append(("--trust-remote-code", None))
    if tp > 1:
        f.append(("--tensor-parallel-size", tp))
        if model.moe:
            # seed 004: MoE models always want expert parallelism across the TP group
            f.append(("--enable-expert-parallel", None))
    f += [
        ("--max-model-len", mml),
        ("--gpu-memory-utilization", f"{util:.2f}"),
        ("--max-num-seqs", seqs),
        ("--max-num-batched-tokens", batched),
    ]
    if kvd:
        f.append(("--kv-cache-dtype", kvd))
    if model.hybrid:
        f.append(("--enable-prefix-caching", None))
    if arch.async_scheduling:
        f.append(("--async-scheduling", None))
    if model.mamba_backend:
        f.append(("--mamba-backend", model.mamba_backend))
    if model.moe and arch.humming:
        f += [("--moe-backend", "humming"), ("--linear-backend", "humming")]
    if model.moe and arch.native_fp4 and model.precision == "nvfp4":
        # vllm#52308: TRTLLM NVFP4 MoE is corrupt on B200 for non-gated models
        f.append(("--moe-backend", "flashinfer_cutlass"))
    if model.mamba_backend == "flashinfer":  # --mamba-ssu-algorithm needs flashinfer
        if (arch.ssu_horizontal and not spec) or (spec and arch.ssu_horizontal_with_spec):
            f.append(("--mamba-ssu-algorithm", "horizontal"))
    mcm = v.flags.get("--mamba-cache-mode")
    if model.hybrid and mcm is not None and not mcm.deprecated and model.mamba_backend:
        f.append(("--mamba-cache-mode", "align"))  # seeds 000/003 on v0.27.1
    if model.mamba_ssm_cache_dtype:
        f.append(("--mamba-ssm-cache-dtype", model.mamba_ssm_cache_dtype))
        # reference §9.2: stochastic rounding needs an fp16 SSM cache
        if model.mamba_ssm_cache_dtype == "float16" and arch.stochastic_rounding and model.mamba_backend == "flashinfer":
            f += [("--enable-mamba-cache-stochastic-rounding", None), ("--mamba-cache-philox-rounds", 5)]
    if spec:
        sc: dict = {"method": spec, "num_speculative_tokens": spec_tokens}
        if spec in draft_paths:
            sc["model"] = draft_paths[spec]
        f.append(("--speculative-config", json.dumps(sc, separators=(",", ":"))))
    if model.reasoning_parser:
        if model.reasoning_parser_plugin:
            f.append(("--reasoning-parser-plugin", f"{model_path}/{model.reasoning_parser_plugin}"))
        f.append(("--reasoning-parser", model.reasoning_parser))
    if model.tool_call_parser:
        f += [("--tool-call-parser", model.tool_call_parser), ("--enable-auto-tool-choice", None)]
    if model.multimodal_limits:
        f.append(("--limit-mm-per-prompt", json.dumps(model.multimodal_limits, separators=(",", ":"))))
    f += [("--host", "0.0.0.0"), ("--port", CONTAINER_PORT), ("--shutdown-timeout", drain)]
    # operator extras last; a repeated flag replaces the planned one
    names = {n for n, _ in extra}
    f = [(n, val) for n, val in f if n not in names] + list(extra)
    return f


def _validate_flags(v: vllm_flags.VllmVersion, flags, model) -> None:
    for name, value in flags:
        err = vllm_flags.check_arg(v, name, value)
        if err:
            raise PlanError(err)
    rp = dict(flags).get("--reasoning-parser")
    if rp and rp not in v.reasoning_parsers and "--reasoning-parser-plugin" not in dict(flags):
        raise PlanError(
            f"reasoning parser {rp!r} is not registered in vLLM {v.version}; ship its plugin file "
            "with the model and set reasoning_parser_plugin"
        )


# ---------------------------------------------------------------------------- plan


def make_plan(host: str, gpus: list[Gpu], data: dict, *, docker_version: str | None = None,
              cdi_available: bool = False, cgroup_version: int | None = None,
              cgroup_driver: str | None = None, local_meta: dict | None = None) -> Plan:
    """Decide what `host` serves. Raises PlanError with one sentence on any impossibility."""
    if not gpus:
        raise PlanError("no NVIDIA GPU is visible on this host")
    try:
        model = catalog.resolve(_setting(data, "model", "nemotron-3.5-lightning-nvfp4"))
    except catalog.UnknownModel as exc:
        raise PlanError(str(exc)) from None
    model = model.with_local_meta(local_meta)

    image = _setting(data, "vllm_image", DEFAULT_IMAGE)
    version = vllm_flags.version_of_image(image)
    # registry-mirrors only apply to Docker Hub (reference §4): other registries are reached
    # through a rewritten name, e.g. {"nvcr.io/": "registry.internal/nvcr/"}
    for prefix, replacement in (_setting(data, "image_registry_rewrite", {}) or {}).items():
        if image.startswith(prefix):
            image = replacement + image[len(prefix):]
            break
    try:
        v = vllm_flags.get(version)
    except vllm_flags.UnknownVersion as exc:
        raise PlanError(str(exc)) from None

    names = {g.name for g in gpus}
    if len(names) > 1:
        raise PlanError(f"this host mixes GPU models ({', '.join(sorted(names))}); give each class its own instances via group data")
    try:
        ccs = {g.cc or gpu_table.cc_for_name(g.name) for g in gpus}
        if None in ccs:
            raise gpu_table.UnsupportedGpu(f"cannot tell the compute capability of {gpus[0].name}")
        arch = gpu_table.arch_for_cc(ccs.pop())
    except gpu_table.UnsupportedGpu as exc:
        raise PlanError(str(exc)) from None
    if arch.name not in model.archs:
        raise PlanError(f"{model.key} does not run on {arch.name} GPUs (supported: {', '.join(model.archs)})")

    warnings: list[str] = []
    if not catalog.is_commit(model.revision):
        warnings.append(
            f"revision {model.revision!r} of {model.repo} is not a commit SHA; pin a 40-hex commit so "
            "re-runs never ask the Hub"
        )

    gpu_bytes = min(g.memory_mib for g in gpus) * MIB
    util = float(_setting(data, "gpu_memory_utilization", 0.90))
    if not 0 < util <= 1:
        raise PlanError(f"gpu_memory_utilization {util} must be in (0, 1]")
    mml = _setting(data, "max_model_len", min(model.default_context, model.max_context))
    if mml <= 0:
        raise PlanError(f"max_model_len {mml} must be positive")
    if mml > model.max_context:
        raise PlanError(f"max_model_len {mml} is above {model.key}'s maximum context of {model.max_context}")
    seqs = _setting(data, "max_num_seqs", arch.default_max_num_seqs)
    batched = _setting(data, "max_num_batched_tokens", arch.default_max_num_batched_tokens)
    if seqs <= 0 or batched <= 0:
        raise PlanError("max_num_seqs and max_num_batched_tokens must be positive")
    kvd = _setting(data, "kv_cache_dtype")
    spec = _setting(data, "speculative", model.default_speculative)
    spec = None if spec in (None, "none", "") else spec
    if spec and spec not in model.speculative:
        raise PlanError(
            f"speculative decoding {spec!r} is not available for {model.key} "
            f"(supported: {', '.join(model.speculative) or 'none'})"
        )
    spec_tokens = _setting(data, "num_speculative_tokens", model.default_spec_tokens)
    drain = _setting(data, "drain_seconds", 30)
    if drain < 0:
        raise PlanError("drain_seconds must not be negative")

    extra = _extra(_setting(data, "vllm_extra_args", {}) or {})
    per_instance = _setting(data, "instance_extra_args", {}) or {}

    n = len(gpus)
    tp_req = _setting(data, "tensor_parallel_size")
    if tp_req is not None:
        if tp_req <= 0 or n % tp_req:
            raise PlanError(f"tensor_parallel_size {tp_req} does not divide this host's {n} GPUs")
        ok, mem = _fits(model, tp_req, gpu_bytes, util, mml, seqs, kvd, spec)
        if not ok:
            raise PlanError(
                f"{model.key} with tensor_parallel_size {tp_req} needs {mem.summary()}"
                f"{' and ' + _mem_gib(model.min_total_bytes) + ' in all' if model.min_total_bytes else ''}; "
                f"it needs {what_would_fit(model, util, mml, seqs, kvd, spec)}"
            )
        tp = tp_req
    else:
        tp = next((t for t in TP_SIZES if t <= n and n % t == 0
                   and _fits(model, t, gpu_bytes, util, mml, seqs, kvd, spec)[0]), None)
        if tp is None:
            short = gpu_table.short_name(gpus[0].name)
            raise PlanError(
                f"{model.key} ({model.weight_bytes / 10**9:.0f} GB of {model.precision} weights) "
                f"needs {what_would_fit(model, util, mml, seqs, kvd, spec)}; "
                f"this host has {n}x {short} {gpu_bytes / GIB:.0f} GiB"
            )
    mem = estimate(model, tp, gpu_bytes, util, mml, seqs, kvd, spec)

    count = _setting(data, "instances", n // tp)
    if count <= 0 or count * tp > n:
        raise PlanError(f"{count} instances of {tp} GPU(s) do not fit this host's {n} GPUs")

    root = _setting(data, "models_root", "/srv/nemofleet/models")
    if not root.startswith("/"):
        raise PlanError(f"models_root {root!r} must be an absolute path")
    mdir = catalog.local_dir_name(model.repo)
    model_path = f"/models/{mdir}"
    mounts = [Mount(f"{root}/{mdir}", model_path)]
    downloads = [{"repo": model.repo, "revision": model.revision, "dir": f"{root}/{mdir}"}]
    draft_paths = {}
    if spec in model.drafts:
        d = model.drafts[spec]
        ddir = catalog.local_dir_name(d.repo)
        draft_paths[spec] = f"/models/{ddir}"
        mounts.append(Mount(f"{root}/{ddir}", f"/models/{ddir}"))
        downloads.append({"repo": d.repo, "revision": d.revision, "dir": f"{root}/{ddir}"})
    elif spec in ("dflash", "dspark"):
        raise PlanError(f"speculative {spec} needs a draft checkpoint; set model.drafts.{spec}.repo")

    def args_for(more: list) -> list[str]:
        flags = _flags(model, arch, v, tp, mml, util, seqs, batched, kvd, spec, spec_tokens, draft_paths,
                       model_path, drain, extra + more)
        _validate_flags(v, flags, model)
        return [model_path] + vllm_flags.render(flags)

    args = args_for([])
    prefix = _setting(data, "instance_prefix", "nemotron-")
    port_base = _setting(data, "port_base", 8000)
    if not 1 <= port_base <= 65535 - count:
        raise PlanError(f"port_base {port_base} is not a usable TCP port")
    bind = _setting(data, "bind_address", "127.0.0.1")
    instances = []
    names = [f"{prefix}{i}" for i in range(count)]
    unknown = sorted(set(per_instance) - set(names))
    if unknown:
        raise PlanError(f"instance_extra_args names {', '.join(unknown)}, which the plan does not have ({', '.join(names)})")
    for i, name in enumerate(names):
        if not _NAME.match(name):
            raise PlanError(f"instance name {name!r} is not a valid container name")
        inst_args = args_for(_extra(per_instance[name])) if name in per_instance else args
        instances.append(Instance(
            name=name, gpus=gpus[i * tp:(i + 1) * tp], host_port=port_base + i, tp=tp,
            ep=tp > 1 and model.moe, args=inst_args, memory=mem, max_model_len=mml, max_num_seqs=seqs,
        ))

    # GPU selection and the NVML "Unknown Error" trap (reference §3.3)
    selection = _setting(data, "gpu_selection", "auto")
    remedy = _setting(data, "nvml_remedy", "cdi")
    if remedy not in ("cdi", "cgroupfs", "none"):
        raise PlanError(f"nvml_remedy {remedy!r} is unknown; use cdi, cgroupfs or none")
    if selection not in ("auto", "cdi", "gpus"):
        raise PlanError(f"gpu_selection {selection!r} is unknown; use auto, cdi or gpus")
    dv = _version_tuple(docker_version)
    cdi_ok = cdi_available and dv >= (25, 0)
    if selection == "cdi" and not cdi_ok:
        raise PlanError(
            "gpu_selection cdi needs Docker >= 25 and a CDI spec (nvidia-ctk cdi generate); "
            f"this host has Docker {docker_version or 'none'} and {'a' if cdi_available else 'no'} CDI spec"
        )
    method = "cdi" if selection == "cdi" or (selection == "auto" and remedy == "cdi" and cdi_ok) else "gpus"
    exec_opts = None
    # NVIDIA/nvidia-docker#1730: when systemd manages the container cgroups (Docker's systemd
    # cgroup driver, the default on cgroup v2, possible on v1), devices granted by the legacy
    # hook are dropped at every daemon-reload. Judge by the driver Docker has after this run.
    explicit = data.get("docker_exec_opts")
    driver = effective_cgroup_driver(explicit, cgroup_driver, cgroup_version)
    at_risk = driver == "systemd" and method == "gpus"
    trap = (f"cgroup v{cgroup_version or '?'} with Docker's systemd cgroup driver and the legacy --gpus hook "
            "loses GPUs after every systemctl daemon-reload (NVML 'Unknown Error')")
    if at_risk and explicit is not None:
        raise PlanError(f"docker_exec_opts keeps the systemd cgroup driver, but {trap}; "
                        "drop native.cgroupdriver=systemd from docker_exec_opts or use CDI (Docker >= 25)")
    if at_risk:
        if remedy == "none":
            raise PlanError(f"{trap}; set nvml_remedy to cdi or cgroupfs")
        exec_opts = ["native.cgroupdriver=cgroupfs"]
        warnings.append(
            f"NVML 'Unknown Error' trap: {trap}, and CDI is not usable here (Docker {docker_version or '?'}"
            f"{'' if cdi_available else ', no CDI spec'}); nemofleet sets exec-opts native.cgroupdriver=cgroupfs "
            "and restarts Docker"
        )

    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    endpoint = _setting(data, "hf_endpoint")
    if endpoint:
        if not re.match(r"^https?://[^\s/]+", endpoint):
            raise PlanError(f"hf_endpoint {endpoint!r} must be an http(s):// URL")
        env["HF_ENDPOINT"] = endpoint.rstrip("/")

    return Plan(
        host=host, model=model, image=image, vllm_version=version, instances=instances,
        gpu_method=method, mounts=mounts, downloads=downloads, env=env, bind_address=bind,
        served_name=model.served_name, warnings=warnings, docker_exec_opts=exec_opts,
    )


def effective_cgroup_driver(exec_opts, current: str | None, cgroup_version: int | None) -> str | None:
    """The cgroup driver Docker runs with once daemon.json holds `exec_opts` (None: nemofleet
    leaves exec-opts alone, so the current driver stays). Without a native.cgroupdriver entry,
    Docker >= 20.10 picks systemd on cgroup v2 and cgroupfs on v1."""
    if exec_opts is None:
        return current
    for opt in exec_opts if isinstance(exec_opts, list) else []:
        key, _, value = str(opt).partition("=")
        if key.strip() == "native.cgroupdriver":
            return value.strip()
    return "systemd" if cgroup_version == 2 else "cgroupfs"


def _extra(raw) -> list[tuple[str, object]]:
    if not isinstance(raw, dict):
        raise PlanError(f"extra vLLM args must be a mapping of flag to value, not {raw!r}")
    return [(vllm_flags.normalise(k if k.startswith("--") else f"--{k}"), None if val is True else val)
            for k, val in raw.items()]


def _version_tuple(text: str | None) -> tuple[int, ...]:
    if not text:
        return (0,)
    parts = re.findall(r"\d+", text)[:3]
    return tuple(int(p) for p in parts) or (0,)


def gpus_from_facts(rows: list[dict]) -> list[Gpu]:
    return [Gpu(**{k: r[k] for k in (f.name for f in dataclasses.fields(Gpu)) if k in r}) for r in rows]
