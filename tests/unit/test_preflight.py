"""Preflight sentences over HostFacts (real H200 capture, and edited copies of it)."""
import copy
import json
from pathlib import Path

from opharness import verdict  # noqa: E402
from nemofleet import factmodel, preflight

H200 = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "hostfacts.json").read_text())
DATA = {"vllm_api_key": "sk-test-0123456789"}


def ready():
    f = copy.deepcopy(H200)
    f["toolkit"].update(version="1.18.0", hook=True, runtime=True)
    f["docker"].update(installed=True, running=True, server="29.1.3", cgroup_driver="systemd", cgroup_version=2)
    return f


def test_real_h200_refused_because_docker_and_toolkit_are_absent():
    v = verdict("h200", H200, DATA)
    assert v.plan is not None and v.plan.instances[0].gpus[0].name == "NVIDIA H200"
    assert any("Docker is not installed" in r for r in v.refusals)
    assert any("NVIDIA Container Toolkit is not installed" in r for r in v.refusals)
    assert "1x NVIDIA H200 143771 MiB cc 9.0, driver 580.159.04 (CUDA 13.0)" in preflight.summary(factmodel.parse(H200)[0])


def test_ready_h200_passes():
    v = verdict("h200", ready(), DATA)
    assert v.ok, v.refusals


def test_no_driver_and_driver_not_loaded():
    f = ready()
    f["gpus"] = {"smi": False, "rc": None, "error": "nvidia-smi not found", "driver": None, "gpus": []}
    assert "nvidia-smi is not installed" in verdict("h", f, DATA).refusals[0]
    f["gpus"] = {"smi": True, "rc": 9, "error": "couldn't communicate with the NVIDIA driver", "driver": None, "gpus": []}
    assert "modprobe nvidia" in verdict("h", f, DATA).refusals[0]


def test_old_driver_for_image_cuda():
    f = ready()
    f["gpus"]["driver"] = "535.104.05"
    r = verdict("h", f, {**DATA, "vllm_image": "vllm/vllm-openai:v0.33.0"}).refusals
    assert any("needs CUDA 13.0 (driver >= 580.65.06)" in s for s in r)


def test_mig_refused_persistence_warned():
    f = ready()
    f["gpus"]["gpus"][0].update(mig="Enabled", persistence="Disabled")
    v = verdict("h", f, DATA)
    assert any("MIG is enabled on GPU 0" in s for s in v.refusals)  # the only GPU: nothing to plan
    # two GPUs, MIG on GPU 0: GPU 0 is left out with a warning, GPU 1 serves and is warned about
    f = ready()
    second = dict(f["gpus"]["gpus"][0], index=1, uuid="GPU-5ec0d000-0000-4000-8000-000000000001", persistence="Disabled")
    f["gpus"]["gpus"][0].update(mig="Enabled")
    f["gpus"]["gpus"].append(second)
    v = verdict("h", f, DATA)
    assert v.ok, v.refusals
    assert [g.index for i in v.plan.instances for g in i.gpus] == [1]
    assert any("MIG" in w and "GPU 0" in w for w in v.warnings), v.warnings
    assert any("persistence mode is off on GPU 1" in w for w in v.warnings)


def test_nvml_trap_reported_with_fix_when_cdi_impossible():
    f = ready()
    f["docker"]["server"] = "24.0.7"
    v = verdict("h", f, DATA)
    assert v.ok and v.plan.docker_exec_opts == ["native.cgroupdriver=cgroupfs"]
    assert any("NVML 'Unknown Error' trap" in w for w in v.warnings)
    v = verdict("h", f, {**DATA, "nvml_remedy": "none"})
    assert any("loses GPUs after every systemctl daemon-reload" in s for s in v.refusals)


def test_cdi_used_when_available():
    f = ready()
    f["toolkit"]["cdi_specs"] = ["/var/run/cdi/nvidia.yaml"]
    assert verdict("h", f, DATA).plan.gpu_method == "cdi"


def test_disk_too_small():
    f = ready()
    f["disk_free"] = 5 * 10**9
    assert any("not enough disk for the weights: 5.0 GB free" in s for s in verdict("h", f, DATA).refusals)


def test_nvml_trap_judged_by_the_cgroup_driver_docker_will_have():
    from nemofleet.plan import effective_cgroup_driver

    assert effective_cgroup_driver(None, "systemd", 2) == "systemd"  # exec-opts left alone
    assert effective_cgroup_driver(["native.cgroupdriver=cgroupfs"], "systemd", 2) == "cgroupfs"
    assert effective_cgroup_driver([], "cgroupfs", 2) == "systemd"  # Docker's default on cgroup v2
    assert effective_cgroup_driver([], "systemd", 1) == "cgroupfs"
    # NVIDIA/nvidia-docker#1730: the systemd driver is the trap on cgroup v1 too
    f = ready()
    f.update(cgroup=1)
    f["docker"].update(server="20.10.24", cgroup_version=1, cgroup_driver="systemd")
    v = verdict("h", f, DATA)
    assert v.ok and v.plan.docker_exec_opts == ["native.cgroupdriver=cgroupfs"]
    # an explicit systemd driver cannot be remedied with cgroupfs: one sentence, no plan
    f["docker"]["cgroup_driver"] = "cgroupfs"
    v = verdict("h", f, {**DATA, "docker_exec_opts": ["native.cgroupdriver=systemd"]})
    assert any("docker_exec_opts keeps the systemd cgroup driver" in r for r in v.refusals), v.refusals
    # ... unless the GPUs come through CDI, which the trap does not touch
    f["docker"]["server"] = "29.1.3"
    f["toolkit"]["cdi_specs"] = ["/var/run/cdi/nvidia.yaml"]
    v = verdict("h", f, {**DATA, "docker_exec_opts": ["native.cgroupdriver=systemd"]})
    assert v.ok and v.plan.gpu_method == "cdi"


def test_gpu_probe_script_reloads_between_two_nvidia_smi_and_records_only_on_success():
    from nemofleet import render
    from nemofleet.operations.gpu_access import STATE, probe_script

    script = probe_script("vllm/vllm-openai:v0.27.1", render.gpu_args("gpus", ["GPU-1"]), '{"m": 1}', "HINT")
    lines = script.splitlines()
    reload_at = lines.index("systemctl daemon-reload")
    assert "nvidia-smi -L" in lines[reload_at - 1] and "nvidia-smi -L" in lines[reload_at + 1]
    assert "HINT" in lines[reload_at + 1] and "--gpus '\"device=GPU-1\"'" in script
    assert lines[-1].endswith(f"> {STATE}")  # written last: a failed probe is probed again next run
    assert render.gpu_args("cdi", ["GPU-1", "GPU-2"]) == ["--device=nvidia.com/gpu=GPU-1", "--device=nvidia.com/gpu=GPU-2"]


def test_cdi_chosen_when_docker_has_it_and_the_toolkit_can_generate_the_spec():
    f = ready()  # Docker 29, toolkit 1.18.0, no spec yet: the host configuration generates it
    assert not f["toolkit"].get("cdi_specs")
    assert verdict("h", f, DATA).plan.gpu_method == "cdi"
    f["toolkit"]["version"] = None  # the hook alone (no nvidia-ctk) cannot generate one
    assert verdict("h", f, DATA).plan.gpu_method == "gpus"


def _plan_cli(tmp_path, capsys, inventory: str, facts) -> tuple[int, str]:
    import os

    from nemofleet import cli

    inv = f"inv_{tmp_path.name.replace('-', '_')}.py"  # pyinfra caches an inventory module by its name
    (tmp_path / inv).write_text(inventory)
    (tmp_path / "facts.json").write_text(facts if isinstance(facts, str) else json.dumps(facts))
    here = os.getcwd()
    os.chdir(tmp_path)  # no group_data here: the inventory alone
    try:
        try:
            rc = cli.main(["plan", inv, "--facts", "facts.json"])
        except SystemExit as exc:
            rc = exc.code
    finally:
        os.chdir(here)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_plan_from_a_facts_file_refuses_incomplete_facts_and_misspelt_groups(tmp_path, capsys):
    inv = ('model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "0123456789abcdef0123456789abcdef01234567"}\n'
           'gpu_h200 = [("ok-1", {"vllm_api_key": "sk-nf-' + "a" * 32 + '"}), "nodocker-1"]\ngpu_h2000 = ["typo-1"]\n')
    no_docker = {k: v for k, v in ready().items() if k != "docker"}
    rc, out = _plan_cli(tmp_path, capsys, inv, {"ok-1": ready(), "nodocker-1": no_docker, "typo-1": ready()})
    assert rc == 1 and "Traceback" not in out
    assert "REFUSED" not in out.split("== nodocker-1")[0], out
    assert "REFUSED: the facts file's entry for nodocker-1 lacks docker: write it with" in out
    assert "REFUSED: group gpu_h2000 is not a GPU class (did you mean gpu_h200?)" in out


def test_plan_refuses_what_the_deploy_refuses_a_host_without_an_api_key(tmp_path, capsys):
    # `nemofleet plan` shows the deploy's own decision (desired.decide): no key, no plan
    rc, out = _plan_cli(tmp_path, capsys, 'gpu_h200 = ["ok-1"]\n', {"ok-1": ready()})
    assert rc == 1 and "REFUSED: no API key: set vllm_api_key or vllm_api_key_file" in out, out


def test_plan_facts_file_that_is_not_json_is_one_sentence(tmp_path, capsys):
    rc, out = _plan_cli(tmp_path, capsys, 'gpu_h200 = ["a"]\n', "{not json")
    assert rc == 2 and "cannot read the facts file facts.json:" in out and "Traceback" not in out


def test_a_470_driver_is_told_it_is_too_old_for_the_query_naming_the_field():
    """A 470 driver's nvidia-smi has no compute_cap field: the GPU query exits 2 with nvidia-smi's
    own line (as the H200 capture's query_invalid_field.out for another field)."""
    from nemofleet.facts.gpu import NvidiaGpus

    f = ready()
    f["gpus"] = NvidiaGpus().process(['Field "compute_cap" is not a valid field to query.', "", "RC=2"])
    why = verdict("h", f, DATA).refusals
    assert len(why) == 1 and "too old for nemofleet's GPU query" in why[0] and "query field compute_cap" in why[0]
    assert "upgrade the NVIDIA data-center driver" in why[0] and "run nvidia-smi" not in why[0]


def test_an_image_cuda_newer_than_the_driver_table_refuses_naming_its_newest_row_and_the_override():
    """Fail closed: a CUDA the table has no row for (or above) is never checked as "no driver needed"."""
    f = ready()
    f["image"] = {"id": "sha256:" + "1" * 64, "env": {"NVIDIA_REQUIRE_CUDA": "cuda>=13.9 brand=tesla,driver>=595"}}
    why = verdict("h", f, DATA).refusals
    newest = max(preflight.CUDA_MIN_DRIVER, key=preflight.vt)
    assert len(why) == 1 and "needs CUDA 13.9 (its NVIDIA_REQUIRE_CUDA)" in why[0], why
    assert f"its newest row: CUDA {newest}, driver >= {preflight.CUDA_MIN_DRIVER[newest]}" in why[0]
    assert "set vllm_image_cuda" in why[0]
    # the override: the operator names the CUDA to check the driver against
    assert verdict("h", f, {**DATA, "vllm_image_cuda": "13.0"}).ok
    assert not verdict("h", f, {**DATA, "vllm_image_cuda": "13.2"}).ok  # 580.159.04 < 595.45.04
    # between rows: the next row's driver, never none (12.7 is no CUDA release)
    assert preflight.min_driver("12.7") == preflight.CUDA_MIN_DRIVER["12.8"]
    assert preflight.min_driver("11.8") == preflight.CUDA_MIN_DRIVER["12.0"]
    # non-ASCII digits in the image's env are no version: the table's CUDA decides, with its warning
    f["image"]["env"]["NVIDIA_REQUIRE_CUDA"] = "cuda>=١٣.٩"
    assert preflight.image_cuda(factmodel.parse(f)[0], "vllm/vllm-openai:v0.32.0")[1] == "table"


def test_a_compute_capability_of_non_ascii_digits_is_none():
    """int('٩') is 9: a cc of Arabic-Indic digits planned as Hopper; it is refused like any cc that
    is not MAJOR.MINOR."""
    f = ready()
    f["gpus"]["gpus"][0]["cc"] = "٩.٠"
    why = verdict("h", f, DATA).refusals
    assert any("compute capability '٩.٠' is not of the form MAJOR.MINOR" in r for r in why), why
