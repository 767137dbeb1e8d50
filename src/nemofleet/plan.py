"""The serving plan: a pure function from (host facts, host settings) to vLLM instances.

Deploy code and templates only render a Plan; every decision is made here, so it can be
unit-tested without hosts and printed by `nemofleet plan` before hardware exists.
A plan either succeeds completely or raises PlanError with one sentence: never half a plan.

How a plan is made (docs/recipes.md explains each choice and its source):
1. settings.parse fills and checks the host data; the model comes from the catalog.
2. GPUs: MIG-enabled ones are left out (a warning), `gpus` picks some explicitly, and each GPU
   model on the host is planned on its own.
3. Per GPU model: for each TP size the flags (recipes.py) and the memory (memory.py) are
   computed; the TP is `tensor_parallel_size`, or the smallest/largest that fits
   (`tensor_parallel_policy`, default: the model's recipe), and the choice is explained.
4. A model that fits nowhere is refused with need vs available in GiB, the GPU shapes this
   planner would accept with these settings, and the setting changes that make it fit here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

from . import gpuhealth
from . import gpus as gpu_table
from . import memory as mem_model
from . import models as catalog
from . import flagtable, recipes, settings, versions, vllm_flags
from .memory import Memory

GIB = 1024**3
MIB = 1024**2
CONTAINER_PORT = 8000
TP_SIZES = (1, 2, 4, 8)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,40}$")

__all__ = ["CONTAINER_PORT", "GIB", "Departure", "Gpu", "GroupRole", "Instance", "Memory", "Mount", "Plan", "PlanError",
           "make_plan", "effective_cgroup_driver", "gpus_from_facts", "vllm_batch_defaults"]


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
    # the GPU shares the system memory (GB10, Jetson Thor: nvidia-smi prints memory.total [N/A]);
    # memory_mib is then the MemTotal vLLM sees there (docs/recipes.md#unified-memory)
    unified: bool = False


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
    arch: str = ""
    gpu_label: str = ""  # "H100 80 GiB"
    group: "GroupRole | None" = None  # this host's part of a multi-node serving group (multinode.py)

    @property
    def unit(self) -> str:
        return f"nemofleet-vllm-{self.name}.service"

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


@dataclass(frozen=True)
class GroupRole:
    """A host's part in a multi-node serving group: one model over several hosts (multinode.py)."""
    name: str
    members: tuple[str, ...]  # rank order, the head first
    rank: int
    parallel: str  # pp | tp | dp
    head_address: str
    address: str  # this member's address on the group network
    interface: str
    port: int  # the head's rendezvous port: --master-port, or --data-parallel-rpc-port with dp
    join_timeout: int

    @property
    def head(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "head" if self.head else "worker"

    def to_dict(self) -> dict:
        return {"name": self.name, "members": list(self.members), "rank": self.rank, "role": self.role,
                "parallel": self.parallel, "head_address": self.head_address, "address": self.address,
                "interface": self.interface, "port": self.port}


@dataclass(frozen=True)
class Departure:
    """One place where the planned line departs from the published command it follows
    (docs/recipes.md#departures). `text` is the `departure:` line (what, why, and the setting that
    restores the recipe's way, or that none can); `flags` the flags (or config keys,
    "--speculative-config.num_speculative_tokens") it names; `restore` the host settings that give
    the published command's flags back (the text names them), None where no setting can."""
    text: str
    flags: tuple[str, ...]
    restore: dict | None


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
    choices: list[str] = field(default_factory=list)  # why this TP / instance count, per GPU model
    excluded_gpus: list[int] = field(default_factory=list)  # MIG-enabled, not selected, or idle
    # each departure from the published recipe the plan follows: what, why, and the setting
    # that restores the recipe's way (docs/recipes.md)
    departures: list[str] = field(default_factory=list)
    departed: list[Departure] = field(default_factory=list)  # the same, with their flags and settings

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
            "choices": self.choices,
            "departures": self.departures,
            "excluded_gpus": self.excluded_gpus,
            "instances": [
                {
                    "name": i.name, "unit": i.unit, "gpus": [g.index for g in i.gpus],
                    "gpu_uuids": i.gpu_uuids, "gpu_model": i.gpu_label, "arch": i.arch,
                    "port": i.host_port, "tp": i.tp, "ep": i.ep,
                    "max_model_len": i.max_model_len, "max_num_seqs": i.max_num_seqs,
                    "memory_need_bytes": i.memory.need, "memory_available_bytes": i.memory.available,
                    "full_context_seqs": i.memory.full_context_seqs, "memory": i.memory.to_dict(),
                    "args": i.args, **({"group": i.group.to_dict()} if i.group else {}),
                }
                for i in self.instances
            ],
        }


# ---------------------------------------------------------------------------- host-wide inputs


@dataclass(frozen=True)
class _Ctx:
    """What the host's settings decide, whatever GPUs the model lands on."""
    s: settings.Settings
    model: catalog.Model
    v: vllm_flags.VllmVersion
    mml: int
    spec: str | None
    spec_tokens: int
    model_path: str
    draft_paths: dict
    extra: tuple
    cc: str = ""  # compute capability of the GPU model being planned (set per GPU model by _layout)


class _NoFit(Exception):
    def __init__(self, tp: int, mem: Memory, explicit: bool):
        super().__init__(tp)
        self.tp, self.mem, self.explicit = tp, mem, explicit


def _parse(data) -> settings.Settings:
    if isinstance(data, settings.Settings):
        return data
    try:
        return settings.parse(data)
    except settings.SettingsError as exc:
        raise PlanError("; ".join(exc.problems)) from None


def _context(s: settings.Settings, local_meta: dict | None) -> _Ctx:
    try:
        model = catalog.resolve(s.model).with_local_meta(local_meta)
        v = vllm_flags.get(vllm_flags.version_of_image(s.vllm_image))
    except (catalog.UnknownModel, vllm_flags.UnknownVersion) as exc:
        raise PlanError(str(exc)) from None
    mml = s.max_model_len or min(model.default_context, model.max_context)
    if mml > model.max_context:
        raise PlanError(f"max_model_len {mml} is above {model.key}'s maximum context of {model.max_context}")
    spec = s.speculative if s.speculative is not None else model.default_speculative
    spec = None if spec in (None, "none", "") else spec
    if spec and spec not in model.speculative:
        raise PlanError(f"speculative decoding {spec!r} is not available for {model.key} "
                        f"(supported: {', '.join(model.speculative) or 'none'})")
    if spec in ("dflash", "dspark") and spec not in model.drafts:
        raise PlanError(f"speculative {spec} needs a draft checkpoint; set model.drafts.{spec}.repo")
    draft_paths = {spec: f"/models/{catalog.local_dir_name(model.drafts[spec].repo)}"} if spec in model.drafts else {}
    return _Ctx(s=s, model=model, v=v, mml=mml, spec=spec,
                spec_tokens=s.num_speculative_tokens or model.default_spec_tokens,
                model_path=f"/models/{catalog.local_dir_name(model.repo)}", draft_paths=draft_paths,
                extra=tuple(_extra(s.vllm_extra_args, "vllm_extra_args", v)))


def _extra(raw: dict, where: str, v: vllm_flags.VllmVersion | None = None) -> list[tuple[str, object]]:
    """Operator flags {flag: value|true}; a flag the plan owns is refused with its setting, one that
    carries a secret, loads code or listens is refused by class, and the rest is checked against the
    pinned vLLM's own parser (its generated table, vllm_flags.check_extra)."""
    out = []
    for k, val in raw.items():
        name = vllm_flags.normalise(k if k.startswith("--") else f"--{k}")
        instead = flagtable.owned_setting(name)
        if instead:
            raise PlanError(f"{where} sets {name}, which the plan decides (it must match the published port, "
                            f"the health check and the memory budget); set {instead} instead")
        why = vllm_flags.refused_class(name)
        if why:
            raise PlanError(f"{where} sets {why}")
        if v is not None:
            err = vllm_flags.check_extra(v, name, None if val is True else val)
            if err:
                raise PlanError(f"{where}: {err}")
        out.append((name, None if val is True else val))
    return out


# ---------------------------------------------------------------------------- flags and memory


def _flags(ctx: _Ctx, arch: gpu_table.Arch, tp: int, seqs: int, batched: int, more=()) -> list[tuple[str, object]]:
    """The planned flags: settings-owned ones, then the recipe rows (recipes.py), then the
    operator's extras, which replace a planned flag of the same name."""
    m, s = ctx.model, ctx.s
    f: list[tuple[str, object]] = [("--served-model-name", m.served_name)]
    if m.trust_remote_code:
        f.append(("--trust-remote-code", None))
    if tp > 1:
        f.append(("--tensor-parallel-size", tp))
        if m.moe:  # docs/recipes.md#super-vl: MoE models shard experts across the TP group
            f.append(("--enable-expert-parallel", None))
    f += [("--max-model-len", ctx.mml), ("--gpu-memory-utilization", f"{float(s.gpu_memory_utilization):.2f}"),
          ("--max-num-seqs", seqs), ("--max-num-batched-tokens", batched)]
    if ctx.spec:
        sc: dict = {"method": ctx.spec, "num_speculative_tokens": ctx.spec_tokens}
        if ctx.spec in ctx.draft_paths:
            sc["model"] = ctx.draft_paths[ctx.spec]
        f.append(("--speculative-config", json.dumps(sc, separators=(",", ":"))))
    if m.reasoning_parser:
        if m.reasoning_parser_plugin:
            f.append(("--reasoning-parser-plugin", f"{ctx.model_path}/{m.reasoning_parser_plugin}"))
        f.append(("--reasoning-parser", m.reasoning_parser))
    if m.tool_call_parser:
        f += [("--tool-call-parser", m.tool_call_parser), ("--enable-auto-tool-choice", None)]
    if m.multimodal_limits:
        f.append(("--limit-mm-per-prompt", json.dumps(m.multimodal_limits, separators=(",", ":"))))
    f += [("--host", "0.0.0.0"), ("--port", CONTAINER_PORT)]
    # flags that are a setting's value (--kv-cache-dtype, --shutdown-timeout...): the one flag table's rows
    f += flagtable.from_settings(s)
    planned = {n for n, _ in f}
    f += [r for r in _rows(ctx, arch.name) if r[0] not in planned]
    extra = list(ctx.extra) + list(more)
    names = {n for n, _ in extra}
    return flagtable.ordered([(n, val) for n, val in f if n not in names] + extra)


def _rows(ctx: _Ctx, arch: str) -> list[tuple[str, object]]:
    """The recipe rows (recipes.py) of this model on this GPU; none with recipe_flags: false."""
    if not ctx.s.recipe_flags:
        return []
    return recipes.flags_for(ctx.model, arch, bool(ctx.spec), lambda n: _supported(ctx.v, n), ctx.cc)


def _supported(v: vllm_flags.VllmVersion, name: str) -> bool:
    flag = v.flags.get(name)
    return flag is not None and not flag.deprecated


def _memory(ctx: _Ctx, flags, tp: int, gpu_bytes: int, seqs: int, batched: int, pp: int = 1) -> Memory:
    """Memory of the flags as planned: dtypes are read from the final flags, so an operator's
    extra --mamba-ssm-cache-dtype or a recipe's --kv-cache-dtype is counted as vLLM will use it."""
    d = dict(flags)
    return mem_model.estimate(
        ctx.model, tp=tp, gpu_bytes=gpu_bytes, util=float(ctx.s.gpu_memory_utilization), max_model_len=ctx.mml,
        max_num_seqs=seqs, max_num_batched_tokens=batched, kv_cache_dtype=d.get("--kv-cache-dtype"),
        mamba_dtype=d.get("--mamba-ssm-cache-dtype"), draft=ctx.spec in ("dflash", "dspark"), pp=pp,
        mamba_align=_mamba_align(ctx, d), spec_tokens=ctx.spec_tokens if ctx.spec else 0)


def _mamba_align(ctx: _Ctx, d: dict) -> bool:
    """Whether vLLM keeps two Mamba state blocks per request (--mamba-cache-mode align): set, or
    derived from prefix caching where the pinned vLLM deprecates the flag (0.33)."""
    mode = d.get("--mamba-cache-mode")
    if mode is not None:
        return mode == "align"
    flag = ctx.v.flags.get("--mamba-cache-mode")
    return "--enable-prefix-caching" in d and (flag is None or bool(flag.deprecated))


def _validate(ctx: _Ctx, flags) -> None:
    # the operator's extras were checked against the real parser's table (_extra); the plan's own
    # flags against the table of what it emits
    extras = {n for n, _ in ctx.extra} | {n for extra in ctx.s.instance_extra_args.values()
                                          for n in (vllm_flags.normalise(k if k.startswith("--") else f"--{k}")
                                                    for k in extra)}
    for name, value in flags:
        if name in extras:
            continue
        err = vllm_flags.check_arg(ctx.v, name, value)
        if err:
            raise PlanError(err)
    d = dict(flags)
    rp = d.get("--reasoning-parser")
    if rp and rp not in ctx.v.reasoning_parsers and "--reasoning-parser-plugin" not in d:
        raise PlanError(f"reasoning parser {rp!r} is not registered in vLLM {ctx.v.version}; ship its plugin file "
                        "with the model and set reasoning_parser_plugin")


# ---------------------------------------------------------------------------- one GPU model


@dataclass
class _Layout:
    gpus: list[Gpu]
    arch: gpu_table.Arch
    tp: int
    count: int
    seqs: int
    batched: int
    mem: Memory
    choice: str
    ctx: _Ctx  # the host's, with gpu_memory_utilization capped on a unified-memory board
    groups: list[list[Gpu]] = field(default_factory=list)  # the GPUs of each instance
    idle: list[Gpu] = field(default_factory=list)  # GPUs of this model no instance uses


def _viable(ctx: _Ctx, mem: Memory, tp: int, gpu_bytes: int) -> bool:
    return mem.fits and tp * gpu_bytes >= ctx.model.min_total_bytes


def _unified_util(ctx: _Ctx, gpu: Gpu) -> _Ctx:
    """On a unified-memory board vLLM sees the whole system memory as GPU memory and budgets
    gpu_memory_utilization x that, so the OS keeps its reserve only if the fraction leaves it:
    the setting is capped at (MemTotal - UNIFIED_OS_RESERVE) / MemTotal, rounded down to 0.01
    (docs/recipes.md#unified-memory)."""
    if not gpu.unified:
        return ctx
    total = gpu.memory_mib * MIB
    if total <= mem_model.UNIFIED_OS_RESERVE_BYTES:
        raise PlanError(f"GPU {gpu.index} ({gpu.name}) shares {mem_model.gib(total)} of system memory, no more than "
                        f"the {mem_model.gib(mem_model.UNIFIED_OS_RESERVE_BYTES)} the OS keeps; nothing is left for vLLM")
    cap = int((total - mem_model.UNIFIED_OS_RESERVE_BYTES) * 100 // total) / 100
    if float(ctx.s.gpu_memory_utilization) <= cap:
        return ctx
    return dataclasses.replace(ctx, s=ctx.s.replace(gpu_memory_utilization=cap))


def _layout(ctx: _Ctx, group: list[Gpu]) -> _Layout:
    """TP and instance count for one GPU model, on ANY list of its GPUs (a host's, those `gpus`
    selects, those left once unhealthy ones are out): every TP of TP_SIZES up to the GPU count
    is computed, and when the count is not a multiple of the chosen TP the largest subset that
    fits is used (gpus.tp_groups) and the idle GPUs are named with the reason. Raises _NoFit
    (with figures) or PlanError."""
    try:
        arch = gpu_table.arch_of(group[0])
    except gpu_table.UnsupportedGpu as exc:
        raise PlanError(str(exc)) from None
    cc = group[0].cc or gpu_table.cc_for_name(group[0].name) or ""
    ctx = dataclasses.replace(_unified_util(ctx, group[0]), cc=cc)
    m, s, n = ctx.model, ctx.s, len(group)
    if arch.name not in m.archs:
        raise PlanError(f"{m.key} does not run on {arch.name} GPUs (supported: {', '.join(m.archs)})")
    gpu_bytes = group[0].memory_mib * MIB
    seqs = s.max_num_seqs or arch.default_max_num_seqs
    batched = s.max_num_batched_tokens or arch.default_max_num_batched_tokens
    want = s.instances
    tp_req = s.tensor_parallel_size
    # a TP of TP_SIZES may leave GPUs idle (3 GPUs: TP2 + one idle); any other must divide the GPUs
    if tp_req and (tp_req > n or (n % tp_req and tp_req not in TP_SIZES)):
        raise PlanError(f"tensor_parallel_size {tp_req} does not divide {_gpus_phrase(ctx, group)}")
    # every TP this group allows is computed, so the choice can name the alternatives
    sizes = sorted({t for t in TP_SIZES if (want or 1) * t <= n} | ({tp_req} - {None}))
    if not sizes:
        raise PlanError(f"{want} instances of 1 GPU(s) do not fit {_gpus_phrase(ctx, group)}")
    mems = {t: _memory(ctx, _flags(ctx, arch, t, seqs, batched), t, gpu_bytes, seqs, batched) for t in sizes}
    fitting = [t for t in sizes if _viable(ctx, mems[t], t, gpu_bytes)]
    if tp_req and tp_req not in fitting:
        raise _NoFit(tp_req, mems[tp_req], explicit=True)
    if not fitting:
        raise _NoFit(sizes[-1], mems[sizes[-1]], explicit=False)
    policy = s.tensor_parallel_policy
    policy = m.tp_policy if policy == "recipe" else policy
    tp = tp_req or (fitting[0] if policy == "smallest" else fitting[-1])
    count = want or n // tp
    if count * tp > n:
        raise PlanError(f"{count} instances of {tp} GPU(s) do not fit {_gpus_phrase(ctx, group)}")
    parts, idle = gpu_table.tp_groups(group, tp, count)
    choice = _explain(ctx, group, tp, count, mems, fitting, policy)
    if idle:
        choice += "; " + _idle_reason(ctx, group, idle, tp, fitting, policy)
    _validate(ctx, _flags(ctx, arch, tp, seqs, batched))
    return _Layout(group, arch, tp, count, seqs, batched, mems[tp], choice, ctx, parts, idle)


def _idle_reason(ctx: _Ctx, group, idle: list[Gpu], tp: int, fitting: list[int], policy: str) -> str:
    """'GPU 2 stays idle: ...': why the GPUs no instance uses are left, and what would use them."""
    n, which = len(group), ", ".join(str(g.index) for g in idle)
    head = f"GPU {which} stay idle" if len(idle) > 1 else f"GPU {which} stays idle"
    if ctx.s.instances:
        return f"{head}: instances is {ctx.s.instances}"
    why = (f"{n} GPUs are not a multiple of TP{tp}, TP takes 1, 2, 4 or 8 GPUs and the instances on one GPU "
           "model share one TP")
    whole = [t for t in fitting if n % t == 0]
    if whole:
        t = whole[-1] if policy == "largest" else whole[0]
        return f"{head}: {why}; tensor_parallel_size: {t} uses every GPU ({n // t} x TP{t})"
    return f"{head}: {why}, and no smaller TP fits" if tp > 1 else f"{head}: {why}"


def _gpus_phrase(ctx: _Ctx, group: list[Gpu]) -> str:
    return f"this host's {len(group)} GPUs" if not ctx.s.gpus else f"the {len(group)} GPUs selected by gpus"


def _explain(ctx: _Ctx, group, tp: int, count: int, mems: dict, fitting: list[int], policy: str) -> str:
    """'8x H100 80 GiB: 8 x TP1 (...): each fits with N GiB headroom ...; TP2 available with ...'."""
    mem = mems[tp]
    if ctx.s.tensor_parallel_size:
        why = f"tensor_parallel_size {tp}"
    else:
        source = "the model's recipe" if ctx.s.tensor_parallel_policy == "recipe" else "tensor_parallel_policy"
        why = (f"the smallest TP that fits ({source}: smallest)" if policy == "smallest"
               else f"one instance over the GPUs ({source}: largest)")
    text = (f"{len(group)}x {gpu_table.label(group[0])}: {count} x TP{tp}, {why}; each fits with "
            f"{mem.headroom / GIB:.1f} GiB headroom per GPU ({mem.summary()}) and its KV cache holds "
            f"{mem_model.seqs_phrase(mem.full_context_seqs, ctx.mml)} at once for max_num_seqs "
            f"{ctx.s.max_num_seqs or gpu_table.arch_of(group[0]).default_max_num_seqs}")
    others = [f"TP{t} with tensor_parallel_size: {t} ({mems[t].headroom / GIB:.1f} GiB headroom)"
              for t in fitting if t != tp]
    small = [f"TP{t} does not fit ({mems[t].summary()}{_seqs_hint(ctx, group, t)})"
             for t in mems if t < tp and t not in fitting]
    return "; ".join([text] + ([f"also possible: {', '.join(others)}"] if others else []) + small)


def _seqs_hint(ctx: _Ctx, group, tp: int) -> str:
    """', it would with max_num_seqs: N' when fewer sequences (less Mamba state) make `tp` fit."""
    arch = gpu_table.arch_of(group[0])
    seqs = ctx.s.max_num_seqs or arch.default_max_num_seqs
    batched = ctx.s.max_num_batched_tokens or arch.default_max_num_batched_tokens
    gpu_bytes = group[0].memory_mib * MIB
    for c in _halves(seqs, 1):
        if _viable(ctx, _memory(ctx, _flags(ctx, arch, tp, c, batched), tp, gpu_bytes, c, batched), tp, gpu_bytes):
            return f"; it would with max_num_seqs: {c}"
    return ""


# ---------------------------------------------------------------------------- refusals


def _refusal(ctx: _Ctx, group: list[Gpu], nofit: _NoFit, local_meta) -> PlanError:
    m, mem = ctx.model, nofit.mem
    util = float(_unified_util(ctx, group[0]).s.gpu_memory_utilization)  # as planned: capped on unified memory
    where = f"{len(group)}x {gpu_table.label(group[0])}"
    floor = (f" and {m.min_total_bytes / GIB:.0f} GiB in all" if m.min_total_bytes else "")
    if nofit.explicit:
        head = f"{m.key} with tensor_parallel_size {nofit.tp} needs {mem_model.gib(mem.need)} per GPU"
    else:
        head = f"{m.key} needs {mem_model.gib(mem.need)} per GPU even at TP{nofit.tp}"
    shapes = _shapes(ctx, group)
    fixes = _fixes(ctx, group, local_meta)
    if mem.need <= mem.available and mem.blocks_short:  # vLLM's second startup check (memory.py)
        return PlanError(
            f"{m.key} on {where} at TP{nofit.tp}: {mem.blocks_problem()}; with these settings nemofleet would plan "
            f"it on {' or '.join(shapes) if shapes else 'no catalog GPU class of up to 8 GPUs'}; "
            + (f"on this host it fits with {' or '.join(fixes)}" if fixes
               else "no single setting change makes it fit this host"))
    return PlanError(
        f"{head}{floor} ({mem.terms()}) but {where} has {mem_model.gib(mem.available)} per GPU at "
        f"gpu_memory_utilization {util:.2f}; with these settings nemofleet would plan it on "
        f"{' or '.join(shapes) if shapes else 'no catalog GPU class of up to 8 GPUs'}; "
        + (f"on this host it fits with {' or '.join(fixes)}" if fixes else "no single setting change makes it fit this host"))


def _shapes(ctx: _Ctx, host_group: list[Gpu] | None = None) -> list[str]:
    """The smallest GPU count of each catalog class on which this planner plans the model with
    these settings (host-specific ones dropped; the same memory model, card reserve included),
    smallest total memory first: at most four, plus the host's own GPU class at a larger count
    where one fits."""
    free = ctx.s.replace(tensor_parallel_size=None, instances=None, gpus=None)
    shape_ctx = dataclasses.replace(ctx, s=free)

    def smallest(name, mib, cc, unified, label, above=0):
        for count in (c for c in TP_SIZES if c > above):
            group = [Gpu(i, f"GPU-shape-{i}", name, mib, cc, unified=unified) for i in range(count)]
            try:
                lay = _layout(shape_ctx, group)
            except (_NoFit, PlanError):
                continue
            return count * mib, f"{count}x {label} (TP{lay.tp}, max_num_seqs {lay.seqs})"
        return None

    found = [f for f in (smallest(c.name, c.memory_mib, c.cc, False, c.label) for c in gpu_table.GPU_CLASSES) if f]
    shown = sorted(found)[:4]
    if host_group and not host_group[0].unified:  # a unified-memory board has one GPU: no larger count
        g = host_group[0]
        own = smallest(g.name, g.memory_mib, g.cc, g.unified, gpu_table.label(g), above=len(host_group))
        if own and own[1] not in {text for _, text in shown}:
            shown = sorted(shown + [own])
    return [text for _, text in shown]


def _fixes(ctx: _Ctx, group: list[Gpu], local_meta) -> list[str]:
    """Single setting changes with which this host's GPUs would take the model."""
    s, m = ctx.s, ctx.model
    arch = _safe_arch(group[0])
    seqs = s.max_num_seqs or (arch.default_max_num_seqs if arch else 32)
    tries: list[tuple[dict, str]] = []
    tries += [({"max_num_seqs": c}, f"max_num_seqs: {c}") for c in _halves(seqs, 1)]
    tries += [({"max_model_len": c}, f"max_model_len: {c}") for c in _halves(ctx.mml, 4096)]
    # on unified memory the most vLLM may take is the cap that leaves the OS its reserve
    top = float(_unified_util(dataclasses.replace(ctx, s=s.replace(gpu_memory_utilization=0.95)),
                              group[0]).s.gpu_memory_utilization)
    if float(s.gpu_memory_utilization) < top:
        tries.append(({"gpu_memory_utilization": top}, f"gpu_memory_utilization: {top:.2f}"))
    if mem_model.kv_dtype_bytes(m, s.kv_cache_dtype) > 1:
        tries.append(({"kv_cache_dtype": "fp8"}, "kv_cache_dtype: fp8"))
    if s.tensor_parallel_size:
        tries.append(({"tensor_parallel_size": None}, "tensor_parallel_size unset"))
    if ctx.spec in ("dflash", "dspark"):
        tries.append(({"speculative": "none"}, "speculative: none"))
    if m.variant:
        tries.append(({"model": m.variant}, f"model: {m.variant}"))
    out, done = [], set()
    for change, text in tries:
        key = next(iter(change))
        if key in done:
            continue  # the first (largest) value of a key that fits is the one to show
        try:
            alt = _context(s.replace(**change), None if key == "model" else local_meta)
            lay = _layout(alt, group)
        except (_NoFit, PlanError):
            continue
        done.add(key)
        out.append(f"{text} (TP{lay.tp}, {lay.mem.summary()})")
    return out


def _safe_arch(gpu):
    try:
        return gpu_table.arch_of(gpu)
    except gpu_table.UnsupportedGpu:
        return None


def _halves(start: int, floor: int) -> list[int]:
    out, c = [], start // 2
    while c >= floor:
        out.append(c)
        c //= 2
    return out


# ---------------------------------------------------------------------------- warnings


def _precision_warning(ctx: _Ctx, lay: _Layout, local_meta) -> str | None:
    """NVFP4 below sm100 runs weight-only (docs/recipes.md#nvfp4-below-blackwell): say so, and
    whether the BF16 variant, which computes the same way, fits these GPUs."""
    m = ctx.model
    if m.precision != "nvfp4" or lay.arch.native_fp4:
        return None
    text = (f"{m.key} on {lay.arch.name} (sm{lay.arch.sm}) runs NVFP4 weight-only: FP4 weights are dequantised "
            "by the Marlin/Humming kernels and computed in BF16 (native FP4 needs sm100, Blackwell), so it saves "
            "memory, not compute")
    if not m.variant:
        return text
    try:
        alt = _layout(_context(ctx.s.replace(model=m.variant), None), lay.gpus)
    except (_NoFit, PlanError):
        return f"{text}; {m.variant} does not fit here with these settings"
    return (f"{text}; {m.variant} also fits here ({alt.count} x TP{alt.tp}, {alt.mem.summary()}, "
            f"{alt.mem.full_context_seqs} full-context sequence{'' if alt.mem.full_context_seqs == 1 else 's'}) "
            f"with BF16 weights: set model: {m.variant}")


def _safe_line_warning(lay: _Layout) -> str | None:
    """One warning with the figures when an instance's GPUs hold less memory in all than the
    model card's safe line (Super VL: 400 GB, docs/recipes.md#super-vl). The plan is made only
    because it fits with the card's reserve (memory.estimate); this says what it then holds."""
    m, mem = lay.ctx.model, lay.mem
    total = lay.tp * lay.gpus[0].memory_mib * MIB
    if not m.safe_line_bytes or total >= m.safe_line_bytes:
        return None
    reserve = (f"the card's {m.reserve_fraction:.0%} activation reserve ({mem_model.gib(mem.reserve)} per GPU)"
               if m.reserve_fraction else f"activations and runtime of {mem_model.gib(mem.reserve)} per GPU")
    return (f"{m.key} on {lay.tp}x {gpu_table.label(lay.gpus[0])}: {total / GIB:.1f} GiB ({total / 1e9:.0f} GB) of "
            f"GPU memory per instance, below the {m.safe_line_bytes / GIB:.1f} GiB ({m.safe_line_bytes / 1e9:.0f} GB) "
            f"its card calls the safe line; planned with {reserve}, each instance holds "
            f"{mem_model.seqs_phrase(mem.full_context_seqs, lay.ctx.mml)} at once ({mem.summary()}) for "
            f"max_num_seqs {lay.seqs}{_safe_shape(lay)}")


def _safe_shape(lay: _Layout) -> str:
    """'; 8x A100 80 GiB holds the safe line': the smallest TP size of this GPU class at or above it."""
    g = lay.gpus[0]
    count = next((c for c in TP_SIZES if c * g.memory_mib * MIB >= lay.ctx.model.safe_line_bytes), None)
    return f"; {count}x {gpu_table.label(g)} holds the safe line" if count else ""


def vllm_batch_defaults(version: str, gpu: Gpu) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that `vllm serve` takes on `gpu` when neither flag is
    given: get_batch_defaults in vllm/engine/arg_utils.py, the OPENAI_API_SERVER values. 0.27.1:
    1024/8192 on a GPU of 70 GiB or more that is not an A100, else 256/2048; 0.32.0 adds 1024/16384
    from 160 GiB. vLLM reads the device's total memory: on a unified-memory board, MemTotal."""
    mem, name = gpu.memory_mib * MIB, gpu.name.lower()
    if versions.parse(version) >= (0, 32) and mem >= 160 * GIB:
        return 1024, 16384
    if mem >= 70 * GIB and "a100" not in name:
        return 1024, 8192
    return 256, 2048


# The published commands a plan follows (docs/recipes.md): Lightning's by GPU, the others by model.
_LINES = {"a100": "the A100 README", "h100": "the day-one post's H100 line",
          "dgx-spark": "the day-one post's DGX Spark line", "jetson": "the day-one post's Jetson line",
          "super-vl": "the article", "generic": "a command without them"}


def _line(lay: _Layout) -> str | None:
    """Which published command this plan follows: Lightning's A100 README on Ampere/Ada, the
    day-one post's H100 line on Hopper/Blackwell, its Jetson line on Jetson Thor (cc 11.x) and its
    DGX Spark line on the other sm12x GPUs; Super VL's article; none for Nano (docs/recipes.md#nano
    quotes a guide, not a command); vLLM's own defaults for a generic model."""
    fam, arch = lay.ctx.model.family, lay.arch.name
    if fam == "lightning":
        if arch in ("ampere", "ada"):
            return "a100"
        if arch in ("hopper", "blackwell"):
            return "h100"
        return "jetson" if lay.ctx.cc.startswith("11.") else "dgx-spark"
    return {"super-vl": "super-vl", "generic": "generic"}.get(fam)


def _model_restore(s, **fields) -> dict:
    """The `model:` setting with these fields changed (a catalog key becomes {catalog: key, ...})."""
    base = dict(s.model) if isinstance(s.model, dict) else {"catalog": s.model}
    return {"model": {**base, **fields}}


def _shown(restore: dict) -> str:
    """Settings as an operator writes them in host data: 'max_num_seqs: 1024, model: {...}'."""
    def one(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        return "null" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return ", ".join(f"{k}: {one(v)}" for k, v in restore.items())


def _departures(lay: _Layout) -> list[Departure]:
    """Where the planned line departs from the published command it follows (_line) on this GPU:
    one Departure each, what, why, and the setting that restores the recipe's way, or that none
    can. Sources and reasons: docs/recipes.md (#departures and the sections it names)."""
    ctx, m, s = lay.ctx, lay.ctx.model, lay.ctx.s
    line = _line(lay)
    if line is None:
        return []
    src, out = _LINES[line], []
    g = lay.gpus[0]
    util = float(s.gpu_memory_utilization)

    def add(flags, text, restore):
        way = "vLLM's own values" if line == "generic" else "the recipe's way"
        tail = f"; {_shown(restore)} restores {way}" if restore is not None and "restore" not in text else ""
        out.append(Departure(text + tail, tuple(flags), restore))

    if line in ("h100", "dgx-spark", "jetson"):
        if not s.max_model_len:
            add(["--max-model-len"], f"--max-model-len {ctx.mml}: the day-one recipe leaves the context to the model "
                f"({m.max_context} tokens); nemofleet plans the {ctx.mml} that ran stable on one 80 GB GPU "
                f"(docs/recipes.md#lightning-a100); max_model_len: {m.max_context} restores the recipe's way",
                {"max_model_len": m.max_context})
        if not g.unified and util != recipes.VLLM_DEFAULTS["--gpu-memory-utilization"]:
            why = ("nemofleet's default is the A100 README's measured 0.90 (73 of 80 GB held, "
                   "docs/recipes.md#lightning-a100), which leaves the CUDA context room beside the cache"
                   if util == 0.90 else "gpu_memory_utilization sets it")
            add(["--gpu-memory-utilization"], f"--gpu-memory-utilization {util:.2f}: {src} leaves vLLM's default 0.92 "
                f"(vllm/config/cache.py); {why}", {"gpu_memory_utilization": 0.92})
        if line in ("h100", "dgx-spark") and m.trust_remote_code:
            add(["--trust-remote-code"], f"--trust-remote-code added ({src} leaves it out): the A100 README and "
                "the Jetson line pass it for the same checkpoints (docs/recipes.md#lightning-a100)",
                _model_restore(s, trust_remote_code=False))
        parsers = ([] if line != "dgx-spark" or not m.reasoning_parser else
                   [("--reasoning-parser", m.reasoning_parser)])
        if m.tool_call_parser and line in ("dgx-spark", "jetson"):
            parsers += [("--tool-call-parser", m.tool_call_parser), ("--enable-auto-tool-choice", None)]
        if parsers:
            fields = {"reasoning_parser": None} if line == "dgx-spark" and m.reasoning_parser else {}
            fields.update({"tool_call_parser": None} if m.tool_call_parser else {})
            add([n for n, _ in parsers], " ".join(vllm_flags.render(parsers)) + f" added ({src} sets no "
                f"{'parser' if line == 'dgx-spark' else 'tool-call parser'}): the H100 line and the A100 README set "
                f"them for this model, without them {'reasoning and ' if 'reasoning_parser' in fields else ''}tool "
                "calls come back as plain text (docs/recipes.md#lightning-h100)", _model_restore(s, **fields))
    if line == "h100" and lay.arch.name == "hopper" and ctx.spec:
        add(["--mamba-ssu-algorithm"], "--mamba-ssu-algorithm horizontal left out (the day-one H100 recipe sets it): "
            "FlashInfer runs it on sm90 only without speculative decoding (docs/recipes.md#lightning-h100); "
            "speculative: none restores it, and no setting gives both on sm90", None)
    if line == "dgx-spark":
        if ctx.spec != "dspark":
            add(["--speculative-config"], f"{'speculative ' + ctx.spec if ctx.spec else 'no speculative decoding'} "
                f"where {src} runs DSpark with the {m.drafts['dspark'].repo if 'dspark' in m.drafts else '-DSpark'} "
                "draft (docs/recipes.md#lightning-h100)", {"speculative": "dspark"} if "dspark" in m.drafts else None)
        else:
            add(["--speculative-config.num_speculative_tokens"], f"num_speculative_tokens {ctx.spec_tokens} in "
                f"--speculative-config ({src} leaves the count to the draft checkpoint): vLLM {ctx.v.version} then "
                "takes the draft config's n_predict or stops with 'A speculative model was provided, but "
                "num_speculative_tokens was not provided' (vllm/config/speculative.py), and nemofleet budgets one "
                "Mamba state block per speculative token before the draft is on the host; no setting leaves the "
                "count out (num_speculative_tokens gives another)", None)
        given = {n for n, _ in ctx.extra}
        if not any(n.startswith("--compilation-config") for n in given):
            add(["--compilation-config.cudagraph_capture_sizes"], "--compilation-config.cudagraph_capture_sizes of "
                f"{src} left out: the post tuned those 39 sizes up to 8192 tokens for one user on a DGX Spark, and "
                "nemofleet budgets vLLM's own capture sizes in its runtime term (docs/recipes.md#memory-model)",
                {"vllm_extra_args": {**s.vllm_extra_args, "--compilation_config.cudagraph_capture_sizes":
                                     recipes.DGX_SPARK_CUDAGRAPH_SIZES}})
        rows = [n for n, _ in _rows(ctx, lay.arch.name)]
        if rows:
            add(rows, f"{' '.join(rows)} added ({src} leaves them): its Jetson line sets them on Blackwell outside "
                "sm100 and the A100 README everywhere (docs/recipes.md#sm12x); vllm_extra_args can give each another "
                "value, and recipe_flags: false restores the recipe's way", {"recipe_flags": False})
    if m.family == "super-vl" and m.reasoning_parser_plugin:
        add(["--reasoning-parser-plugin"], f"--reasoning-parser-plugin {ctx.model_path}/{m.reasoning_parser_plugin} "
            f"added (the article passes --reasoning-parser {m.reasoning_parser} alone): vLLM {ctx.v.version} does not "
            f"register {m.reasoning_parser}, the parser file ships in the model repository (docs/recipes.md#super-vl); "
            "no setting restores the article's way: it needs an image whose vLLM registers the parser", None)
    if line in ("super-vl", "dgx-spark", "jetson", "generic"):
        seqs, batched = vllm_batch_defaults(ctx.v.version, g)
        # the DGX Spark and Jetson lines set --max-num-batched-tokens 16384 themselves
        diff = [(n, mine, theirs) for n, mine, theirs in (("--max-num-seqs", lay.seqs, seqs),
                                                            ("--max-num-batched-tokens", lay.batched, batched))
                if mine != theirs and not (n == "--max-num-batched-tokens" and line in ("dgx-spark", "jetson"))]
        if diff:
            restore = {n[2:].replace("-", "_"): theirs for n, _, theirs in diff}
            why = ("more sequences than Mamba cache blocks stop vLLM (vllm#49064, docs/recipes.md#batch-sizes)"
                   if m.hybrid else "nemofleet budgets the batch it plans (docs/recipes.md#batch-sizes)")
            add([n for n, _, _ in diff], " ".join(f"{n} {mine}" for n, mine, _ in diff) + f" added ({src} leaves "
                f"vLLM's default, {' and '.join(str(t) for _, _, t in diff)} on {gpu_table.label(g)} in vLLM "
                f"{ctx.v.version}: vllm/engine/arg_utils.py get_batch_defaults): {why}", restore)
    if line == "generic":
        add(["--chat-template"], f"no --chat-template: {m.repo} runs on the vLLM {ctx.v.version} of {s.vllm_image} as "
            "it ships, with the model's own chat template; no setting restores a recipe that patches vLLM's source "
            "(a model file, the tokenizer, a --chat-template file inside its install: docs/recipes.md#generic): "
            "build an image with the patches and name it in vllm_image", None)
    if g.unified:
        add(["--gpu-memory-utilization"], f"--gpu-memory-utilization {float(ctx.s.gpu_memory_utilization):.2f} on "
            f"{gpu_table.label(g)} of unified memory: the GPU shares the system memory, and "
            f"{mem_model.gib(mem_model.UNIFIED_OS_RESERVE_BYTES)} of it stays for the OS "
            f"(docs/recipes.md#unified-memory); gpu_memory_utilization above {float(ctx.s.gpu_memory_utilization):.2f} "
            "is capped there, below it is taken as given; no setting restores vLLM's default 0.92 here", None)
    return out


def _unverified_arch_warning(lay: _Layout) -> str | None:
    """A GPU planned with flags whose source names another GPU: say that this is unverified, and
    the setting that hands the choice back to vLLM (docs/recipes.md#sm103). Blackwell other than
    sm100 (B300/GB300: sm103) gets the blackwell rows, whose kernels the sources name for sm100 only;
    an sm12x GPU other than the day-one post's two boards (Jetson Thor, cc 11.x; GB10, cc 12.1), such
    as an RTX PRO 6000 (cc 12.0), gets the rows of the post's Jetson line."""
    g, arch = lay.gpus[0], lay.arch.name
    cc = g.cc or ""
    flags = dict(_flags(lay.ctx, lay.arch, lay.tp, lay.seqs, lay.batched))
    if arch == "blackwell" and (cc not in ("", "10.0") or re.search(r"\b(GB|B)300\b", g.name)):
        sm100 = [(n, flags[n]) for n in ("--mamba-ssu-algorithm", "--moe-backend")
                 if flags.get(n) in ("horizontal", "flashinfer_cutlass")]
        if not sm100:
            return None
        where = f"cc {cc}" if cc and cc != "10.0" else "a B300-class GPU, sm103"
        override = ", ".join(f'"{n}": "auto"' for n, _ in sm100)
        return (f"{gpu_table.label(g)} ({where}) is planned as Blackwell with {' '.join(vllm_flags.render(sm100))}, "
                "which the sources nemofleet follows name for sm100 only (docs/recipes.md#sm103): unverified on this "
                f"GPU; vllm_extra_args: {{{override}}} lets vLLM choose the kernels itself")
    if arch == "sm12x" and not (lay.ctx.cc.startswith("11.") or lay.ctx.cc == "12.1"):
        rows = [n for n, _ in _rows(lay.ctx, arch)]
        if not rows:
            return None
        return (f"{gpu_table.label(g)} (cc {lay.ctx.cc or '?'}) is planned with {' '.join(rows)}, which the day-one "
                "post sets on Jetson Thor (cc 11.0) and nemofleet has not seen run on this GPU "
                "(docs/recipes.md#sm103): unverified; recipe_flags: false leaves them to vLLM")
    return None


# ---------------------------------------------------------------------------- plan


def start(gpus: list[Gpu], data, local_meta: dict | None = None, health: dict | None = None):
    """What every plan starts from, a single host's or a serving group member's
    (multinode.make_group_plan): (settings, context, usable GPUs, warnings, the GPUs selected
    before admission, {uuid: sentence} of those GPU health left out). `health`: the host's GPU
    health fact (facts/gpuhealth.py); a GPU that must not serve is left out like a MIG GPU."""
    if not gpus:
        raise PlanError("no NVIDIA GPU is visible on this host")
    s = _parse(data)
    ctx = _context(s, local_meta)
    try:
        usable, warnings = gpu_table.select(gpus, s.gpus)
    except gpu_table.UnsupportedGpu as exc:
        raise PlanError(str(exc)) from None
    selected = usable
    usable, sick = _admit(usable, health, warnings)
    if not catalog.is_commit(ctx.model.revision):
        warnings.insert(0, f"revision {ctx.model.revision!r} of {ctx.model.repo} is not a commit SHA; pin a 40-hex "
                        "commit so re-runs never ask the Hub")
    return s, ctx, usable, warnings, selected, sick


def make_plan(host: str, gpus: list[Gpu], data, *, docker_version: str | None = None,
              cdi_available: bool = False, cgroup_version: int | None = None,
              cgroup_driver: str | None = None, local_meta: dict | None = None,
              health: dict | None = None) -> Plan:
    """Decide what single host `host` serves. `data` is its Settings (host data is parsed). Raises
    PlanError with one sentence on any impossibility. A member of a multi-node serving group is
    planned by multinode.make_group_plan (planning.for_host chooses). `health`: see start()."""
    s, ctx, usable, warnings, selected, sick = start(gpus, data, local_meta, health)
    if s.serving_group:
        raise PlanError(f"serving_group {s.serving_group} is planned over all its members (planning.for_host)")
    layouts = []
    for group in gpu_table.groups(usable):
        try:
            layouts.append(_layout(ctx, group))
        except _NoFit as nofit:
            raise _sick_note(_refusal(ctx, group, nofit, local_meta), sick) from None
        except PlanError as exc:
            raise _sick_note(exc, sick) from None
    if len(layouts) > 1:
        warnings.append("this host mixes GPU models (" + ", ".join(gpu_table.label(lay.gpus[0]) for lay in layouts)
                        + "); each is planned on its own with its own flags")
    warnings += [w for w in (_precision_warning(ctx, lay, local_meta) for lay in layouts) if w]
    warnings += [w for w in (_safe_line_warning(lay) for lay in layouts) if w]
    warnings += [w for w in (_unverified_arch_warning(lay) for lay in layouts) if w]
    identity = _identity(ctx, selected) if sick else None
    plan = finish(host, s, ctx, gpus, _instances(ctx, layouts, identity), [lay.choice for lay in layouts], warnings,
                  {}, docker_version, cdi_available, cgroup_version, cgroup_driver)
    for lay in layouts:
        for d in _departures(lay):
            if d.text not in plan.departures:
                plan.departures.append(d.text)
                plan.departed.append(d)
    return plan


def _admit(usable: list[Gpu], health, warnings: list[str]) -> tuple[list[Gpu], dict]:
    """The GPUs whose health lets them serve (gpuhealth.py), and {uuid: sentence} of those left
    out; the sentences and health warnings join `warnings`. PlanError when none is left."""
    try:
        adm = gpuhealth.admit(usable, health)
    except gpuhealth.HealthError as exc:
        raise PlanError(str(exc)) from None
    warnings += list(adm.left_out.values()) + adm.warnings
    if not adm.admitted:
        raise PlanError("no GPU of this host may serve: " + "; ".join(adm.left_out.values()))
    return adm.admitted, adm.left_out


def _sick_note(exc: PlanError, sick: dict) -> PlanError:
    if not sick:
        return exc
    return PlanError(f"{exc}; GPU(s) left out as unhealthy: {'; '.join(sick.values())}")


def finish(host, s, ctx, gpus, instances, choices, warnings, more_env, docker_version, cdi_available,
           cgroup_version, cgroup_driver) -> Plan:
    method, exec_opts, trap = _gpu_access(s, docker_version, cdi_available, cgroup_version, cgroup_driver)
    warnings += trap
    mounts, downloads = _weights(ctx)
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **more_env}
    if s.hf_endpoint:
        env["HF_ENDPOINT"] = s.hf_endpoint.rstrip("/")
    used = {g.index for i in instances for g in i.gpus}
    return Plan(
        host=host, model=ctx.model, image=settings.rewrite_image(s.vllm_image, s.image_registry_rewrite),
        vllm_version=ctx.v.version, instances=instances, gpu_method=method, mounts=mounts, downloads=downloads,
        env=env, bind_address=s.bind_address, served_name=ctx.model.served_name, warnings=warnings,
        docker_exec_opts=exec_opts, choices=choices,
        excluded_gpus=[g.index for g in gpus if g.index not in used],
    )


def _identity(ctx: _Ctx, selected: list[Gpu]) -> dict | None:
    """{GPU UUIDs: (name, port)} of the plan these GPUs would have if every one were healthy, so
    that leaving a sick GPU out costs exactly the instance on it: the others keep their name,
    port and instance_extra_args (docs/gpu-health.md). None when that plan cannot be made."""
    try:
        full = _instances(ctx, [_layout(ctx, grp) for grp in gpu_table.groups(selected)])
    except (_NoFit, PlanError):
        return None
    return {frozenset(i.gpu_uuids): (i.name, i.host_port) for i in full}


def _slots(s, layouts: list[_Layout], identity: dict | None) -> list[tuple[str, int]]:
    """(name, port) per instance, in layout order: by position (prefix0, port_base, ...), or, with
    an identity, the name and port of the same GPUs in the healthy plan; an instance of a new
    shape gets the first name and port the healthy plan does not use."""
    total = sum(lay.count for lay in layouts)
    if not identity:
        return [(f"{s.instance_prefix}{i}", s.port_base + i) for i in range(total)]
    keys = [frozenset(g.uuid for g in lay.groups[k]) for lay in layouts for k in range(lay.count)]
    used_names, used_ports = {n for n, _ in identity.values()}, {p for _, p in identity.values()}
    names = (n for n in (f"{s.instance_prefix}{i}" for i in range(10**6)) if n not in used_names)
    ports = (p for p in range(s.port_base, 65536) if p not in used_ports)
    out = []
    for key in keys:
        if key in identity:
            out.append(identity[key])
            continue
        port = next(ports, None)
        if port is None:
            raise PlanError(f"port_base {s.port_base} leaves no TCP port for {total} instances")
        out.append((next(names), port))
    return out


def _instances(ctx: _Ctx, layouts: list[_Layout], identity: dict | None = None) -> list[Instance]:
    s = ctx.s
    total = sum(lay.count for lay in layouts)
    if not 1 <= s.port_base <= 65535 - total:
        raise PlanError(f"port_base {s.port_base} is not a usable TCP port for {total} instances")
    slots = _slots(s, layouts, identity)
    names = [n for n, _ in slots]
    per_instance = s.instance_extra_args
    # an instance left out with its sick GPU keeps its extra args for its return
    unknown = sorted(set(per_instance) - set(names) - {n for n, _ in (identity or {}).values()})
    if unknown:
        raise PlanError(f"instance_extra_args names {', '.join(unknown)}, which the plan does not have ({', '.join(names)})")
    out: list[Instance] = []
    for lay in layouts:
        ctx = lay.ctx  # gpu_memory_utilization as planned for these GPUs (_unified_util)
        for k in range(lay.count):
            name, port = slots[len(out)]
            if not _NAME.match(name):
                raise PlanError(f"instance name {name!r} is not a valid container name")
            more = _extra(per_instance[name], f"instance_extra_args.{name}", ctx.v) if name in per_instance else []
            flags = _flags(ctx, lay.arch, lay.tp, lay.seqs, lay.batched, more)
            _validate(ctx, flags)
            mem = _memory(ctx, flags, lay.tp, lay.gpus[0].memory_mib * MIB, lay.seqs, lay.batched)
            if not mem.fits:
                raise PlanError(f"instance_extra_args.{name} makes {name} need {mem.summary()}; "
                                "drop the flag that grows its memory")
            out.append(Instance(
                name=name, gpus=lay.groups[k], host_port=port,
                tp=lay.tp, ep=lay.tp > 1 and ctx.model.moe, args=[ctx.model_path] + vllm_flags.render(flags),
                memory=mem, max_model_len=ctx.mml, max_num_seqs=lay.seqs, arch=lay.arch.name,
                gpu_label=gpu_table.label(lay.gpus[0]),
            ))
    return out


def _weights(ctx: _Ctx) -> tuple[list[Mount], list[dict]]:
    root, m = ctx.s.models_root, ctx.model
    # one host directory per (repo, commit); the container path names the repo only
    mdir = catalog.host_dir_name(m.repo, m.revision)
    mounts = [Mount(f"{root}/{mdir}", ctx.model_path)]
    downloads = [{"repo": m.repo, "revision": m.revision, "dir": f"{root}/{mdir}"}]
    if ctx.spec in ctx.draft_paths:
        d = m.drafts[ctx.spec]
        ddir = catalog.host_dir_name(d.repo, d.revision)
        mounts.append(Mount(f"{root}/{ddir}", f"/models/{catalog.local_dir_name(d.repo)}"))
        downloads.append({"repo": d.repo, "revision": d.revision, "dir": f"{root}/{ddir}"})
    return mounts, downloads


def _gpu_access(s, docker_version, cdi_available, cgroup_version, cgroup_driver):
    """(method, daemon.json exec-opts, warnings): how containers get GPUs, and the remedy for the
    NVML 'Unknown Error' trap (NVIDIA/nvidia-docker#1730)."""
    selection, remedy = s.gpu_selection, s.nvml_remedy
    cdi_ok = cdi_available and versions.parse(docker_version) >= (25, 0)
    if selection == "cdi" and not cdi_ok:
        raise PlanError(
            "gpu_selection cdi needs Docker >= 25 and a CDI spec (nvidia-ctk cdi generate); "
            f"this host has Docker {docker_version or 'none'} and {'a' if cdi_available else 'no'} CDI spec")
    method = "cdi" if selection == "cdi" or (selection == "auto" and remedy == "cdi" and cdi_ok) else "gpus"
    # When systemd manages the container cgroups (Docker's systemd cgroup driver, the default on
    # cgroup v2, possible on v1), devices granted by the legacy hook are dropped at every
    # daemon-reload. Judge by the driver Docker has after this run.
    explicit = s.docker_exec_opts
    at_risk = effective_cgroup_driver(explicit, cgroup_driver, cgroup_version) == "systemd" and method == "gpus"
    trap = (f"cgroup v{cgroup_version or '?'} with Docker's systemd cgroup driver and the legacy --gpus hook "
            "loses GPUs after every systemctl daemon-reload (NVML 'Unknown Error')")
    if not at_risk:
        return method, None, []
    if explicit is not None:
        raise PlanError(f"docker_exec_opts keeps the systemd cgroup driver, but {trap}; "
                        "drop native.cgroupdriver=systemd from docker_exec_opts or use CDI (Docker >= 25)")
    if remedy == "none":
        raise PlanError(f"{trap}; set nvml_remedy to cdi or cgroupfs")
    return method, ["native.cgroupdriver=cgroupfs"], [
        f"NVML 'Unknown Error' trap: {trap}, and CDI is not usable here (Docker {docker_version or '?'}"
        f"{'' if cdi_available else ', no CDI spec'}); nemofleet sets exec-opts native.cgroupdriver=cgroupfs "
        "and restarts Docker"]


def effective_cgroup_driver(exec_opts, current: str | None, cgroup_version: int | None) -> str | None:
    """The cgroup driver Docker runs with once daemon.json holds `exec_opts` (None: nemofleet
    leaves exec-opts alone, so the current driver stays). Without a native.cgroupdriver entry,
    Docker >= 20.10 picks systemd on cgroup v2 and cgroupfs on v1."""
    if exec_opts is None:
        return current
    for opt in exec_opts if isinstance(exec_opts, (list, tuple)) else []:
        key, _, value = str(opt).partition("=")
        if key.strip() == "native.cgroupdriver":
            return value.strip()
    return "systemd" if cgroup_version == 2 else "cgroupfs"


def gpus_from_facts(rows: list[dict]) -> list[Gpu]:
    return [Gpu(**{k: r[k] for k in (f.name for f in dataclasses.fields(Gpu)) if k in r}) for r in rows]
