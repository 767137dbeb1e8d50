"""The simulated NVML "Unknown Error" trap of the testbed: the toolkit hook decides from the kernel's
view of a container's cgroup (not from how the engine spells cgroupsPath) whether systemd manages
it, on cgroup v1 and v2; the generator revokes exactly the recorded grants at a daemon-reload and
logs what it did, for tests to wait on."""
import os
import runpy
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "testbed" / "src" / "nemofleet_testbed" / "sim"


def load(name):
    loader = SourceFileLoader(name.replace("-", "_"), str(SIM / name))
    mod = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


HOOK = load("nvidia-container-runtime-hook")
ID = "a777b9a92104eb8f73373d3b93e82b2736591978fe4d5bf527b9b84837752ccf"
V1_SYSTEMD = f"""12:devices:/docker/outer/system.slice/docker-{ID}.scope
9:name=systemd:/docker/outer/system.slice/docker-{ID}.scope
0::/docker/outer/system.slice/docker-{ID}.scope
"""
V1_CGROUPFS = f"5:devices:/docker/{ID}\n9:name=systemd:/docker/{ID}\n0::/docker/{ID}\n"
V2_SYSTEMD = f"0::/system.slice/docker-{ID}.scope\n"
V2_CGROUPFS = f"0::/docker/{ID}\n"


def test_systemd_scope_is_managed_on_cgroup_v1_and_v2():
    assert HOOK.managed_from(V1_SYSTEMD) == (True, f"devices cgroup /docker/outer/system.slice/docker-{ID}.scope")
    assert HOOK.managed_from(V2_SYSTEMD) == (True, f"unified cgroup /system.slice/docker-{ID}.scope")


def test_cgroupfs_driver_is_not_managed_whatever_the_spec_says():
    # the kernel's answer wins over the spec's spelling of cgroupsPath
    assert HOOK.managed_from(V1_CGROUPFS, f"system.slice:docker:{ID}")[0] is False
    assert HOOK.managed_from(V2_CGROUPFS, f"system.slice:docker:{ID}")[0] is False


def test_without_a_process_the_specs_systemd_form_decides():
    assert HOOK.managed_from("", f"system.slice:docker:{ID}") == (True, f"cgroupsPath system.slice:docker:{ID}")
    assert HOOK.managed_from("", f"/docker/{ID}")[0] is False


def test_generator_revokes_recorded_running_grants_and_logs_each_event(tmp_path):
    run = tmp_path / "run"
    legacy = run / "legacy"
    legacy.mkdir(parents=True)
    alive = tmp_path / "rootfs-a" / "etc" / "nemofleet-sim"
    alive.mkdir(parents=True)
    (legacy / "aaa").write_text(f"{alive}\n")
    (legacy / "bbb").write_text(f"{tmp_path / 'rootfs-gone' / 'etc' / 'nemofleet-sim'}\n")
    src = (SIM / "nemofleet-sim-nvml-trap").read_text().replace("/run/nemofleet-sim", str(run))
    script = tmp_path / "trap.py"
    script.write_text(src)
    runpy.run_path(str(script))
    assert (alive / "revoked").read_text() == "revoked by systemctl daemon-reload\n"
    assert os.listdir(legacy) == []
    assert (run / "trap.log").read_text().splitlines() == ["reload 2 legacy grant(s)", "revoke aaa", "gone bbb"]
    runpy.run_path(str(script))  # the next reload: nothing left to revoke, still logged
    assert (run / "trap.log").read_text().splitlines()[-1] == "reload 0 legacy grant(s)"


def test_outer_host_line():
    from nemofleet_testbed import describe_outer, parse_outer

    assert describe_outer(parse_outer("20.10.24+dfsg1|cgroupfs|1\n")) == "cgroup v1, Docker 20.10.24+dfsg1 (cgroupfs driver)"
    assert parse_outer("26.1.5|systemd|2") == {"cgroup": "v2", "engine": "26.1.5", "driver": "systemd"}
    assert parse_outer("19.03.15|cgroupfs|", "cgroup2fs")["cgroup"] == "v2"  # no CgroupVersion before 20.10
    assert parse_outer("", "tmpfs") == {"cgroup": "v1", "engine": "unknown", "driver": "unknown"}
