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

from . import gpuhealth
from . import gpus as gpu_table
from . import models as catalog
from . import settings, vllm_flags
from .factmodel import Health, ModelDir
from .memory import Memory
from .gpuaccess import gpu_access
from .layout import (Ctx, Layout, NoFit, context, extra_args, fit_layout, memory_for,
                     planned_flags, validate)
from .plan_types import Gpu, Instance, INSTANCE_NAME, MIB, Mount, Plan, PlanError
from .plan_prose import departures, precision_warning, refusal, safe_line_warning, unverified_arch_warning

# the plan's public API: make_plan and what it returns (its data model is plan_types.py's; the
# GPU access policy gpuaccess.py's; vLLM's batch defaults the layout planner's), re-exported here
from .gpuaccess import effective_cgroup_driver  # noqa: E402,F401
from .layout import vllm_batch_defaults  # noqa: E402,F401
from .plan_types import CONTAINER_PORT, GIB, Departure, GroupRole, gpus_from_facts  # noqa: E402,F401

__all__ = ["CONTAINER_PORT", "GIB", "Departure", "Gpu", "GroupRole", "Instance", "Memory", "Mount", "Plan", "PlanError",
           "make_plan", "effective_cgroup_driver", "gpus_from_facts", "vllm_batch_defaults"]


# ---------------------------------------------------------------------------- plan


def start(gpus: list[Gpu], s: settings.Settings, local_meta: ModelDir | None = None, health: Health | None = None):
    """What every plan starts from, a single host's or a serving group member's
    (multinode.make_group_plan): (settings, context, usable GPUs, warnings, the GPUs selected
    before admission, {uuid: sentence} of those GPU health left out). `health`: the host's GPU
    health fact (facts/gpuhealth.py); a GPU that must not serve is left out like a MIG GPU, its
    sentence and the health warnings join the warnings, and none left is a PlanError."""
    if not gpus:
        raise PlanError("no NVIDIA GPU is visible on this host")
    ctx = context(s, local_meta)
    try:
        selected, warnings = gpu_table.select(gpus, s.gpus)
        adm = gpuhealth.admit(selected, health)
    except (gpu_table.UnsupportedGpu, gpuhealth.HealthError) as exc:
        raise PlanError(str(exc)) from None
    warnings += list(adm.left_out.values()) + adm.warnings
    if not adm.admitted:
        raise PlanError("no GPU of this host may serve: " + "; ".join(adm.left_out.values()))
    if not catalog.is_commit(ctx.model.revision):
        warnings.insert(0, f"revision {ctx.model.revision!r} of {ctx.model.repo} is not a commit SHA; pin a 40-hex "
                        "commit so re-runs never ask the Hub")
    return s, ctx, adm.admitted, warnings, selected, adm.left_out


def make_plan(host: str, gpus: list[Gpu], data, *, docker_version: str | None = None,
              cdi_available: bool = False, cgroup_version: int | None = None,
              cgroup_driver: str | None = None, local_meta: ModelDir | None = None,
              health: Health | None = None) -> Plan:
    """Decide what single host `host` serves. `data`: its Settings (the host spec's). Raises
    PlanError with one sentence on any impossibility. A member of a multi-node serving group is
    planned by multinode.make_group_plan (desired.for_host chooses). `health`: see start()."""
    s, ctx, usable, warnings, selected, sick = start(gpus, data, local_meta, health)
    if s.serving_group:
        raise PlanError(f"serving_group {s.serving_group} is planned over all its members (desired.for_host)")
    layouts = []
    for group in gpu_table.groups(usable):
        try:
            layouts.append(fit_layout(ctx, group))
        except (NoFit, PlanError) as exc:
            why = refusal(ctx, group, exc, local_meta) if isinstance(exc, NoFit) else exc
            raise (PlanError(f"{why}; GPU(s) left out as unhealthy: {'; '.join(sick.values())}") if sick else why) from None
    if len(layouts) > 1:
        warnings.append("this host mixes GPU models (" + ", ".join(gpu_table.label(lay.gpus[0]) for lay in layouts)
                        + "); each is planned on its own with its own flags")
    for warn in (precision_warning, safe_line_warning, unverified_arch_warning):
        warnings += [w for w in map(warn, layouts) if w]
    identity = _identity(ctx, selected) if sick else None
    plan = finish(host, s, ctx, gpus, _instances(ctx, layouts, identity), [lay.choice for lay in layouts], warnings,
                  {}, docker_version, cdi_available, cgroup_version, cgroup_driver)
    for lay in layouts:
        for d in departures(lay):
            if d.text not in plan.departures:
                plan.departures.append(d.text)
                plan.departed.append(d)
    return plan


def finish(host, s, ctx, gpus, instances, choices, warnings, more_env, docker_version, cdi_available,
           cgroup_version, cgroup_driver) -> Plan:
    method, exec_opts, trap = gpu_access(s, docker_version, cdi_available, cgroup_version, cgroup_driver)
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


def _identity(ctx: Ctx, selected: list[Gpu]) -> dict | None:
    """{GPU UUIDs: (name, port)} of the plan these GPUs would have if every one were healthy, so
    that leaving a sick GPU out costs exactly the instance on it: the others keep their name,
    port and instance_extra_args (docs/gpu-health.md). None when that plan cannot be made."""
    try:
        full = _instances(ctx, [fit_layout(ctx, grp) for grp in gpu_table.groups(selected)])
    except (NoFit, PlanError):
        return None
    return {frozenset(i.gpu_uuids): (i.name, i.host_port) for i in full}


def _slots(s, layouts: list[Layout], identity: dict | None) -> list[tuple[str, int]]:
    """(name, port) per instance, in layout order: by position (prefix0, port_base, ...), or, with
    an identity, the name and port of the same GPUs in the healthy plan; an instance of a new
    shape gets the first name and port the healthy plan does not use."""
    total, identity = sum(lay.count for lay in layouts), identity or {}
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


def _instances(ctx: Ctx, layouts: list[Layout], identity: dict | None = None) -> list[Instance]:
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
        ctx = lay.ctx  # gpu_memory_utilization as planned for these GPUs (unified_util)
        for k in range(lay.count):
            name, port = slots[len(out)]
            if not INSTANCE_NAME.match(name):
                raise PlanError(f"instance name {name!r} is not a valid container name")
            more = extra_args(per_instance[name], f"instance_extra_args.{name}", ctx.v) if name in per_instance else []
            out.append(instance(ctx, name, lay.groups[k], port, lay.arch, lay.tp, lay.seqs, lay.batched, more))
    return out


def instance(ctx: Ctx, name: str, gpus: list[Gpu], port: int, arch, tp: int, seqs: int, batched: int, more,
             mem: Memory | None = None, group: GroupRole | None = None) -> Instance:
    """One instance on `gpus`: the planned flags and `more`, validated. `mem`: its memory as planned (a
    serving group's), else that of these flags, refused when they make it need more than it has."""
    flags = planned_flags(ctx, arch, tp, seqs, batched, more)
    validate(ctx, flags)
    if mem is None:
        mem = memory_for(ctx, flags, tp, gpus[0].memory_mib * MIB, seqs, batched)
        if not mem.fits:
            raise PlanError(f"instance_extra_args.{name} makes {name} need {mem.summary()}; "
                            "drop the flag that grows its memory")
    return Instance(name=name, gpus=gpus, host_port=port, tp=tp, ep=tp > 1 and ctx.model.moe,
                    args=[ctx.model_path] + vllm_flags.render(flags), memory=mem, max_model_len=ctx.mml,
                    max_num_seqs=seqs, arch=arch.name, gpu_label=gpu_table.label(gpus[0]), group=group)


def _weights(ctx: Ctx) -> tuple[list[Mount], list[dict]]:
    root, m = ctx.s.models_root, ctx.model
    # one host directory per (repo, commit); the container path names the repo only
    mdir = catalog.host_dir_name(m.repo, m.revision)
    mounts = [Mount(f"{root}/{mdir}", ctx.model_path)]
    downloads = [{"repo": m.repo, "revision": m.revision, "dir": f"{root}/{mdir}"}]
    if ctx.spec and ctx.spec in ctx.draft_paths:
        d = m.drafts[ctx.spec]
        ddir = catalog.host_dir_name(d.repo, d.revision)
        mounts.append(Mount(f"{root}/{ddir}", f"/models/{catalog.local_dir_name(d.repo)}"))
        downloads.append({"repo": d.repo, "revision": d.revision, "dir": f"{root}/{ddir}"})
    return mounts, downloads
