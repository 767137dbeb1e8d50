"""Fact fixtures in pyinfra's style (command output lines -> value), incl. a real H200 capture."""
import json
from pathlib import Path

from nemofleet.facts.docker import DaemonJson, DockerInfo, ImageInfo
from nemofleet.facts.gpu import ContainerToolkit, NvidiaCudaVersion, NvidiaGpus
from nemofleet.facts.host import CgroupVersion, FreeDisk, HostFacts

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200"
IMAGE = "vllm/vllm-openai:v0.27.1"


def lines(name):
    return (H200 / name).read_text().splitlines()


def test_nvidia_gpus_parses_real_h200_query():
    out = lines("query_noheader.out") + [f"RC={(H200 / 'query_noheader.rc').read_text().strip()}"]
    fact = NvidiaGpus().process(out)
    assert fact["rc"] == 0 and fact["driver"] == "580.159.04"
    assert fact["gpus"] == [{
        "index": 0, "uuid": "GPU-ea950d4d-c55e-4fad-740e-b8bae40ede3a", "name": "NVIDIA H200",
        "memory_mib": 143771, "cc": "9.0", "bus_id": "00000000:00:06.0", "mig": "Disabled",
        "persistence": "Enabled", "driver": "580.159.04"}]


def test_nvidia_gpus_absent_and_failing_driver():
    assert NvidiaGpus().process(["NOCMD"])["smi"] is False
    bad = NvidiaGpus().process(lines("query_bad_index.out") + ["RC=6"])
    assert bad["rc"] == 6 and bad["gpus"] == [] and "No devices were found" in bad["error"]
    not_loaded = NvidiaGpus().process([
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "RC=9"])
    assert not_loaded["rc"] == 9


def test_public_a100_and_h100_formats_and_na_fields():
    a100 = "0, GPU-5f2c8a41-3b9e-4d1a-9c6e-1a2b3c4d5e01, NVIDIA A100-SXM4-80GB, 81920, 570.124.06, 8.0, 00000000:07:00.0, Disabled, Enabled"
    l40s = "0, GPU-1, NVIDIA L40S, 46068, 580.95.05, 8.9, 00000000:01:00.0, [N/A], Enabled"
    g = NvidiaGpus().process([a100, l40s.replace("0, GPU-1", "1, GPU-1"), "RC=0"])["gpus"]
    assert g[0]["cc"] == "8.0" and g[0]["memory_mib"] == 81920
    assert g[1]["mig"] == "N/A"


def test_cuda_version_from_real_q_xml_via_sed_output():
    xml = (H200 / "q_xml.out").read_text()
    version = xml.split("<cuda_version>")[1].split("</cuda_version>")[0]
    assert NvidiaCudaVersion().process([version]) == "13.0"


def test_toolkit_docker_daemon_json_cgroup_disk():
    tk = ContainerToolkit().process(["ctk=1.18.0", "hook=1", "runtime=1", "cdi=/etc/cdi/nvidia.yaml", "cdi_refresh=enabled"])
    assert tk == {"version": "1.18.0", "hook": True, "runtime": True, "cdi_specs": ["/etc/cdi/nvidia.yaml"], "cdi_refresh": True}
    assert ContainerToolkit().process(["ctk=", "cdi_refresh="])["version"] is None
    d = DockerInfo().process(["installed=1", '@@engine 200 info {"ServerVersion":"29.1.3","CgroupDriver":"systemd",'
                              '"CgroupVersion":"2","DefaultRuntime":"runc","Runtimes":{"nvidia":{},"runc":{}}}'])
    assert d["running"] and d["cgroup_version"] == 2 and d["runtimes"] == ["nvidia", "runc"]
    assert DockerInfo().process(["installed=0"])["installed"] is False
    assert DockerInfo().process(["installed=1", "@@engine down info Connection refused"])["running"] is False
    assert DaemonJson().process([DaemonJson.FILE, '{"bip": "10.0.0.1/24"}'])["data"] == {"bip": "10.0.0.1/24"}
    assert DaemonJson().process([DaemonJson.FILE, "{oops"])["data"] is None
    assert DaemonJson().process(["##NEMOFLEET_ABSENT##"]) == {"exists": False, "text": "", "data": {}, "error": None}
    assert CgroupVersion().process(["cgroup2fs"]) == 2 and CgroupVersion().process(["tmpfs"]) == 1
    assert FreeDisk().process(["68702183424"]) == 68702183424
    assert ImageInfo().process(['@@engine 404 image:x:1 {"message":"No such image: x:1"}']) is None
    assert ImageInfo().process(['@@engine 200 image:x:1 {"Id":"sha256:ab","Config":{"Env":["CUDA_VERSION=12.8.1"]}}'
                                ])["env"] == {"CUDA_VERSION": "12.8.1"}


def with_engine_read(raw: list[str]) -> list[str]:
    """hostfacts.out with its docker and image sections (the docker CLI's, at the first capture) as
    the same real H200 printed them on 2026-12-04 with the Engine API read (hostfacts_engine.out):
    its engine section, and the docker and image sections that go with it."""
    def sections(out):
        got, cur = {}, None
        for line in out:
            if line.startswith(HostFacts.MARK):
                cur = line[len(HostFacts.MARK):]
                got[cur] = []
            elif cur is not None:
                got[cur].append(line)
        return got
    new = sections(lines("hostfacts_engine.out"))
    old = sections(raw)
    out = [f"{HostFacts.MARK}engine", *new["engine"]]
    for key, body in old.items():
        out += [f"{HostFacts.MARK}{key}", *(new[key] if key in ("docker", "image") else body)]
    return out


def test_host_facts_real_h200_one_command_output():
    """The combined fact's raw output, captured on the real H200 (no Docker there)."""
    fact = HostFacts().process(with_engine_read(lines("hostfacts.out")))
    raw = lines("hostfacts.out")
    want = json.loads((H200 / "hostfacts.json").read_text())  # `pyinfra @local fact` a moment later
    want["disk_free"] = int(raw[raw.index("@@nemofleet-fact:disk_free") + 1])  # free space moved in between
    for added in ("release", "gpu_access", "lock"):  # parts added after the capture: a missing section reads as absent
        want.setdefault(added, None)
    want.setdefault("errors", {})  # key added after the capture: nothing unreadable there
    want.setdefault("addresses", {})  # part added after the capture: an absent section is no address
    want.setdefault("rdma", [])  # part added after the capture: an absent section is no RDMA adapter
    from nemofleet.facts.gpuhealth import GpuHealth
    want.setdefault("health", GpuHealth().default())  # part added after the capture: absent reads as not reported
    assert fact == want
    assert fact["gpus"]["gpus"][0]["name"] == "NVIDIA H200" and fact["cuda"] == "13.0"
    assert fact["docker"]["installed"] is False and fact["cgroup"] == 2


def test_host_facts_real_h200_capture_with_the_engine_read():
    """The whole command of 2026-12-04 on the real H200: no Docker there, so the engine read finds no
    socket ("down"): not installed, no image, and no part in errors."""
    raw = lines("hostfacts_engine.out")
    assert "@@engine down info No such file or directory" in raw
    fact = HostFacts().process(raw)
    assert fact["errors"] == {}
    assert fact["docker"] == DockerInfo().default() and fact["image"] is None
    assert fact["gpus"]["gpus"][0]["name"] == "NVIDIA H200" and fact["cuda"] == "13.0"
    assert fact["health"]["gpus"][0]["lost"] is False


def test_host_facts_command_is_one_command_exiting_zero():
    cmd = HostFacts().command(models_root="/srv/m", image="vllm/vllm-openai:v0.27.1")
    assert cmd.endswith("; true") and "nvidia-smi --query-gpu=" in cmd and "timeout 20 sh -c" in cmd and " sh /srv/m " in cmd


def test_container_networks_tolerates_partial_answers():
    from nemofleet.operations.docker import ContainerNetworks

    out = ContainerNetworks().process([
        '@@engine 200 container:nemotron-0 {"Name":"/nemotron-0","State":{"Running":true},'
        '"NetworkSettings":{"Networks":{"dify_default":{"Aliases":["nemotron"]}}}}', "", "garbage",
        '@@engine 404 container:nemotron-1 {"message":"No such container: nemotron-1"}',
        '@@engine 200 container:nemotron-2 {"Name":"/nemotron-2","State":{"Runn'])  # cut off mid-answer
    assert out == {"nemotron-0": {"running": True, "networks": {"dify_default": ["nemotron"]}}, "nemotron-1": None,
                   "nemotron-2": None}


def test_os_release_release_and_models_on_disk():
    from nemofleet.facts.host import OsRelease, Release
    from nemofleet.facts.weights import ModelsOnDisk

    os_rel = OsRelease().process(lines("os_release.out"))
    assert os_rel["ID"] == "ubuntu" and os_rel["VERSION_ID"] == "24.04"
    assert Release().process(["id=0a1b2c3d4e5f", "image=vllm/vllm-openai:v0.27.1"]) == {
        "id": "0a1b2c3d4e5f", "image": "vllm/vllm-openai:v0.27.1"}
    assert Release().process([]) is None
    meta = ModelsOnDisk().process(['{"nvidia--X": {"total_size": 10, "complete": true}}'])
    assert meta["nvidia--X"]["total_size"] == 10
    assert ModelsOnDisk().process(["not json"]) == {}


def test_apt_packages_fact_reads_versions_and_holds():
    from nemofleet.operations.packages import AptPackages, dearmor, matches

    out = AptPackages().process(["pkg nvidia-container-toolkit 1.18.0-1 hi", "pkg libnvidia-container1 1.18.0-1 ii",
                                 "pkg nvidia-driver-580-server 580.95.05-0ubuntu1 rc", "held nvidia-container-toolkit"])
    assert out["nvidia-container-toolkit"] == {"version": "1.18.0-1", "held": True}
    assert out["libnvidia-container1"] == {"version": "1.18.0-1", "held": False}
    assert out["nvidia-driver-580-server"]["version"] is None  # removed, config files left
    assert matches("580.159.04-0ubuntu1", "580.*") and not matches("570.124.06-0ubuntu1", "580.*")
    assert matches("1.18.0-1", "1.18.0-1") and not matches("1.18.1-1", "1.18.0-1")
    import base64
    blob = bytes(range(40))
    armored = ("-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: x\n\n" + base64.b64encode(blob).decode()
               + "\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n").encode()
    assert dearmor(armored) == blob and dearmor(blob) == blob


def test_bootstrap_state_on_the_real_h200_driver_loaded_without_packages():
    """Captured on the real H200 (device tool): the driver is the open kernel module 580.159.04,
    loaded but not installed by dpkg; dpkg-query knows none of the packages (stderr, exit 1)."""
    from nemofleet.bootstrap import BootstrapState

    stdout = [ln for ln in lines("dpkg_query_driver.out") if not ln.startswith(("dpkg-query:", "rc "))]
    loaded = (H200 / "sys_module_nvidia_version.out").read_text().strip()
    out = BootstrapState().process(stdout + [f"loaded {loaded}"])
    assert out["_driver"] == "580.159.04"
    assert all(k == "_driver" for k in out)  # no package installed: versions unknown -> install
    assert BootstrapState().process(["loaded none"])["_driver"] is None


def test_daemon_json_without_final_newline_does_not_swallow_the_next_fact():
    """Found on the testbed: python's json.dump writes no final newline; the next part's marker
    ran onto the JSON line and the file read as malformed."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "daemon.json"
        path.write_text('{"exec-opts": ["native.cgroupdriver=systemd"]}')  # no newline
        fact = DaemonJson()
        cmd = f"echo '@@m:a'; ( {fact.command(path=str(path))} ); echo '@@m:b'; echo tmpfs"
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout.splitlines()
        part = out[1:out.index("@@m:b")]
        assert fact.process(part)["data"] == {"exec-opts": ["native.cgroupdriver=systemd"]}


# --- bounded facts and unreadable output: a refusal of that host only, never an exception


GARBAGE = "[Unknown Error], GPU-1, NVIDIA H200, [Unknown Error], 580.159.04, 9.0, 00000000:00:06.0, Disabled, Enabled"


GARBAGE_SAID = ("nvidia-smi printed '[Unknown Error]' for index of row 1 of 1, which nemofleet cannot read; "
                "run nvidia-smi -q on the host")


def test_nvidia_gpus_garbage_is_an_error_not_no_gpu():
    fact = NvidiaGpus().process([GARBAGE, "RC=0"])
    assert fact["gpus"] == [] and fact["smi"] is True
    assert fact["error"] == GARBAGE_SAID
    assert "lists no GPU" not in fact["error"]


def test_nvidia_gpus_timeout_is_reported_as_a_hang():
    fact = NvidiaGpus().process(["RC=124"])
    assert fact["rc"] == 124 and fact["error"] == "nvidia-smi did not answer within 20 s (hung driver?)"


def test_nvidia_gpus_driver_na_is_unreadable_not_a_version():
    row = "0, GPU-1, NVIDIA H200, 143771, [N/A], 9.0, 00000000:00:06.0, Disabled, Enabled"
    fact = NvidiaGpus().process([row, "RC=0"])
    assert fact["driver"] is None and fact["gpus"][0]["driver"] is None  # never the string "[N/A]"
    import pytest
    from nemofleet.facts.gpu import Unreadable
    with pytest.raises(Unreadable) as e:
        NvidiaGpus().parse([row, "RC=0"])
    assert "reports no driver version" in str(e.value) and "supports CUDA" not in str(e.value)


def test_cuda_version_timeout_and_garbage():
    assert NvidiaCudaVersion().process(["TIMEOUT"]) is None
    assert NvidiaCudaVersion().process(["N/A"]) is None
    assert NvidiaCudaVersion().process(["[Unknown Error]"]) is None
    assert NvidiaCudaVersion().process(["12.8"]) == "12.8"


def test_docker_info_and_image_inspect_timeouts():
    d = DockerInfo().process(["installed=1", "@@engine timeout info"])
    assert d["installed"] is True and d["running"] is False
    assert ImageInfo().process(["@@engine timeout image:x:1"]) is None
    d = DockerInfo().process(["installed=1", "@@engine error timeout"])  # the whole read stopped
    assert d["installed"] is True and d["running"] is False


def hostfacts_output(**parts):
    out = []
    for key, lines in parts.items():
        out.append(f"@@nemofleet-fact:{key}")
        out += lines
    return out


def test_host_facts_collects_errors_per_part_and_keeps_going():
    fact = HostFacts().process(hostfacts_output(
        gpus=[GARBAGE, "RC=0"], cuda=["TIMEOUT"], toolkit=["ctk_timeout=1", "ctk=", "hook=1"],
        engine=["@@engine timeout info", f"@@engine timeout image:{IMAGE}"], docker=["installed=1"],
        cgroup=["cgroup2fs"]))
    assert fact["errors"] == {
        "gpus": GARBAGE_SAID,
        "cuda": "nvidia-smi -q -x did not answer within 20 s (hung driver?)",
        "toolkit": "nvidia-ctk --version did not answer within 20 s",
        "docker": "docker info did not answer within 20 s (dockerd hung?): check `systemctl status docker` on the host",
        "image": "docker image inspect did not answer within 20 s (dockerd hung?)",
    }
    assert fact["gpus"]["smi"] is True and fact["gpus"]["gpus"] == []
    assert fact["toolkit"]["hook"] is True and fact["cgroup"] == 2
    assert fact["docker"]["installed"] is True and fact["docker"]["running"] is False


def test_host_facts_any_parse_failure_is_one_sentence(monkeypatch):
    from nemofleet.facts import host as hostmod

    def boom(self, output):
        raise ValueError("invalid literal for int() with base 10: '[Unknown Error]'")

    monkeypatch.setattr(hostmod.FreeDisk, "parse", boom)
    fact = HostFacts().process(hostfacts_output(disk_free=["[Unknown Error]"], cgroup=["cgroup2fs"]))
    assert fact["disk_free"] is None and fact["cgroup"] == 2
    assert fact["errors"]["disk_free"].startswith("the FreeDisk check printed output nemofleet cannot read (ValueError")
    assert "first line '[Unknown Error]'" in fact["errors"]["disk_free"]


def test_a_hung_nvidia_smi_is_stopped_by_timeout(tmp_path, monkeypatch):
    """The real command against an nvidia-smi that never answers (timeout cut to 1 s)."""
    import subprocess

    from nemofleet.facts import gpu

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpu, "SMI_TIMEOUT", 1)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", NvidiaGpus().command()], capture_output=True, text=True, env=env, timeout=15)
    assert out.returncode == 0
    fact = NvidiaGpus().process(out.stdout.splitlines())
    assert fact["rc"] == 124 and fact["error"] == "nvidia-smi did not answer within 1 s (hung driver?)"
    cuda = subprocess.run(["sh", "-c", NvidiaCudaVersion().command()], capture_output=True, text=True, env=env, timeout=15)
    assert cuda.stdout.split() == ["TIMEOUT"]


def _sim(tmp_path, fault=None, timeout=10):
    import subprocess

    sim = Path(__file__).resolve().parents[2] / "testbed" / "src" / "nemofleet_testbed" / "sim"
    (tmp_path / "profile.json").write_text(json.dumps({
        "driver": "580.159.04", "cuda": "13.0", "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_mib": 143771,
                                                        "cc": "9.0", "bus_id": "00000000:00:06.0", "uuid": "GPU-1"}]}))
    (tmp_path / "visible").write_text("all\n")  # as inside a container: no boot-time driver state needed
    if fault:
        (tmp_path / "smi-fault").write_text(fault + "\n")
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\nexec python3 {sim / 'nvidia-smi'} \"$@\"\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "NEMOFLEET_SIM_DIR": str(tmp_path)}
    return lambda cmd: subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env,
                                      timeout=timeout).stdout.splitlines()


def test_simulated_nvidia_smi_faults_are_opt_in(tmp_path, monkeypatch):
    from nemofleet.facts import gpu

    run = _sim(tmp_path)
    assert NvidiaGpus().process(run(NvidiaGpus().command()))["gpus"][0]["memory_mib"] == 143771  # no fault: as before
    (tmp_path / "smi-fault").write_text("garbage\n")
    fact = NvidiaGpus().process(run(NvidiaGpus().command()))
    assert fact["error"].startswith("nvidia-smi printed '[Unknown Error]' for memory.total of GPU 0, which nemofleet cannot")
    assert NvidiaCudaVersion().process(run(NvidiaCudaVersion().command())) is None
    (tmp_path / "smi-fault").write_text("hang\n")
    monkeypatch.setattr(gpu, "SMI_TIMEOUT", 1)
    assert NvidiaGpus().process(run(NvidiaGpus().command()))["rc"] == 124


