"""Preflight sentences over HostFacts (real H200 capture, and edited copies of it)."""
import copy
import json
from pathlib import Path

from nemofleet import preflight

H200 = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "hostfacts.json").read_text())
DATA = {"vllm_api_key": "x"}


def ready():
    f = copy.deepcopy(H200)
    f["toolkit"].update(version="1.18.0", hook=True, runtime=True)
    f["docker"].update(installed=True, running=True, server="29.1.3", cgroup_driver="systemd", cgroup_version=2)
    return f


def test_real_h200_refused_because_docker_and_toolkit_are_absent():
    v = preflight.check("h200", H200, DATA)
    assert v.plan is not None and v.plan.instances[0].gpus[0].name == "NVIDIA H200"
    assert any("Docker is not installed" in r for r in v.refusals)
    assert any("NVIDIA Container Toolkit is not installed" in r for r in v.refusals)
    assert "1x NVIDIA H200 143771 MiB cc 9.0, driver 580.159.04 (CUDA 13.0)" in preflight.summary(H200)


def test_ready_h200_passes():
    v = preflight.check("h200", ready(), DATA)
    assert v.ok, v.refusals


def test_no_driver_and_driver_not_loaded():
    f = ready()
    f["gpus"] = {"smi": False, "rc": None, "error": "nvidia-smi not found", "driver": None, "gpus": []}
    assert "nvidia-smi is not installed" in preflight.check("h", f, DATA).refusals[0]
    f["gpus"] = {"smi": True, "rc": 9, "error": "couldn't communicate with the NVIDIA driver", "driver": None, "gpus": []}
    assert "modprobe nvidia" in preflight.check("h", f, DATA).refusals[0]


def test_old_driver_for_image_cuda():
    f = ready()
    f["gpus"]["driver"] = "535.104.05"
    r = preflight.check("h", f, {**DATA, "vllm_image": "vllm/vllm-openai:v0.33.0"}).refusals
    assert any("needs CUDA 13.0 (driver >= 580.65.06)" in s for s in r)


def test_mig_refused_persistence_warned():
    f = ready()
    f["gpus"]["gpus"][0].update(mig="Enabled", persistence="Disabled")
    v = preflight.check("h", f, DATA)
    assert any("MIG is enabled on GPU 0" in s for s in v.refusals)
    assert any("persistence mode is off" in w for w in v.warnings)


def test_nvml_trap_reported_with_fix_when_cdi_impossible():
    f = ready()
    f["docker"]["server"] = "24.0.7"
    v = preflight.check("h", f, DATA)
    assert v.ok and v.plan.docker_exec_opts == ["native.cgroupdriver=cgroupfs"]
    assert any("NVML 'Unknown Error' trap" in w for w in v.warnings)
    v = preflight.check("h", f, {**DATA, "nvml_remedy": "none"})
    assert any("loses GPUs after every systemctl daemon-reload" in s for s in v.refusals)


def test_cdi_used_when_available():
    f = ready()
    f["toolkit"]["cdi_specs"] = ["/var/run/cdi/nvidia.yaml"]
    assert preflight.check("h", f, DATA).plan.gpu_method == "cdi"


def test_disk_too_small():
    f = ready()
    f["disk_free"] = 5 * 10**9
    assert any("not enough disk for the weights: 5.0 GB free" in s for s in preflight.check("h", f, DATA).refusals)
