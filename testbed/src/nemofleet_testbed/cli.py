"""`nemofleet testbed ACTION`: nemofleet's command line parses the arguments and hands them here
when this package is installed (nemofleet.cli.cmd_testbed); without it, it says what to install."""
from __future__ import annotations

import shutil
import subprocess
import sys

# what building and starting the testbed runs (scripts/prereqs.sh checks these and more, and installs them)
TOOLS = ("docker", "debootstrap", "ssh", "ssh-keygen", "rsync", "dpkg-scanpackages", "gpg")


def engine_problem(timeout: float = 4.0) -> str | None:
    """One sentence when no Docker engine answers `docker info` (DOCKER_HOST as the client reads
    it) within `timeout` seconds, else None."""
    import os

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        r = subprocess.run(["docker", "info", "-f", "{{.ServerVersion}}"], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"the Docker engine at {where} did not answer `docker info` within {timeout:.0f} s; start it or fix DOCKER_HOST"
    if r.returncode == 0 and r.stdout.strip():
        return None
    return (f"no Docker engine answers at {where} (`docker info` failed); start it (`systemctl start docker`, "
            "or `sh scripts/prereqs.sh` as root) or fix DOCKER_HOST")


def run(a) -> int:
    """a: the parsed `nemofleet testbed` arguments (action, hosts, profile). Returns the exit code;
    a missing tool or a failed step is one sentence, never a traceback."""
    if a.action in ("up", "recreate"):
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            print(f"nemofleet: the testbed needs {', '.join(missing)}, not found on PATH: run `sh scripts/prereqs.sh` "
                  "(as root on Debian/Ubuntu it installs them) or `make demo`", file=sys.stderr)
            return 2
        why = engine_problem()
        if why:  # before any build: debootstrap alone takes a minute
            print(f"nemofleet: {why}", file=sys.stderr)
            return 2
    try:
        return _run(a)
    except ModuleNotFoundError as exc:
        if exc.name != "yaml":
            raise
        print("nemofleet: the testbed reads YAML profiles with pyyaml, a dependency of nemofleet-testbed that is "
              "missing here: `pip install pyyaml` (or `make venv`)", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd[:4]))
        print(f"nemofleet testbed {a.action}: `{cmd}` failed (exit {exc.returncode}); its output is above",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"nemofleet testbed {a.action}: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}",
              file=sys.stderr)
        return 1


def _run(a) -> int:
    import nemofleet_testbed as testbed

    if a.action == "up":
        testbed.up(a.profile, a.hosts or None, demo=a.demo)
    elif a.action == "down":
        testbed.down()
    elif a.action == "status":
        print(f"outer host: {testbed.describe_outer()}")  # what decides cgroup-dependent behaviour of the testbed
        for row in testbed.status():
            print(f"{row['host']:<12} 127.0.0.1:{row['port']:<6} {row['gpus']} GPU(s)  {row['group']:<10} {row['container']}")
    elif a.action == "recreate":
        for h in a.hosts:
            testbed.recreate(h)
    elif a.action == "gpu-fault":
        if len(a.hosts) != 3:
            print(f"nemofleet: usage: nemofleet testbed gpu-fault HOST GPU {'|'.join(testbed.GPU_FAULT_KINDS)}",
                  file=sys.stderr)
            return 2
        rc, line = testbed.gpu_fault(*a.hosts)
        print(line, file=sys.stderr if rc else sys.stdout)
        return rc
    return 0
