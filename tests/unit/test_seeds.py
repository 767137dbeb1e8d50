"""The seeds' published commands as tests (issue 37 point 6 and "done when", issue 40 point 7).

Each published `vllm serve` command (copied exactly into seed_commands.txt, with its seed file and
lines) is compared flag by flag, by vLLM's own parser table of the pinned version, with the plan
nemofleet makes on the same hardware:

1. the plan equals the seed once nemofleet's unit mechanics (recipes.MECHANICS) and the flags its
   departure lines name are taken out of both;
2. applying every departure's restoring setting gives the seed's command exactly (again less the
   mechanics), leaving only the departures that say no setting restores them;
3. each restoring setting alone gives back the flags of its departure, and that departure goes.

Where the seed leaves a flag out and the plan writes out the value vLLM takes without it, the two
are equal (recipes.VLLM_DEFAULTS, read from the pinned versions' source).
"""
import json
import re
import shlex
from pathlib import Path

import pytest

from nemofleet import models, recipes, vllm_flags
from nemofleet import factmodel  # noqa: E402
from nemofleet.plan import Gpu, PlanError, gpus_from_facts, vllm_batch_defaults
from opharness import make_plan  # noqa: E402

HERE = Path(__file__).parent
SEEDS_DIR = HERE.parents[2] / "shared" / "seeds"  # the source documents, beside the repository
FIXTURES = HERE.parent / "fixtures" / "gpu"
VERSION = "0.27.1"  # every seed that names a vLLM ran v0.27.1 (seed 002's patched 0.6.3 is no image)


def _blocks() -> dict[str, dict]:
    out, cur = {}, None
    for line in (HERE / "seed_commands.txt").read_text().splitlines():
        if line.startswith("#") and cur is None:
            continue
        m = re.match(r"^== (\S+) (\S+?):(\d+)(?:-(\d+))?(?:: (.*))?$", line)
        if m:
            name, file, a, b, note = m.groups()
            cur = out[name] = {"file": file, "lines": (int(a), int(b or a)), "note": note or "", "text": []}
            continue
        if cur is not None and line.strip():
            cur["text"].append(line)
    for b in out.values():
        b["text"] = "\n".join(b["text"])
    return out


BLOCKS = _blocks()


def seed_words(name: str) -> list[str]:
    """The seed's command as argv words after `vllm serve`, with its ellipsis resolved."""
    b = BLOCKS[name]
    text = re.sub(r"\\\n|\\ ", " ", b["text"])
    words = shlex.split(text)
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    elif words[:2] == ["vllm", "serve..."]:
        words = words[2:]
        base = re.match(r"extends ([\w-]+)", b["note"])
        model = re.match(r"model (\S+)", b["note"])
        assert base or model, f"{name}: `vllm serve...` needs `extends NAME` or `model REPO` in its note"
        words = seed_words(base.group(1)) + words if base else [model.group(1)] + words
    return words


# ---------------------------------------------------------------------------- flag by flag

def parse(words: list[str]) -> dict[str, object]:
    """{flag: typed value} as the pinned vLLM's parser reads `words` (its generated table): the
    model (positional or --model) as "model", switches as True, dotted config keys folded, and a
    JSON config flag's keys one entry each ("--speculative-config.method")."""
    table = vllm_flags.accepted(VERSION)["flags"]
    words = vllm_flags.fold_dotted(words)
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            assert "model" not in out, f"two models in {words}"
            out["model"], i = word, i + 1
            continue
        name, eq, inline = word.partition("=")
        name = vllm_flags.normalise(name)
        assert name in table, f"vLLM {VERSION} has no flag {name}"
        row = table[name]
        if row["kind"] == "switch":
            out[name], i = True, i + 1
            continue
        raw, i = (inline, i + 1) if eq else (words[i + 1], i + 2)
        kind = row["type"]
        value = (int(raw) if kind in ("int", "int_hr") else float(raw) if kind == "float"
                 else json.loads(raw) if kind == "json" else raw)
        if name == "--model":
            name = "model"
        if kind == "json" and isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def _default(what, model: models.Model, gpu: Gpu, flags: dict):
    if what == "max_context":
        return model.max_context
    if what == "draft_name":
        draft = str(flags.get("--speculative-config.model", "")).lower()
        return next((m for m in ("dflash", "dspark") if m in draft), None)
    if what in ("batch_seqs", "batch_tokens"):
        return vllm_batch_defaults(VERSION, gpu)[what == "batch_tokens"]
    return what


def differences(plan, seed: list[str], drop=()) -> dict[str, tuple]:
    """{flag: (planned, seed's)} for every flag where the plan's first instance and the seed
    differ, less the mechanics and the flags (or config keys) in `drop`."""
    inst = plan.instances[0]
    mine, theirs = parse(inst.args), parse(seed)
    for side, other in ((mine, theirs), (theirs, mine)):
        for flag, what in recipes.VLLM_DEFAULTS.items():
            if flag in other and flag not in side:
                side[flag] = _default(what, plan.model, inst.gpus[0], side)
    gone = set(recipes.MECHANICS) | set(drop)
    keys = [k for k in {**mine, **theirs} if not any(k == g or k.startswith(g + ".") for g in gone)]
    missing = "(not given)"
    return {k: (mine.get(k, missing), theirs.get(k, missing)) for k in keys
            if mine.get(k, missing) != theirs.get(k, missing)}


def merged(data: dict, *changes: dict) -> dict:
    out = dict(data)
    for change in changes:
        for k, v in change.items():
            if k in ("model", "vllm_extra_args") and isinstance(out.get(k), dict) and isinstance(v, dict):
                v = {**out[k], **v}
            elif k == "model" and isinstance(out.get(k), str) and isinstance(v, dict):
                v = {"catalog": out[k], **v} if "catalog" not in v and "repo" not in v else v
            out[k] = v
    return out


# ---------------------------------------------------------------------------- the seeds' hardware

def _gpus(name, mib, cc, n=1, unified=False):
    return [Gpu(i, f"GPU-{abs(hash(name)) % 10**8:08d}-0000-4000-8000-{i:012d}", name, mib, cc, unified=unified)
            for i in range(n)]


GB10 = gpus_from_facts([factmodel.Gpu.model_validate(r) for r in
                        json.loads((FIXTURES / "gb10" / "hostfacts.json").read_text())["gpus"]["gpus"]])
A100_80 = _gpus("NVIDIA A100-SXM4-80GB", 81920, "8.0")
A100_40 = _gpus("NVIDIA A100-SXM4-40GB", 40960, "8.0")  # seed 002: "GPU Name: A100-SXM4-40GB"
H100 = _gpus("NVIDIA H100 80GB HBM3", 81559, "9.0")
H200x8 = _gpus("NVIDIA H200", 143771, "9.0", 8)  # seed 004: "8 卡单机（H200/B200）"
# Jetson AGX Thor: cc 11.0 under CUDA 13, 128 GB shared with the system (docs/recipes.md#sm12x,
# #unified-memory); MemTotal taken as the GB10 fixture's, the same 128 GB class of board
THOR = [Gpu(0, "GPU-thor-0", "NVIDIA Thor", GB10[0].memory_mib, "11.0", unified=True)]
LIGHTNING_BF16 = {"model": "nemotron-3.5-lightning-bf16"}
# seed 002 as a generic model: its repo, ~5.2 GB of safetensors and 4096 tokens of context (the
# article's figures), and what its command sets that settings express
SEED_002 = {"model": {"repo": "nvidia/nemotron-3-8b-instruct", "weight_bytes": 5_200_000_000, "max_context": 4096},
            "gpu_memory_utilization": 0.9, "vllm_extra_args": {"--dtype": "bfloat16", "--enforce-eager": True}}

# name: (GPUs, host data, the departures' flags the plan names, those no setting restores)
CASES = {
    "000": (A100_80, {}, set(), set()),
    "002": (A100_40, SEED_002, {"--max-num-seqs", "--max-num-batched-tokens", "--chat-template"}, {"--chat-template"}),
    "003-h100": (H100, LIGHTNING_BF16, {"--max-model-len", "--gpu-memory-utilization", "--trust-remote-code"}, set()),
    "003-h100-single-user": (H100, LIGHTNING_BF16, {"--max-model-len", "--gpu-memory-utilization",
                                                    "--trust-remote-code"}, set()),
    "003-mtp": (H100, {**LIGHTNING_BF16, "speculative": "mtp"},
                {"--max-model-len", "--gpu-memory-utilization", "--trust-remote-code", "--mamba-ssu-algorithm"},
                {"--mamba-ssu-algorithm"}),
    "003-dflash": (H100, {**LIGHTNING_BF16, "speculative": "dflash"},
                   {"--max-model-len", "--gpu-memory-utilization", "--trust-remote-code", "--mamba-ssu-algorithm"},
                   {"--mamba-ssu-algorithm"}),
    "003-dspark": (H100, {**LIGHTNING_BF16, "speculative": "dspark"},
                   {"--max-model-len", "--gpu-memory-utilization", "--trust-remote-code", "--mamba-ssu-algorithm"},
                   {"--mamba-ssu-algorithm"}),
    "003-dgx-spark": (GB10, {"model": "nemotron-3.5-lightning-nvfp4", "speculative": "dspark"},
                      {"--max-model-len", "--gpu-memory-utilization", "--trust-remote-code", "--reasoning-parser",
                       "--tool-call-parser", "--enable-auto-tool-choice", "--speculative-config.num_speculative_tokens",
                       "--compilation-config.cudagraph_capture_sizes", "--max-num-seqs", "--enable-prefix-caching",
                       "--mamba-backend", "--mamba-cache-mode", "--mamba-ssm-cache-dtype",
                       "--enable-mamba-cache-stochastic-rounding", "--mamba-cache-philox-rounds"},
                      {"--gpu-memory-utilization", "--speculative-config.num_speculative_tokens"}),
    "003-jetson": (THOR, {"model": "nemotron-3.5-lightning-nvfp4"},
                   {"--max-model-len", "--gpu-memory-utilization", "--tool-call-parser", "--enable-auto-tool-choice",
                    "--max-num-seqs"}, {"--gpu-memory-utilization"}),
    "004": (H200x8, {"model": "nemotron-3.5-super-vl-base-bf16"},
            {"--reasoning-parser-plugin", "--max-num-seqs", "--max-num-batched-tokens"}, {"--reasoning-parser-plugin"}),
}


def test_every_seed_command_is_a_case():
    assert set(CASES) == set(BLOCKS)


@pytest.mark.skipif(not SEEDS_DIR.is_dir(), reason="the seed documents are not beside this checkout")
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_the_copied_commands_are_the_seeds_text(name):
    b = BLOCKS[name]
    a, z = b["lines"]
    text = "\n".join((SEEDS_DIR / b["file"]).read_text().split("\n")[a - 1:z])
    assert b["text"] in text, f"seed_commands.txt's {name} is not {b['file']}:{a}-{z}"


def _plan(name, *changes):
    gpus, data, _, _ = CASES[name]
    return make_plan("seed", gpus, merged(data, *changes))


def _named(plan) -> set[str]:
    return {f for d in plan.departed for f in d.flags}


def _unrestorable(plan) -> set[str]:
    return {f for d in plan.departed if d.restore is None for f in d.flags}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_is_the_seed_less_mechanics_and_named_departures(name):
    _, _, named, unrestorable = CASES[name]
    p = _plan(name)
    assert _named(p) == named, p.departures
    assert _unrestorable(p) == unrestorable, p.departures
    assert differences(p, seed_words(name), _named(p)) == {}
    # what the departures name really differs: a departure line never hides an equal flag
    shown = differences(p, seed_words(name))
    for d in p.departed:
        assert any(k == f or k.startswith(f + ".") for f in d.flags for k in shown), d.text
    # the mechanics: the same weights where the seed names them by repo, the draft's included
    seed = parse(seed_words(name))
    if re.fullmatch(r"[\w.-]+/[\w.-]+", str(seed["model"])):
        assert p.model.repo == seed["model"]
    if "--speculative-config.model" in seed:
        planned = parse(p.instances[0].args)["--speculative-config.model"]
        assert planned == f"/models/{models.local_dir_name(seed['--speculative-config.model'])}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_departure_says_what_restores_it_or_that_nothing_does(name):
    p = _plan(name)
    for d in p.departed:
        assert "\n" not in d.text and "seed 00" not in d.text
        if d.restore is None:
            assert "no setting" in d.text, d.text
        else:
            assert "restore" in d.text and all(k in d.text for k in d.restore), d.text
    assert p.departures == [d.text for d in p.departed] == p.to_dict()["departures"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_restoring_settings_give_the_seeds_command(name):
    p = _plan(name)
    restored = _plan(name, *[d.restore for d in p.departed if d.restore is not None])
    assert all(d.restore is None for d in restored.departed), restored.departures
    assert differences(restored, seed_words(name), _unrestorable(restored)) == {}
    assert _unrestorable(restored) == _unrestorable(p)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_restoring_setting_alone_gives_back_its_flags(name):
    p = _plan(name)
    for d in p.departed:
        if d.restore is None:
            continue
        alone = _plan(name, d.restore)
        assert d.text not in alone.departures
        left = differences(alone, seed_words(name), _named(alone))
        assert not [k for k in left if any(k == f or k.startswith(f + ".") for f in d.flags)], (d.text, left)


def test_the_plans_parse_with_the_pinned_parsers_table():
    for name in CASES:
        for p in (_plan(name), _plan(name, *[d.restore for d in _plan(name).departed if d.restore])):
            vllm_flags.build_argparser(VERSION).parse_args(
                [w for w in p.instances[0].args if w not in ("--dtype", "bfloat16", "--enforce-eager")])


def test_a_seed_flag_the_pinned_parser_lacks_fails_by_name():
    with pytest.raises(AssertionError, match="no flag --made-up"):
        parse(["m", "--made-up", "1"])
    with pytest.raises(PlanError):
        make_plan("seed", A100_80, {"vllm_extra_args": {"--made-up": 1}})


# ---------------------------------------------------------------------------- issue 37 point 9: unverified hardware facts

# B300/GB300 are sm103 (cc 10.3); older drivers report no compute_cap, and the name then decides.
# Memory is illustrative (288 GB of HBM3e): the warning does not depend on it.
B300 = _gpus("NVIDIA B300 SXM6 AC", 275040, "10.3")


@pytest.mark.parametrize("gpus", [B300, _gpus("NVIDIA B300 SXM6 AC", 275040, ""),
                                  _gpus("NVIDIA GB300", 284208, "10.3")])
def test_sm103_gets_sm100_kernels_with_a_warning_that_says_unverified_and_how_to_override(gpus):
    p = make_plan("b300", gpus, {"model": "nemotron-3.5-lightning-nvfp4"})
    args = " ".join(p.instances[0].args)
    assert "--mamba-ssu-algorithm horizontal" in args and "--moe-backend flashinfer_cutlass" in args  # planned, not refused
    (w,) = [w for w in p.warnings if "unverified" in w]
    assert "--mamba-ssu-algorithm horizontal --moe-backend flashinfer_cutlass" in w and "sm100 only" in w
    assert 'vllm_extra_args: {"--mamba-ssu-algorithm": "auto", "--moe-backend": "auto"}' in w
    over = make_plan("b300", gpus, {"model": "nemotron-3.5-lightning-nvfp4", "vllm_extra_args": {
        "--mamba-ssu-algorithm": "auto", "--moe-backend": "auto"}})
    assert not [w for w in over.warnings if "unverified" in w]
    assert "--mamba-ssu-algorithm auto" in " ".join(over.instances[0].args)


def test_sm100_gets_no_unverified_warning():
    for gpus in (_gpus("NVIDIA B200", 183359, "10.0", 8), _gpus("NVIDIA GB200", 189471, "10.0")):
        p = make_plan("b", gpus, {"model": "nemotron-3.5-lightning-nvfp4"})
        assert not [w for w in p.warnings if "unverified" in w]


def test_sm120_gets_the_jetson_rows_with_a_warning_that_says_unverified():
    rtx = _gpus("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "12.0")
    p = make_plan("rtx", rtx, {"model": "nemotron-3.5-lightning-nvfp4"})
    (w,) = [w for w in p.warnings if "unverified" in w]
    assert "--enable-mamba-cache-stochastic-rounding" in w and "recipe_flags: false leaves them to vLLM" in w
    over = make_plan("rtx", rtx, {"model": "nemotron-3.5-lightning-nvfp4", "recipe_flags": False})
    assert not [w for w in over.warnings if "unverified" in w]
    assert "--enable-prefix-caching" not in over.instances[0].args
    for board in (GB10, THOR):  # the post's own boards: no warning
        assert not [w for w in make_plan("b", board, {}).warnings if "unverified" in w]


def test_nemofleet_plan_with_the_seeds_facts_shows_each_departure_line(tmp_path, monkeypatch):
    """The operator's view: `nemofleet plan --facts` on the H100 host of seed 003 and the GB10 of its
    DGX Spark line prints one `departure:` line per Departure, and the flags line the tests compare."""
    from test_plan import _facts_with, _plan_facts

    gb10 = json.loads((FIXTURES / "gb10" / "hostfacts.json").read_text())
    rc, out = _plan_facts(tmp_path, monkeypatch, {"h100-1": (_facts_with(H100), CASES["003-h100"][1]),
                                                  "spark-1": (gb10, CASES["003-dgx-spark"][1])})
    assert rc == 0 and "REFUSED" not in out and "Traceback" not in out, out
    for name, host in (("003-h100", "h100-1"), ("003-dgx-spark", "spark-1")):
        p = make_plan(host, CASES[name][0], CASES[name][1])
        for text in p.departures:
            assert f"departure: {text}" in out, text
        assert "flags: " + " ".join(p.instances[0].args[1:]) in out


# ---------------------------------------------------------------------------- the real parsers (opt-in)

REAL_PYTHON = __import__("os").environ.get("NEMOFLEET_VLLM_PYTHON")
REAL_VERSION = __import__("os").environ.get("NEMOFLEET_VLLM_VERSION", "0.32.0")


@pytest.mark.skipif(not REAL_PYTHON, reason="opt-in: NEMOFLEET_VLLM_PYTHON=tests/real_vllm/vllm_python.sh, "
                    "as make test-real-parser sets it")
def test_every_seed_plan_and_restored_plan_parses_with_the_real_vllm_parser():
    """The seeds' own commands, the plans on their hardware and the plans with every restoring
    setting, and the unverified-hardware lines, parsed by the real parser of NEMOFLEET_VLLM_VERSION."""
    import subprocess

    image = {"vllm_image": f"vllm/vllm-openai:v{REAL_VERSION}"}
    todo = []
    for name, (gpus, data, _, _) in CASES.items():
        todo.append({"name": f"seed {name}", "args": seed_words(name)})
        p = make_plan("seed", gpus, merged(data, image))
        restored = make_plan("seed", gpus, merged(data, image, *[d.restore for d in p.departed if d.restore]))
        for label, plan in (("plan", p), ("restored", restored)):
            m = plan.model
            todo.append({"name": f"{label} {name}", "args": plan.instances[0].args, "reasoning": m.reasoning_parser,
                         "plugin": bool(m.reasoning_parser_plugin), "tool": m.tool_call_parser})
    for gpus, data in ((B300, {"model": "nemotron-3.5-lightning-nvfp4"}), (B300, {"vllm_extra_args": {
            "--mamba-ssu-algorithm": "auto", "--moe-backend": "auto"}, "model": "nemotron-3.5-lightning-nvfp4"}),
            (THOR, {"model": "nemotron-3.5-lightning-bf16"}), (GB10, {"recipe_flags": False})):
        p = make_plan("hw", gpus, merged(data, image))
        todo.append({"name": f"{gpus[0].name} {data}", "args": p.instances[0].args, "tool": p.model.tool_call_parser})
    r = subprocess.run([REAL_PYTHON, str(HERE.parent / "real_vllm" / "vllm_parse.py")], input=json.dumps(todo),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result["errors"]
    print(f"{len(todo)} seed command lines parsed by vLLM {REAL_VERSION}")
