"""The NVML "Unknown Error" trap on h100-1, whose Docker starts with the systemd cgroup driver
(as Ubuntu 22.04+ installs it) and has no CDI (Docker 20.10): the simulated toolkit hook and a
systemd generator drop legacy GPU grants of systemd-managed containers at every daemon-reload.

The trap is driven by events, never by time: the hook logs each grant (and whether the container's
device cgroup is a systemd scope) and the generator each reload and revocation in
/run/nemofleet-sim/trap.log; the test waits, bounded, on those lines for the container it probes
(by id, so a container replaced meanwhile is named, not mistaken for the one that lost its GPU)."""
import json

import pytest

from conftest import on, pyinfra, wait_for

pytestmark = pytest.mark.e2e
HOST = "h100-1"
SENTENCE = "the GPU probe failed: a running container lost its GPU after systemctl daemon-reload"
TRAP_LOG = "/run/nemofleet-sim/trap.log"


def gpus_in(container: str) -> str:
    """What nvidia-smi -L prints inside the container (name or id), or why docker exec printed nothing."""
    r = on(HOST, f"docker exec {container} nvidia-smi -L", check=False)
    return r.stdout.strip() or f"(docker exec printed nothing: {r.stderr.strip()})"


def trap_log() -> list[str]:
    return on(HOST, f"cat {TRAP_LOG} 2>/dev/null || true").stdout.splitlines()


def running_grant(name: str, managed: str, timeout: float = 120) -> str:
    """The id of the running container `name` once the hook has logged its legacy GPU grant with
    systemd-managed=`managed` (yes/no). Waits on that event, bounded; the failure says what was seen."""
    def probe():
        cid = on(HOST, f"docker inspect -f '{{{{if .State.Running}}}}{{{{.Id}}}}{{{{end}}}}' {name}",
                 check=False).stdout.strip()
        if not cid:
            return False, f"{name} not running"
        grants = [line for line in trap_log() if line.startswith(f"grant {cid} ")]
        if not grants:
            return False, f"{name} ({cid[:12]}) runs but the hook logged no grant for it"
        if f"systemd-managed={managed} " not in grants[-1]:
            return False, f"{name} ({cid[:12]}): {grants[-1]}"
        return True, cid
    return wait_for(f"{name} on {HOST} running with a legacy GPU grant logged as systemd-managed={managed}",
                    probe, timeout)


def reload_seen(before: int) -> list[str]:
    """daemon-reload, then the generator's lines of that reload (waited for, bounded)."""
    on(HOST, "systemctl daemon-reload")

    def probe():
        lines = trap_log()[before:]
        return any(x.startswith("reload ") for x in lines), lines or f"no new line in {TRAP_LOG}"
    return wait_for(f"the NVML trap generator to log the daemon-reload on {HOST}", probe, 30)


def test_converge_applies_the_remedy_and_probes_it(converged):
    first, second = converged["first"], converged["second"]
    assert "NVML 'Unknown Error' trap" in first.out  # preflight said what it would do
    assert json.loads(on(HOST, "cat /etc/docker/daemon.json").stdout)["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    assert on(HOST, "docker info -f '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"
    assert any("GPU access survives" in op for op in first.changed())
    assert not any("GPU access survives" in op for op in second.changed())
    # a serving vLLM container keeps its GPU across daemon-reload: the hook saw no systemd scope
    cid = running_grant("nemotron-0", "no")
    before = gpus_in(cid)
    assert before.startswith("GPU 0: NVIDIA H100 80GB HBM3"), before
    lines = reload_seen(len(trap_log()))
    assert not any(cid in line for line in lines), lines
    assert gpus_in(cid) == before


def test_probe_fails_when_the_remedy_is_missing_and_the_main_job_repairs_it(converged, changes):
    # drift: someone puts Docker back on the systemd cgroup driver
    on(HOST, "python3 - <<'EOF'\nimport json\np='/etc/docker/daemon.json'\nd=json.load(open(p))\n"
             "d['exec-opts']=['native.cgroupdriver=systemd']\njson.dump(d, open(p, 'w'))\nEOF\n"
             "systemctl restart docker")
    changes.made(HOST, "Docker put back on the systemd cgroup driver")
    assert on(HOST, "docker info -f '{{.CgroupDriver}}'").stdout.strip() == "systemd"
    # the trap is live: the vLLM container that the unit started again runs in a systemd scope
    cid = running_grant("nemotron-0", "yes")
    assert gpus_in(cid).startswith("GPU 0:")
    # and loses its GPU at the next daemon-reload
    lines = reload_seen(len(trap_log()))
    assert f"revoke {cid}" in lines, (f"the daemon-reload did not revoke the grant of nemotron-0 ({cid[:12]}): "
                                      f"{lines}")
    assert "Failed to initialize NVML: Unknown Error" in gpus_in(cid)
    probe = pyinfra("deploys/gpu_probe.py", hosts=[HOST])
    assert probe.rc == 1
    assert SENTENCE in probe.out and "Failed to initialize NVML: Unknown Error" in probe.out
    assert "set nvml_remedy: cgroupfs" in probe.out
    # the main job puts the remedy back, restarts Docker, probes again before the units start
    fixed = pyinfra(hosts=[HOST])
    assert fixed.rc == 0, fixed.out[-4000:]
    assert any("GPU access survives" in op for op in fixed.changed())
    assert on(HOST, "docker info -f '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"
    cid = running_grant("nemotron-0", "no")
    lines = reload_seen(len(trap_log()))
    assert not any(cid in line for line in lines), lines
    assert gpus_in(cid).startswith("GPU 0:")
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [], again.changed()
    assert pyinfra("deploys/gpu_probe.py", hosts=[HOST]).rc == 0
