"""What a plan says in words: a refusal with the need, what is available, the shapes that would
fit and the settings that make this host fit; warnings about precision and unverified hardware;
the departures from the published command the plan follows, each with what restores it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
import re

from . import gpu_classes
from . import models as catalog
from . import gpus as gpu_table
from . import memory as mem_model
from . import recipes, vllm_flags
from .layout import (Ctx, Layout, NoFit, context, fit_layout, halves, planned_flags, recipe_rows, try_fit,
                     unified_util, vllm_batch_defaults)
from .plan_types import Departure, GIB, Gpu, MIB, PlanError, TP_SIZES


# ---------------------------------------------------------------------------- refusals


def refusal(ctx: Ctx, group: list[Gpu], nofit: NoFit, local_meta) -> PlanError:
    m, mem = ctx.model, nofit.mem
    where = f"{len(group)}x {gpu_table.label(group[0])}"
    if mem.need <= mem.available and mem.blocks_short:  # vLLM's second startup check (memory.py)
        why = f"{m.key} on {where} at TP{nofit.tp}: {mem.blocks_problem()}"
    else:
        util = float(unified_util(ctx, group[0]).s.gpu_memory_utilization)  # as planned: capped on unified memory
        floor = (f" and {m.min_total_bytes / GIB:.0f} GiB in all" if m.min_total_bytes else "")
        if nofit.explicit:
            head = f"{m.key} with tensor_parallel_size {nofit.tp} needs {mem_model.gib(mem.need)} per GPU"
        else:
            head = f"{m.key} needs {mem_model.gib(mem.need)} per GPU even at TP{nofit.tp}"
        why = (f"{head}{floor} ({mem.terms()}) but {where} has {mem_model.gib(mem.available)} per GPU at "
               f"gpu_memory_utilization {util:.2f}")
    shapes = _shapes(ctx, group)
    fixes = _fixes(ctx, group, local_meta)
    return PlanError(
        f"{why}; with these settings nemofleet would plan it on "
        f"{' or '.join(shapes) if shapes else 'no catalog GPU class of up to 8 GPUs'}; "
        + (f"on this host it fits with {' or '.join(fixes)}" if fixes else "no single setting change makes it fit this host"))


def _shapes(ctx: Ctx, host_group: list[Gpu] | None = None) -> list[str]:
    """The smallest GPU count of each catalog class on which this planner plans the model with
    these settings (host-specific ones dropped; the same memory model, card reserve included),
    smallest total memory first: at most four, plus the host's own GPU class at a larger count
    where one fits."""
    free = ctx.s.replace(tensor_parallel_size=None, instances=None, gpus=None)
    shape_ctx = dataclasses.replace(ctx, s=free)

    def smallest(name, mib, cc, unified, label, above=0):
        for count in (c for c in TP_SIZES if c > above):
            group = [Gpu(i, f"GPU-shape-{i}", name, mib, cc, unified=unified) for i in range(count)]
            lay = try_fit(shape_ctx, group)
            if lay:
                return count * mib, f"{count}x {label} (TP{lay.tp}, max_num_seqs {lay.seqs})"
        return None

    found = [f for f in (smallest(z.name, z.memory_mib, c.cc, False, z.label) for c in gpu_classes.CLASSES
                         for z in c.sizes) if f]
    shown = sorted(found)[:4]
    if host_group and not host_group[0].unified:  # a unified-memory board has one GPU: no larger count
        g = host_group[0]
        own = smallest(g.name, g.memory_mib, g.cc, g.unified, gpu_table.label(g), above=len(host_group))
        if own and own[1] not in {text for _, text in shown}:
            shown = sorted(shown + [own])
    return [text for _, text in shown]


def _fixes(ctx: Ctx, group: list[Gpu], local_meta) -> list[str]:
    """Single setting changes with which this host's GPUs would take the model."""
    s, m = ctx.s, ctx.model
    # a refusal follows fit_layout's NoFit on these GPUs, so their architecture is known
    seqs = s.max_num_seqs or gpu_table.arch_of(group[0]).default_max_num_seqs
    tries: list[tuple[dict, str]] = []
    tries += [({"max_num_seqs": c}, f"max_num_seqs: {c}") for c in halves(seqs, 1)]
    tries += [({"max_model_len": c}, f"max_model_len: {c}") for c in halves(ctx.mml, 4096)]
    # on unified memory the most vLLM may take is the cap that leaves the OS its reserve
    top = float(unified_util(dataclasses.replace(ctx, s=s.replace(gpu_memory_utilization=0.95)),
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
        tries.append(({"model": catalog.resolve(m.variant)}, f"model: {m.variant}"))
    out, done = [], set()
    for change, text in tries:
        key = next(iter(change))
        if key in done:
            continue  # the first (largest) value of a key that fits is the one to show
        try:
            alt = context(s.replace(**change), None if key == "model" else local_meta)
            lay = fit_layout(alt, group)
        except (NoFit, PlanError):
            continue
        done.add(key)
        out.append(f"{text} (TP{lay.tp}, {lay.mem.summary()})")
    return out


# ---------------------------------------------------------------------------- warnings


def precision_warning(lay: Layout) -> str | None:
    """NVFP4 below sm100 runs weight-only (docs/recipes.md#nvfp4-below-blackwell): say so, and
    whether the BF16 variant, which computes the same way, fits these GPUs."""
    ctx, m = lay.ctx, lay.ctx.model
    if m.precision != "nvfp4" or lay.arch.native_fp4:
        return None
    text = (f"{m.key} on {lay.arch.name} (sm{lay.arch.sm}) runs NVFP4 weight-only: FP4 weights are dequantised "
            "by the Marlin/Humming kernels and computed in BF16 (native FP4 needs sm100, Blackwell), so it saves "
            "memory, not compute")
    if not m.variant:
        return text
    try:
        alt = fit_layout(context(ctx.s.replace(model=catalog.resolve(m.variant)), None), lay.gpus)
    except (NoFit, PlanError):
        return f"{text}; {m.variant} does not fit here with these settings"
    return (f"{text}; {m.variant} also fits here ({alt.count} x TP{alt.tp}, {alt.mem.summary()}, "
            f"{alt.mem.full_context_seqs} full-context sequence{'' if alt.mem.full_context_seqs == 1 else 's'}) "
            f"with BF16 weights: set model: {m.variant}")


def safe_line_warning(lay: Layout) -> str | None:
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


def _safe_shape(lay: Layout) -> str:
    """'; 8x A100 80 GiB holds the safe line': the smallest TP size of this GPU class at or above it."""
    g = lay.gpus[0]
    count = next((c for c in TP_SIZES if c * g.memory_mib * MIB >= lay.ctx.model.safe_line_bytes), None)
    return f"; {count}x {gpu_table.label(g)} holds the safe line" if count else ""


# The published commands a plan follows (docs/recipes.md): Lightning's by GPU, the others by model.
_LINES = {"a100": "the A100 README", "h100": "the day-one post's H100 line",
          "dgx-spark": "the day-one post's DGX Spark line", "jetson": "the day-one post's Jetson line",
          "super-vl": "the article", "generic": "a command without them"}


def _class(lay: Layout) -> gpu_classes.GpuClass:
    """The GPU class of the layout's GPUs (gpu_classes); an sm12x GPU no row names follows the DGX
    Spark line, unverified."""
    return gpu_classes.of(lay.gpus[0].name) or gpu_classes.GpuClass("?", "", lay.ctx.cc, line="dgx-spark",
                                                                   verified=False)


def _line(lay: Layout) -> str | None:
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
        return _class(lay).line or "dgx-spark"
    return {"super-vl": "super-vl", "generic": "generic"}.get(fam)


def _model_restore(s, **fields) -> dict:
    """The `model:` setting with these fields changed (a catalog key becomes {catalog: key, ...})."""
    given = s.model.given
    base = dict(given) if isinstance(given, Mapping) else {"catalog": given}
    return {"model": {**base, **fields}}


def _shown(restore: dict) -> str:
    """Settings as an operator writes them in host data: 'max_num_seqs: 1024, model: {...}'."""
    def one(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        return "null" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return ", ".join(f"{k}: {one(v)}" for k, v in restore.items())


def departures(lay: Layout) -> list[Departure]:
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
        parsers: list[tuple[str, str | None]] = ([] if line != "dgx-spark" or not m.reasoning_parser else
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
        rows = [n for n, _ in recipe_rows(ctx, lay.arch.name)]
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


def unverified_arch_warning(lay: Layout) -> str | None:
    """A GPU planned with flags whose source names another GPU: say that this is unverified, and
    the setting that hands the choice back to vLLM (docs/recipes.md#sm103). Blackwell other than
    sm100 (B300/GB300: sm103) gets the blackwell rows, whose kernels the sources name for sm100 only;
    an sm12x GPU other than the day-one post's two boards (Jetson Thor, cc 11.x; GB10, cc 12.1), such
    as an RTX PRO 6000 (cc 12.0), gets the rows of the post's Jetson line."""
    g, arch = lay.gpus[0], lay.arch.name
    cc = g.cc or ""
    flags = dict(planned_flags(lay.ctx, lay.arch, lay.tp, lay.seqs, lay.batched))
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
    if arch == "sm12x" and not _class(lay).verified:
        rows = [n for n, _ in recipe_rows(lay.ctx, arch)]
        if not rows:
            return None
        return (f"{gpu_table.label(g)} (cc {lay.ctx.cc or '?'}) is planned with {' '.join(rows)}, which the day-one "
                "post sets on Jetson Thor (cc 11.0) and nemofleet has not seen run on this GPU "
                "(docs/recipes.md#sm103): unverified; recipe_flags: false leaves them to vLLM")
    return None
