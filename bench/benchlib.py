"""What the bench scripts share: a testbed of their own, and each test host's own CPU.

    import benchlib
    benchlib.use_testbed("nf-fan", ".testbed-fan", 23901)   # before anything of nemofleet is imported
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def use_testbed(name: str, directory: str, port_base: int) -> None:
    """This script's testbed (names, state directory, ports: none shared with the e2e tests or
    another bench unless the environment says so), pyinfra without its progress spinner, and the
    checkout's sources on sys.path (nemofleet's and the testbed package's, testbed/src)."""
    os.environ.setdefault("NEMOFLEET_TESTBED_NAME", name)
    os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(ROOT / directory))
    os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", str(port_base))
    os.environ["PYINFRA_PROGRESS"] = "off"
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "testbed" / "src")]


def container_cpu(names: list[str]) -> dict[str, float]:
    """CPU seconds each container has used so far (its cgroup: every process of a test host, its
    sshd, shells, docker CLI, python and simulated GPU tools, and a full host's own dockerd;
    cgroup v1 cpuacct or v2 cpu.stat)."""
    ids = subprocess.run(["docker", "inspect", "-f", "{{.Name}} {{.Id}}", *names], capture_output=True,
                         text=True).stdout.split("\n")
    out = {}
    for line in ids:
        if not line.strip():
            continue
        name, cid = line.strip().lstrip("/").split()
        for path, scale_ in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                             (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6)):
            try:
                text = open(path).read()
            except OSError:
                continue
            value = int(text.split()[0]) if path.endswith("usage") else int(text.split()[1])  # usage_usec first
            out[name] = value * scale_
            break
    return out


def gpu_tools_cpu(host: str, reps: int = 10) -> float:
    """CPU seconds of the simulated GPU tools' share of one no-op (the GPU parts of HostFacts, run
    `reps` times on `host`), measured apart so that the per-host figure leaves them out."""
    import nemofleet_testbed as testbed
    from nemofleet.facts.gpu import ContainerToolkit, NvidiaCudaVersion, NvidiaGpus

    cmds = [f.command() if callable(f.command) else f.command for f in (NvidiaGpus(), NvidiaCudaVersion(),
                                                                        ContainerToolkit())]
    script = "for i in $(seq %d); do %s; done >/dev/null 2>&1" % (reps, "; ".join(f"( {c} )" for c in cmds))
    name = testbed.container(host)
    before = container_cpu([name]).get(name, 0.0)
    subprocess.run(["docker", "exec", name, "sh", "-c", script], capture_output=True)
    return (container_cpu([name]).get(name, 0.0) - before) / reps


def save_json(name: str, data) -> Path:
    """bench/results/NAME (indented JSON), the directory made when missing."""
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(data, indent=2))
    return out / name
