"""The layout planner: what a host's settings decide (Ctx), the flags and memory of one instance
shape, and the layout of one GPU model (the TP and the number of instances that fit, with why).
plan.py plans a host with it and multinode.py a serving group member; plan_prose.py words its
refusals, warnings and departures.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from . import gpus as gpu_table
from . import memory as mem_model
from . import models as catalog
from . import flagtable, recipes, settings, versions, vllm_flags
from .factmodel import ModelDir
from .memory import Memory
from .plan_types import CONTAINER_PORT, GIB, Gpu, MIB, PlanError, TP_SIZES


# ---------------------------------------------------------------------------- host-wide inputs


@dataclass(frozen=True)
class Ctx:
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
    cc: str = ""  # compute capability of the GPU model being planned (set per GPU model by fit_layout)


class NoFit(Exception):
    def __init__(self, tp: int, mem: Memory, explicit: bool):
        super().__init__(tp)
        self.tp, self.mem, self.explicit = tp, mem, explicit


def context(s: settings.Settings, local_meta: ModelDir | None) -> Ctx:
    try:
        model = s.model.with_local_meta(local_meta)
        v = vllm_flags.get(vllm_flags.version_of_image(s.vllm_image))
    except vllm_flags.UnknownVersion as exc:
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
    return Ctx(s=s, model=model, v=v, mml=mml, spec=spec,
                spec_tokens=s.num_speculative_tokens or model.default_spec_tokens,
                model_path=f"/models/{catalog.local_dir_name(model.repo)}", draft_paths=draft_paths,
                extra=tuple(extra_args(s.vllm_extra_args, "vllm_extra_args", v)))


def extra_args(raw: dict, where: str, v: vllm_flags.VllmVersion | None = None) -> list[tuple[str, object]]:
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


def planned_flags(ctx: Ctx, arch: gpu_table.Arch, tp: int, seqs: int, batched: int, more=()) -> list[tuple[str, object]]:
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
    f += [r for r in recipe_rows(ctx, arch.name) if r[0] not in planned]
    extra = list(ctx.extra) + list(more)
    names = {n for n, _ in extra}
    return flagtable.ordered([(n, val) for n, val in f if n not in names] + extra)


def recipe_rows(ctx: Ctx, arch: str) -> list[tuple[str, object]]:
    """The recipe rows (recipes.py) of this model on this GPU; none with recipe_flags: false."""
    if not ctx.s.recipe_flags:
        return []
    return recipes.flags_for(ctx.model, arch, bool(ctx.spec), lambda n: _supported(ctx.v, n), ctx.cc)


def _supported(v: vllm_flags.VllmVersion, name: str) -> bool:
    flag = v.flags.get(name)
    return flag is not None and not flag.deprecated


def memory_for(ctx: Ctx, flags, tp: int, gpu_bytes: int, seqs: int, batched: int, pp: int = 1) -> Memory:
    """Memory of the flags as planned: dtypes are read from the final flags, so an operator's
    extra --mamba-ssm-cache-dtype or a recipe's --kv-cache-dtype is counted as vLLM will use it."""
    d = dict(flags)
    return mem_model.estimate(
        ctx.model, tp=tp, gpu_bytes=gpu_bytes, util=float(ctx.s.gpu_memory_utilization), max_model_len=ctx.mml,
        max_num_seqs=seqs, max_num_batched_tokens=batched, kv_cache_dtype=d.get("--kv-cache-dtype"),
        mamba_dtype=d.get("--mamba-ssm-cache-dtype"), draft=ctx.spec in ("dflash", "dspark"), pp=pp,
        mamba_align=_mamba_align(ctx, d), spec_tokens=ctx.spec_tokens if ctx.spec else 0)


def _mamba_align(ctx: Ctx, d: dict) -> bool:
    """Whether vLLM keeps two Mamba state blocks per request (--mamba-cache-mode align): set, or
    derived from prefix caching where the pinned vLLM deprecates the flag (0.33)."""
    mode = d.get("--mamba-cache-mode")
    if mode is not None:
        return mode == "align"
    flag = ctx.v.flags.get("--mamba-cache-mode")
    return "--enable-prefix-caching" in d and (flag is None or bool(flag.deprecated))


def validate(ctx: Ctx, flags) -> None:
    # the operator's extras were checked against the real parser's table (extra_args); the plan's own
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
class Layout:
    gpus: list[Gpu]
    arch: gpu_table.Arch
    tp: int
    count: int
    seqs: int
    batched: int
    mem: Memory
    choice: str
    ctx: Ctx  # the host's, with gpu_memory_utilization capped on a unified-memory board
    groups: list[list[Gpu]] = field(default_factory=list)  # the GPUs of each instance
    idle: list[Gpu] = field(default_factory=list)  # GPUs of this model no instance uses


def viable(ctx: Ctx, mem: Memory, tp: int, gpu_bytes: int) -> bool:
    return mem.fits and tp * gpu_bytes >= ctx.model.min_total_bytes


def unified_util(ctx: Ctx, gpu: Gpu) -> Ctx:
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


def fit_layout(ctx: Ctx, group: list[Gpu]) -> Layout:
    """TP and instance count for one GPU model, on ANY list of its GPUs (a host's, those `gpus`
    selects, those left once unhealthy ones are out): every TP of TP_SIZES up to the GPU count
    is computed, and when the count is not a multiple of the chosen TP the largest subset that
    fits is used (gpus.tp_groups) and the idle GPUs are named with the reason. Raises NoFit
    (with figures) or PlanError."""
    try:
        arch = gpu_table.arch_of(group[0])
    except gpu_table.UnsupportedGpu as exc:
        raise PlanError(str(exc)) from None
    cc = group[0].cc or gpu_table.cc_for_name(group[0].name) or ""
    ctx = dataclasses.replace(unified_util(ctx, group[0]), cc=cc)
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
    sizes: list[int] = sorted({t for t in TP_SIZES if (want or 1) * t <= n} | ({tp_req} if tp_req else set()))
    if not sizes:
        raise PlanError(f"{want} instances of 1 GPU(s) do not fit {_gpus_phrase(ctx, group)}")
    mems = {t: memory_for(ctx, planned_flags(ctx, arch, t, seqs, batched), t, gpu_bytes, seqs, batched) for t in sizes}
    fitting = [t for t in sizes if viable(ctx, mems[t], t, gpu_bytes)]
    if tp_req and tp_req not in fitting:
        raise NoFit(tp_req, mems[tp_req], explicit=True)
    if not fitting:
        raise NoFit(sizes[-1], mems[sizes[-1]], explicit=False)
    policy = s.tensor_parallel_policy
    policy = m.tp_policy if policy == "recipe" else policy
    tp: int = tp_req or (fitting[0] if policy == "smallest" else fitting[-1])
    count = want or n // tp
    if count * tp > n:
        raise PlanError(f"{count} instances of {tp} GPU(s) do not fit {_gpus_phrase(ctx, group)}")
    parts, idle = gpu_table.tp_groups(group, tp, count)
    lay = Layout(group, arch, tp, count, seqs, batched, mems[tp], "", ctx, parts, idle)
    lay.choice = _explain(lay, mems, fitting, policy)
    if idle:
        lay.choice += "; " + _idle_reason(lay, fitting, policy)
    validate(ctx, planned_flags(ctx, arch, tp, seqs, batched))
    return lay


def try_fit(ctx: Ctx, group: list[Gpu]) -> Layout | None:
    """fit_layout's layout, or None where these GPUs cannot take the model with these settings."""
    try:
        return fit_layout(ctx, group)
    except (NoFit, PlanError):
        return None


def _idle_reason(lay: Layout, fitting: list[int], policy: str) -> str:
    """'GPU 2 stays idle: ...': why the GPUs no instance uses are left, and what would use them."""
    ctx, tp, n, which = lay.ctx, lay.tp, len(lay.gpus), ", ".join(str(g.index) for g in lay.idle)
    head = f"GPU {which} stay idle" if len(lay.idle) > 1 else f"GPU {which} stays idle"
    if ctx.s.instances:
        return f"{head}: instances is {ctx.s.instances}"
    why = (f"{n} GPUs are not a multiple of TP{tp}, TP takes 1, 2, 4 or 8 GPUs and the instances on one GPU "
           "model share one TP")
    whole = [t for t in fitting if n % t == 0]
    if whole:
        t = whole[-1] if policy == "largest" else whole[0]
        return f"{head}: {why}; tensor_parallel_size: {t} uses every GPU ({n // t} x TP{t})"
    return f"{head}: {why}, and no smaller TP fits" if tp > 1 else f"{head}: {why}"


def _gpus_phrase(ctx: Ctx, group: list[Gpu]) -> str:
    return f"this host's {len(group)} GPUs" if not ctx.s.gpus else f"the {len(group)} GPUs selected by gpus"


def _explain(lay: Layout, mems: dict, fitting: list[int], policy: str) -> str:
    """'8x H100 80 GiB: 8 x TP1 (...): each fits with N GiB headroom ...; TP2 available with ...'."""
    ctx, group, tp, mem = lay.ctx, lay.gpus, lay.tp, mems[lay.tp]
    if ctx.s.tensor_parallel_size:
        why = f"tensor_parallel_size {tp}"
    else:
        source = "the model's recipe" if ctx.s.tensor_parallel_policy == "recipe" else "tensor_parallel_policy"
        why = (f"the smallest TP that fits ({source}: smallest)" if policy == "smallest"
               else f"one instance over the GPUs ({source}: largest)")
    text = (f"{len(group)}x {gpu_table.label(group[0])}: {lay.count} x TP{tp}, {why}; each fits with "
            f"{mem.headroom / GIB:.1f} GiB headroom per GPU ({mem.summary()}) and its KV cache holds "
            f"{mem_model.seqs_phrase(mem.full_context_seqs, ctx.mml)} at once for max_num_seqs {lay.seqs}")
    others = [f"TP{t} with tensor_parallel_size: {t} ({mems[t].headroom / GIB:.1f} GiB headroom)"
              for t in fitting if t != tp]
    small = [f"TP{t} does not fit ({mems[t].summary()}{_seqs_hint(lay, t)})"
             for t in mems if t < tp and t not in fitting]
    return "; ".join([text] + ([f"also possible: {', '.join(others)}"] if others else []) + small)


def _seqs_hint(lay: Layout, tp: int) -> str:
    """', it would with max_num_seqs: N' when fewer sequences (less Mamba state) make `tp` fit."""
    ctx, batched, gpu_bytes = lay.ctx, lay.batched, lay.gpus[0].memory_mib * MIB
    for c in halves(lay.seqs, 1):
        if viable(ctx, memory_for(ctx, planned_flags(ctx, lay.arch, tp, c, batched), tp, gpu_bytes, c, batched), tp, gpu_bytes):
            return f"; it would with max_num_seqs: {c}"
    return ""


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


def halves(start: int, floor: int) -> list[int]:
    out, c = [], start // 2
    while c >= floor:
        out.append(c)
        c //= 2
    return out
