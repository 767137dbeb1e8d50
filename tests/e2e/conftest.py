"""End-to-end fixtures: a testbed of its own (names, ports and state apart from `make demo`),
real pyinfra over real SSH on 127.0.0.1, and helpers to read results like Molecule does."""
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("NEMOFLEET_TESTBED_NAME", "nf-test")
os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(ROOT / ".testbed-test"))
os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", "22301")
os.environ["PYINFRA_PROGRESS"] = "off"

import nemofleet_testbed as testbed  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
# NEMOFLEET_TEST_FORCE_FAIL=<part of a test id>: that test fails right after it changed a testbed host
# (at its first HostChanges.made), to check that its finalizer restores the host and the next test
# is green. For that check only.
FORCE_FAIL = os.environ.get("NEMOFLEET_TEST_FORCE_FAIL", "")
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


def wait_for(what: str, probe, timeout: float, every: float = 1.0):
    """Wait, bounded, for a condition a test can observe. `probe()` returns (True, value) once the
    condition has come (wait_for returns value), else (False, what it saw). On timeout the failure
    names the condition that did not come and the last thing seen, never just "timed out"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, got = probe()
        except AssertionError as e:  # an on(...) that failed: keep waiting, remember why
            done, got = False, str(e)
        if done:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}; it did not come (last seen: {got}) "
                                 f"[testbed on {testbed.describe_outer()}]")
        time.sleep(every)


class ForcedFailure(AssertionError):
    pass


class HostChanges:
    """What a test changed on testbed hosts, restored in its finalizer whether it passed or not:
    `undo` callables run always (last registered first); the hosts of `made` are converged again
    when the test did not pass (a passing test has asserted its own way back)."""

    def __init__(self, nodeid: str):
        self.nodeid, self.hosts, self.undos = nodeid, [], []

    def made(self, host: str, what: str) -> None:
        """Call right after changing `host`: registers it for re-convergence, and is the point where
        NEMOFLEET_TEST_FORCE_FAIL makes the chosen test fail."""
        if host not in self.hosts:
            self.hosts.append(host)
        if FORCE_FAIL and FORCE_FAIL in self.nodeid:
            raise ForcedFailure(f"NEMOFLEET_TEST_FORCE_FAIL={FORCE_FAIL}: forced to fail right after {what} on {host}")

    def undo(self, fn) -> None:
        self.undos.append(fn)

    def restore(self, passed: bool) -> None:
        problems = []
        for fn in reversed(self.undos):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - every undo runs; the failures are reported together
                problems.append(f"undo {getattr(fn, '__name__', fn)}: {e}")
        if self.hosts and not passed:
            r = pyinfra(hosts=self.hosts)
            if r.rc != 0:
                problems.append(f"re-converging {', '.join(self.hosts)} failed: {r.out[-3000:]}")
            elif pyinfra(hosts=self.hosts).changed():
                problems.append(f"{', '.join(self.hosts)} still change on a second run after re-converging")
        if problems:
            raise AssertionError(f"{self.nodeid} could not restore the testbed: " + "; ".join(problems))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, "rep_" + rep.when, rep)  # lets a finalizer know whether its test passed
    return rep


@pytest.fixture
def changes(request):
    """HostChanges of this test (see there)."""
    c = HostChanges(request.node.nodeid)
    yield c
    rep = getattr(request.node, "rep_call", None)
    c.restore(passed=bool(rep and rep.passed))


class Progress:
    """`make test` prints a line per stage (unit, images, testbed up, converge, each e2e module) with
    its seconds and the time since the run began."""

    def __init__(self, config):
        self.config, self.t0, self.stage, self.since, self.counts = config, time.monotonic(), None, None, {}

    def line(self, text: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        msg = f"[make test] {text} (at {time.monotonic() - self.t0:.0f} s)"
        if tr is None:
            print(msg, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if tr._tw.width_of_current_line:  # after a row of progress dots
                tr._tw.line()
            tr.write_line(msg)
            tr._tw.flush()

    def _close(self) -> None:
        if self.stage is not None:
            counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items())) or "nothing ran"
            self.line(f"{self.stage}: {counts} in {time.monotonic() - self.since:.1f} s")

    def pytest_runtest_logstart(self, nodeid, location):
        path = nodeid.split("::", 1)[0]
        stage = "unit" if path.startswith("tests/unit/") else path
        if stage != self.stage:
            self._close()
            self.stage, self.since, self.counts = stage, time.monotonic(), {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            key = "errors" if report.when != "call" and report.failed else report.outcome
            self.counts[key] = self.counts.get(key, 0) + 1

    def pytest_sessionfinish(self):
        self._close()
        self.stage = None


PROGRESS: Progress | None = None


def pytest_configure(config):
    global PROGRESS
    PROGRESS = Progress(config)
    config.pluginmanager.register(PROGRESS, "nemofleet-progress")


def stage(text: str) -> None:
    if PROGRESS is not None:
        PROGRESS.line(text)


@pytest.fixture(scope="session")
def bed():
    if not docker_available():
        pytest.fail("the end-to-end tests need a running Docker engine and debootstrap (run .ci/run as root)")
    t = time.monotonic()
    state = testbed.up()
    took = time.monotonic() - t
    stage(f"images (built or cached): {state.get('build_seconds', 0):.1f} s")
    stage(f"testbed up on {testbed.describe_outer(state.get('outer'))}: "
          f"{took - state.get('build_seconds', 0):.1f} s")
    yield state
    if os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()


@pytest.fixture(scope="session")
def converged(bed):
    """The testbed after one converge (first run) and the idempotence run."""
    t = time.monotonic()
    before = len(mirror_log())
    first = pyinfra()
    assert first.rc == 0, first.out[-6000:]
    took = time.monotonic() - t
    first_requests = mirror_log()[before:]  # what the mirror served the first converge
    second = pyinfra()
    stage(f"converge: first run {took:.1f} s, idempotence run {time.monotonic() - t - took:.1f} s")
    return {"first": first, "second": second, "state": bed, "first_requests": first_requests}


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
