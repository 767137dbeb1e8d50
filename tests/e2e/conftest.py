"""End-to-end fixtures: a testbed of its own (names, ports and state apart from `make demo`),
real pyinfra over real SSH on 127.0.0.1, and helpers to read results like Molecule does."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("NEMOFLEET_TESTBED_NAME", "nf-test")
os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(ROOT / ".testbed-test"))
os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", "22301")
os.environ["PYINFRA_PROGRESS"] = "off"

from nemofleet import testbed  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
ROW = re.compile(r"^\s{4}(\S.*?)\s{2,}(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0 and shutil.which("debootstrap") is not None


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.rows = []
        if "--> Results:" in self.out:
            for line in self.out.split("--> Results:", 1)[1].splitlines():
                m = ROW.match(line)
                if m and m.group(1) not in ("Operation", "Grand total"):
                    self.rows.append({"op": m.group(1), "hosts": int(m.group(2)), "success": m.group(3),
                                      "error": m.group(4), "nochange": m.group(5)})

    def changed(self) -> list[str]:
        """Operations that changed something (Molecule's idempotence check)."""
        return [r["op"] for r in self.rows if r["success"] != "-"]

    def errors(self) -> list[str]:
        return [r["op"] for r in self.rows if r["error"] != "-"]


def pyinfra(deploy="deploys/nemotron.py", hosts=(), data=None, extra=(), env=None, timeout=900, yes=True) -> Run:
    cmd = [PYINFRA, *(["-y"] if yes else []), "inventories/testbed.py", deploy, *extra]
    for k, v in (data or {}).items():
        cmd += ["--data", f"{k}={v}"]
    e = dict(os.environ)
    if hosts:
        e["NEMOFLEET_TESTBED_HOSTS"] = ",".join(hosts)
    e.update(env or {})
    return Run(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout,
                              stdin=subprocess.DEVNULL))


def on(host: str, script: str, check=True) -> subprocess.CompletedProcess:
    """Run a command inside a test host (for assertions only; deploys go over SSH)."""
    r = subprocess.run(["docker", "exec", testbed.container(host), "bash", "-c", script],
                       capture_output=True, text=True)
    if check and r.returncode:
        raise AssertionError(f"{host}: {script!r} failed: {r.stdout}{r.stderr}")
    return r


@pytest.fixture(scope="session")
def bed():
    if not docker_available():
        pytest.fail("the end-to-end tests need a running Docker engine and debootstrap (run .ci/run as root)")
    state = testbed.up()
    yield state
    if os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()


@pytest.fixture(scope="session")
def converged(bed):
    """The testbed after one converge (first run) and the idempotence run."""
    first = pyinfra()
    assert first.rc == 0, first.out[-6000:]
    second = pyinfra()
    return {"first": first, "second": second, "state": bed}


def mirror_log() -> list[str]:
    p = testbed.testbed_dir() / "hf" / "requests.log"
    return p.read_text().splitlines() if p.exists() else []


def clear_mirror_log() -> None:
    (testbed.testbed_dir() / "hf" / "requests.log").write_text("")


def optional_host(name: str):
    """A module-scoped fixture: the optional test host `name` (bare-1, cdi-1) is up for the
    module's tests and removed after them."""
    @pytest.fixture(scope="module")
    def host_up(bed):
        testbed.up(only=[name])
        yield name
        testbed.remove(name)
    return host_up


def served_alone(host: str):
    """A module fixture's body for a module that needs one converged host: brings up only that host
    when the module runs on its own (and takes the testbed down after, unless kept); in a full run
    the session's testbed already has it. Yields the host name."""
    if not docker_available():
        pytest.fail("the end-to-end tests need a running Docker engine and debootstrap (run .ci/run as root)")
    was_up = bool(testbed.read_state().get("hosts"))
    testbed.up(only=[host])
    r = pyinfra(hosts=[host])
    assert r.rc == 0, r.out[-6000:]
    yield host
    if not was_up and os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()
