"""The NVML "Unknown Error" trap on h100-1, whose Docker starts with the systemd cgroup driver
(as Ubuntu 22.04+ installs it) and has no CDI (Docker 20.10): the simulated toolkit hook and a
systemd generator drop legacy GPU grants of systemd-managed containers at every daemon-reload."""
import json
import time

import pytest

from conftest import on, pyinfra

pytestmark = pytest.mark.e2e
HOST = "h100-1"
SENTENCE = "the GPU probe failed: a running container lost its GPU after systemctl daemon-reload"


def gpus_in(container: str) -> str:
    """What nvidia-smi -L prints inside the container. A docker exec that fails itself (the container
    between restarts) is retried for a few seconds; its error is kept so an assertion shows it."""
    for _ in range(10):
        r = on(HOST, f"docker exec {container} nvidia-smi -L", check=False)
        if r.stdout.strip():
            return r.stdout.strip()
        time.sleep(1)
    return f"(docker exec printed nothing: {r.stderr.strip()})"


def wait_running(container: str) -> None:
    on(HOST, f"for i in $(seq 60); do [ \"$(docker inspect -f '{{{{.State.Running}}}}' {container} 2>/dev/null)\" = true ] "
             "&& exit 0; sleep 1; done; exit 1")


def test_converge_applies_the_remedy_and_probes_it(converged):
    first, second = converged["first"], converged["second"]
    assert "NVML 'Unknown Error' trap" in first.out  # preflight said what it would do
    assert json.loads(on(HOST, "cat /etc/docker/daemon.json").stdout)["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    assert on(HOST, "docker info -f '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"
    assert any("GPU access survives" in op for op in first.changed())
    assert not any("GPU access survives" in op for op in second.changed())
    # a serving vLLM container keeps its GPU across daemon-reload
    before = gpus_in("nemotron-0")
    assert before.startswith("GPU 0: NVIDIA H100 80GB HBM3"), before
    on(HOST, "systemctl daemon-reload")
    assert gpus_in("nemotron-0") == before


def test_probe_fails_when_the_remedy_is_missing_and_the_main_job_repairs_it(converged):
    # drift: someone puts Docker back on the systemd cgroup driver
    on(HOST, "python3 - <<'EOF'\nimport json\np='/etc/docker/daemon.json'\nd=json.load(open(p))\n"
             "d['exec-opts']=['native.cgroupdriver=systemd']\njson.dump(d, open(p, 'w'))\nEOF\n"
             "systemctl restart docker")
    wait_running("nemotron-0")
    # the trap is live: a vLLM container loses its GPU at the next daemon-reload
    assert gpus_in("nemotron-0").startswith("GPU 0:")
    on(HOST, "systemctl daemon-reload")
    assert "Failed to initialize NVML: Unknown Error" in gpus_in("nemotron-0")
    probe = pyinfra("deploys/gpu_probe.py", hosts=[HOST])
    assert probe.rc == 1
    assert SENTENCE in probe.out and "Failed to initialize NVML: Unknown Error" in probe.out
    assert "set nvml_remedy: cgroupfs" in probe.out
    # the main job puts the remedy back, restarts Docker, probes again before the units start
    fixed = pyinfra(hosts=[HOST])
    assert fixed.rc == 0, fixed.out[-4000:]
    assert any("GPU access survives" in op for op in fixed.changed())
    assert on(HOST, "docker info -f '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"
    wait_running("nemotron-0")
    on(HOST, "systemctl daemon-reload")
    assert gpus_in("nemotron-0").startswith("GPU 0:")
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [], again.changed()
    assert pyinfra("deploys/gpu_probe.py", hosts=[HOST]).rc == 0
