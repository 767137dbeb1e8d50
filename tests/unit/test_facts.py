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




# --- what a host printed, read by one function each: the audit's forms (issue: hostile input, fourth pass)

H100_ROW = "0, GPU-bab4e095-173a-5610-3df3-6282798f662e, NVIDIA H100 80GB HBM3, 81559, 580.159.04, 9.0, 00000000:00:06.0, Disabled, Enabled"


def _rows(n):
    """n H100 rows as nvidia-smi prints them (the real capture's row, renumbered)."""
    return [H100_ROW.replace("0, GPU-bab4e095", f"{i}, GPU-bab4e09{i}", 1).replace(":06.0", f":{6 + i:02X}.0")
            for i in range(n)]


def _gpus_part(lines):
    from nemofleet.facts.host import read_part
    return read_part("gpus", NvidiaGpus(), lines)


def test_nvidia_smi_rows_that_cannot_be_planned_refuse_the_host_in_one_sentence():
    rows = _rows(8)
    value, why = _gpus_part(rows + ["RC=0"])
    assert why is None and len(value["gpus"]) == 8
    # two rows with the same UUID: two instances on one physical GPU
    dup = rows[:3] + [rows[3].replace("GPU-bab4e093", "GPU-bab4e091")] + rows[4:]
    value, why = _gpus_part(dup + ["RC=0"])
    assert why.endswith("gpus lists uuid GPU-bab4e091-173a-5610-3df3-6282798f662e twice (GPU 1 and GPU 3): two rows "
                        "of one GPU would plan two instances on it; run nvidia-smi -L on the host") and not value["gpus"]
    # [Unknown Error] in the MIG field is no "MIG off"
    value, why = _gpus_part(rows[:5] + [rows[5].replace("Disabled", "[Unknown Error]")] + rows[6:] + ["RC=0"])
    assert why == ("nvidia-smi printed '[Unknown Error]' for mig.mode.current of GPU 5, which nemofleet cannot read; "
                   "run nvidia-smi -q on the host") and not value["gpus"]
    # one bad row among eight is quoted as its own GPU's row, not GPU 0's
    value, why = _gpus_part(rows[:6] + [rows[6].replace("81559", "[Unknown Error]")] + rows[7:] + ["RC=0"])
    assert "for memory.total of GPU 6," in why
    value, why = _gpus_part(rows[:6] + [rows[6] + ", extra"] + rows[7:] + ["RC=0"])
    assert why.startswith("nvidia-smi printed a row of 10 fields, not 9, for GPU 6: '6, GPU-bab4e096")
    # numbers nvidia-smi never prints: a value past any float, non-ASCII digits; RC= that is no exit status
    for memory in ("1e309", "٨١٥٥٩", "inf", "9" * 5000):
        value, why = _gpus_part([H100_ROW.replace("81559", memory), "RC=0"])
        assert why and "for memory.total of GPU 0" in why and not value["gpus"], memory
    for rc in ("RC=٣", "RC=²", "RC=1e309"):
        assert _gpus_part([H100_ROW, rc])[1].startswith("nvidia-smi printed a row of 1 fields"), rc


def test_a_discrete_gpu_without_memory_total_is_never_sized_from_host_memory():
    row = H100_ROW.replace("81559", "[N/A]")
    value, why = _gpus_part(["MEMTOTAL_KB=131961972", row, "RC=0"])
    assert why == ("nvidia-smi reports no memory.total ([N/A]) for GPU 0 (NVIDIA H100 80GB HBM3), which is not a "
                   "unified-memory board (GB10, Jetson Thor) that shares the system memory; run nvidia-smi -q -d "
                   "MEMORY on the host") and not value["gpus"]
    # the GB10 (DGX Spark) is sized from MemTotal, as before; a facts file cannot mark an H100 unified
    gb10 = (H200.parent / "gb10" / "nvidia_gpus.out").read_text().splitlines()
    assert _gpus_part(gb10)[0]["gpus"][0]["unified"] is True
    from nemofleet import factmodel
    facts = {"gpus": {"smi": True, "rc": 0, "driver": "580.159.04", "gpus": [
        {"index": 0, "uuid": "GPU-bab4e095-173a-5610-3df3-6282798f662e", "name": "NVIDIA H100 80GB HBM3",
         "memory_mib": 128869, "unified": True, "mig": "Disabled"}]}}
    assert "gpus marks GPU 0 ('NVIDIA H100 80GB HBM3') as unified memory" in factmodel.parse(facts)[1][0]
    facts["gpus"]["gpus"][0].update(unified=False, mig="[Unknown Error]")
    assert "is not a MIG mode (Enabled, Disabled or N/A)" in factmodel.parse(facts)[1][0]


def test_health_lines_of_non_ascii_digits_or_beyond_a_clock_are_no_values():
    from nemofleet.facts.gpuhealth import GpuHealth

    for btime in ("BTIME=٣", "BTIME=²", f"BTIME={2**40}", "BTIME=1e9", "BTIME=-1"):
        assert GpuHealth().parse(["RC=0", btime])["boot_time"] is None, btime
    out = GpuHealth().parse(["RC=٣", "RESET:00000000:07:00.0 ١٧٠٠٠٠٠٠٠٠", "RESET:zz 1700000000",
                             "DRAINED:not-a-uuid 1700000000 0 x", "XID:[ 1e309] NVRM: Xid (PCI:0000:07:00): 79, x",
                             "XID:[ 12.5] NVRM: Xid (PCI:0000:07:00): ٧٩, x"])
    assert out["resets"] == {} and out["drained"] == {} and out["xids"] == [] and out["error"] is None


def test_daemon_json_that_dockerd_would_refuse_is_refused_never_overwritten(tmp_path):
    """The real command against a directory, NaN, the fact's own absent marker as the file's text,
    and keys nemofleet merges of another JSON type: each is `data` None with the reason, which the
    decision refuses ("leaves it untouched") and the merge never reads."""
    import subprocess

    from nemofleet import desired, inputs
    from test_preflight import DATA, ready

    path = tmp_path / "daemon.json"
    cases = {"a directory": None, "NaN": '{"log-opts": {"max-size": NaN}}', "the marker": "##NEMOFLEET_ABSENT##",
             "features a string": '{"features": "cdi"}', "runtimes a list": '{"runtimes": ["nvidia"]}',
             "a number past any float": '{"bip": 1e309}'}
    for label, text in cases.items():
        if text is None:
            path.mkdir()
        else:
            path.write_text(text)
        out = subprocess.run(["sh", "-c", DaemonJson().command(path=str(path))], capture_output=True, text=True)
        fact = DaemonJson().process(out.stdout.splitlines())
        assert fact["exists"] and fact["data"] is None and fact["error"], (label, fact)
        f = dict(ready(), daemon_json=fact)
        said = desired.decide(inputs.make("h", DATA, f, inputs.read_secrets(DATA))).refusals
        assert any(r.startswith("/etc/docker/daemon.json is ") and "leaves it untouched" in r for r in said), (label, said)
        path.rmdir() if text is None else path.unlink()
    out = subprocess.run(["sh", "-c", DaemonJson().command(path=str(path))], capture_output=True, text=True)
    assert DaemonJson().process(out.stdout.splitlines()) == {"exists": False, "text": "", "data": {}, "error": None}


def test_a_hub_answer_that_is_no_object_is_an_error_sentence():
    from nemofleet.facts.weights import HubCommit, parse_hub_commits

    for last in ("null", "[]", '"x"', "1e309", "NaN", '{"sha": null}', '{"error": "a\\nb"}'):
        got = HubCommit().process(["noise", last])
        assert set(got) == {"error"} and "\n" not in got["error"], (last, got)
    assert HubCommit().process(['{"sha": "' + "a" * 40 + '"}']) == {"sha": "a" * 40}
    items = [("https://huggingface.co", "nvidia/x", "main")]
    assert parse_hub_commits(items, ["hub_commit ٠", '{"sha": "' + "b" * 40 + '"}']) == {items[0]: {
        "error": "no answer from the Hub query"}}


def test_a_fact_cannot_replace_the_total_reader():
    """facts.Fact.process is the one wrapper: a fact that defines its own is refused when it is
    defined, and one whose parse() fails in a way it did not foresee fails that host alone."""
    import pytest
    from pyinfra.api.exceptions import FactProcessError

    from nemofleet.facts import Fact

    with pytest.raises(TypeError, match="defines process"):
        type("Own", (Fact,), {"command": "true", "process": lambda self, output: output})

    class Boom(Fact):
        command = "true"

        def parse(self, output):
            return int(output[0])  # no host_number: '²' raises ValueError

    with pytest.raises(FactProcessError, match=r"the Boom check printed output nemofleet cannot read \(ValueError; "
                                               r"first line '²'\)"):
        Boom().process(["²"])
    assert Boom().process(["7"]) == 7 and Boom().process([]) is None
