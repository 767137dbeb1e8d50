"""Serving plan: golden command lines per testbed GPU profile and catalog model, the memory
budget against the seeds' measured figures, and one-sentence refusals."""
import json
from pathlib import Path

import pytest

from nemofleet import vllm_flags
from nemofleet.models import CATALOG
from nemofleet.plan import GIB, Gpu, PlanError, make_plan
from nemofleet.testbed import load_profiles

GOLDEN = Path(__file__).with_name("golden_plans.json")
PROFILES = {h: [Gpu(**{k: g[k] for k in ("index", "uuid", "name", "memory_mib", "cc")}) for g in p["gpus"]]
            for h, p in load_profiles().items() if not h.startswith("broken") and not p.get("optional")}
B200 = [Gpu(i, f"GPU-b{i}", "NVIDIA B200", 183359, "10.0") for i in range(8)]


def all_plans():
    out = {}
    for host, gpus in {**PROFILES, "b200-8": B200}.items():
        for key in CATALOG:
            try:
                p = make_plan(host, gpus, {"model": key})
                out[f"{host}/{key}"] = {"instances": len(p.instances), "tp": p.instances[0].tp,
                                        "args": " ".join(p.instances[0].args)}
            except PlanError as exc:
                out[f"{host}/{key}"] = {"refused": str(exc)}
    return out


def test_golden_command_lines():
    assert all_plans() == json.loads(GOLDEN.read_text())


def test_a100_lightning_nvfp4_is_seed_000():
    p = make_plan("a100", PROFILES["a100-1"], {"model": "nemotron-3.5-lightning-nvfp4"})
    seed = ("--served-model-name nemotron-3.5-lightning --trust-remote-code --max-model-len 131072 "
            "--gpu-memory-utilization 0.90 --max-num-seqs 32 --max-num-batched-tokens 16384 --enable-prefix-caching "
            "--mamba-backend flashinfer --mamba-cache-mode align --mamba-ssm-cache-dtype float16 "
            "--reasoning-parser nemotron_v3 --tool-call-parser qwen3_coder --enable-auto-tool-choice --host 0.0.0.0 --port 8000")
    assert " ".join(p.instances[0].args[1:]).startswith(seed)
    for hopper_only in ("humming", "horizontal", "--async-scheduling"):
        assert hopper_only not in " ".join(p.instances[0].args)


def test_hopper_flags_from_seed_003_and_no_horizontal_with_spec_below_sm100():
    args = " ".join(make_plan("h", PROFILES["h100-1"], {}).instances[0].args)
    for f in ("--async-scheduling", "--moe-backend humming", "--linear-backend humming", "--mamba-ssu-algorithm horizontal",
              "--enable-mamba-cache-stochastic-rounding", "--mamba-cache-philox-rounds 5"):
        assert f in args
    spec = " ".join(make_plan("h", PROFILES["h100-1"], {"speculative": "mtp"}).instances[0].args)
    assert '--speculative-config {"method":"mtp","num_speculative_tokens":3}' in spec and "horizontal" not in spec
    b = " ".join(make_plan("b", B200, {"speculative": "mtp"}).instances[0].args)
    assert "horizontal" in b and "--moe-backend flashinfer_cutlass" in b


def test_memory_budget_matches_seed_figures():
    # seed 000: Lightning NVFP4, 1x A100 80 GB, 131072 ctx, 32 seqs, util 0.90 fits, ~73 GB in use
    p = make_plan("a100", PROFILES["a100-1"], {"max_num_seqs": 32, "max_model_len": 131072, "gpu_memory_utilization": 0.9})
    m = p.instances[0].memory
    assert m.need <= m.available
    in_use = (m.available + 1.5 * GIB) / GIB  # vLLM takes util x memory, plus the CUDA context
    assert 72 <= in_use <= 75
    # seed 004: Super VL BF16 ~232 GB of weights, KV 8-11 KB/token, 400 GB total is the safe line
    vl = CATALOG["nemotron-3.5-super-vl-bf16"]
    assert 8_000 <= vl.kv_bytes_per_token(2) <= 11_000 * 1.024
    with pytest.raises(PlanError) as e:
        make_plan("a100", PROFILES["a100-1"], {"model": "nemotron-3.5-super-vl-bf16"})
    assert str(e.value) == ("nemotron-3.5-super-vl-bf16 (232 GB of bf16 weights) needs 4x H200 or 4x B200 or 8x H100 "
                            "with TP; this host has 1x A100 80 GiB")


def test_instances_per_gpu_and_tp():
    p = make_plan("h", PROFILES["h100-1"], {"model": "nemotron-3.5-lightning-nvfp4"})
    assert len(p.instances) == 8 and [i.host_port for i in p.instances] == list(range(8000, 8008))
    assert [i.gpus[0].index for i in p.instances] == list(range(8))
    vl = make_plan("h", PROFILES["h100-1"], {"model": "nemotron-3.5-super-vl-bf16"})
    assert len(vl.instances) == 1 and vl.instances[0].tp == 8 and "--enable-expert-parallel" in vl.instances[0].args


@pytest.mark.parametrize("data,sentence", [
    ({"model": "nemotron-9"}, "unknown model 'nemotron-9'"),
    ({"tensor_parallel_size": 3}, "tensor_parallel_size 3 does not divide this host's 8 GPUs"),
    ({"max_model_len": 2_000_000}, "max_model_len 2000000 is above nemotron-3.5-lightning-nvfp4's maximum context of 1048576"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization 1.5 must be in (0, 1]"),
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization 0.0 must be in (0, 1]"),
    ({"vllm_extra_args": {"--made-up-flag": True}}, "vLLM 0.27.1 has no flag --made-up-flag"),
    ({"vllm_extra_args": {"--moe-backend": "warp"}}, "--moe-backend 'warp' is not one of vLLM 0.27.1's values"),
    ({"max_num_seqs": "lots"}, "max_num_seqs (concurrent sequences per instance) must be int, not 'lots'"),
    ({"port_base": True}, "port_base (first host port) must be a number, not True"),
    ({"speculative": "eagle"}, "speculative decoding 'eagle' is not available"),
    ({"vllm_image": "vllm/vllm-openai:v0.1.0"}, "vLLM 0.1.0 is not in nemofleet's flag table"),
    ({"tensor_parallel_size": 1, "model": "nemotron-3.5-super-vl-bf16"}, "with tensor_parallel_size 1 needs"),
    ({"instances": 9}, "9 instances of 1 GPU(s) do not fit this host's 8 GPUs"),
    ({"vllm_image": "vllm/vllm-openai:v0.33.0", "vllm_extra_args": {"--mamba-cache-mode": "align"}},
     "vLLM 0.33.0 deprecates --mamba-cache-mode"),
])
def test_refusals_are_one_sentence(data, sentence):
    with pytest.raises(PlanError) as e:
        make_plan("h", PROFILES["h100-1"], data)
    assert sentence in str(e.value)
    assert "\n" not in str(e.value)


def test_every_emitted_flag_exists_in_its_version():
    for version in vllm_flags.VERSIONS:
        for host, gpus in {**PROFILES, "b200-8": B200}.items():
            for key in CATALOG:
                for spec in (None, "mtp"):
                    try:
                        p = make_plan(host, gpus, {"model": key, "vllm_image": f"vllm/vllm-openai:v{version}", "speculative": spec})
                    except PlanError:
                        continue
                    parser = vllm_flags.build_argparser(version)
                    parser.parse_args(p.instances[0].args)  # SystemExit on any unknown flag
                    if version == "0.33.0":
                        assert "--mamba-cache-mode" not in p.instances[0].args


def test_dflash_mounts_and_downloads_the_draft():
    p = make_plan("h", PROFILES["h200-1"], {"speculative": "dflash"})
    assert [d["repo"] for d in p.downloads][1].endswith("-NVFP4-DFlash")
    sc = p.instances[0].args[p.instances[0].args.index("--speculative-config") + 1]
    assert json.loads(sc)["model"] == "/models/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash"


def test_local_meta_overrides_catalog():
    p = make_plan("h", PROFILES["h200-1"], {}, local_meta={"total_size": 1000, "config": {"hybrid_override_pattern": "M*M*"}})
    assert p.model.weight_bytes == 1000 and p.model.attention_layers == 2


def test_super_vl_plugin_parser():
    p = make_plan("h", PROFILES["h100-1"], {"model": "nemotron-3.5-super-vl-base-bf16"})
    a = p.instances[0].args
    assert a[a.index("--reasoning-parser-plugin") + 1].endswith("/ultra_v3_reasoning_parser.py")
    assert a[a.index("--reasoning-parser") + 1] == "ultra_v3"


def test_registry_rewrite_for_non_hub_images():
    p = make_plan("h", PROFILES["h200-1"], {"vllm_image": "nvcr.io/nvidia/vllm:v0.27.1",
                                            "image_registry_rewrite": {"nvcr.io/": "registry.internal/nvcr/"}})
    assert p.image == "registry.internal/nvcr/nvidia/vllm:v0.27.1" and p.vllm_version == "0.27.1"
