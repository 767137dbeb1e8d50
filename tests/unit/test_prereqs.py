"""scripts/prereqs.sh, the check that `make demo`, `make test` and `.ci/run` run first, against
stub commands on PATH: what it detects, what it installs (as root on Debian: one apt-get update,
one apt-get install of what is missing), how it starts the engine (systemctl where systemd is
PID 1, else dockerd in the background with its log named), and the one sentence per missing
prerequisite, with its fix, everywhere else. Nothing here installs or starts anything real."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "prereqs.sh"

# the commands each Debian package brings (what the script tests for)
PACKAGES = {
    "docker.io": ["docker", "dockerd"], "debootstrap": ["debootstrap"], "openssh-client": ["ssh", "ssh-keygen"],
    "rsync": ["rsync"], "iptables": ["iptables"], "python3": ["python3"], "dpkg-dev": ["dpkg-scanpackages"],
    "gnupg": ["gpg", "gpgconf"], "curl": ["curl"], "make": ["make"], "systemd": ["systemd-analyze", "systemctl"],
}
REAL = ["id", "cat", "grep", "sleep", "tail"]  # what the script itself uses

DOCKER = """#!/bin/sh
echo "docker $*" >> "$STATE/calls"
[ -e "$STATE/engine" ] && { echo 20.10.24; exit 0; }
[ -e "$STATE/denied" ] && { echo "permission denied while trying to connect" >&2; exit 1; }
echo "Cannot connect to the Docker daemon" >&2; exit 1
"""
DOCKERD = """#!/bin/sh
echo "dockerd $*" >> "$STATE/calls"
[ -e "$STATE/engine-starts" ] && touch "$STATE/engine"
echo "dockerd log line"
"""
SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$STATE/calls"
[ -e "$STATE/engine-starts" ] && touch "$STATE/engine"
exit 0
"""
# python3 with venv unless $STATE/no-venv
PYTHON3 = """#!/bin/sh
case "$*" in *ensurepip*) [ -e "$STATE/no-venv" ] && exit 1 ;; esac
exit 0
"""
APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$STATE/calls"
[ "$1" = update ] && exit 0
for p in "$@"; do
  case "$p" in -*|install) continue ;; esac
  case "$p" in python3-venv) rm -f "$STATE/no-venv"; continue ;; esac
  for c in $(grep "^$p " "$STATE/packages" | cut -d' ' -f2-); do
    if [ -e "$STATE/stubs/$c" ]; then cp "$STATE/stubs/$c" "$BIN/$c"; else printf '#!/bin/sh\\nexit 0\\n' > "$BIN/$c"; fi
    chmod +x "$BIN/$c"
  done
done
"""


class Machine:
    """A stub machine: a bin directory that is all of PATH, and a state directory."""

    def __init__(self, tmp: Path):
        self.bin = tmp / "bin"
        self.state = tmp / "state"
        self.bin.mkdir()
        self.state.mkdir()
        for c in REAL + ["cut", "chmod", "rm", "touch", "cp"]:  # and what the stubs use
            os.symlink(shutil.which(c), self.bin / c)
        (self.state / "packages").write_text("".join(f"{p} {' '.join(cs)}\n" for p, cs in PACKAGES.items()))
        (tmp / "ca.crt").write_text("cert\n")
        (tmp / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
        self.tmp = tmp
        self.env = {"PATH": str(self.bin), "STATE": str(self.state), "BIN": str(self.bin),
                    "NEMOFLEET_PREREQS_UID": "0", "NEMOFLEET_PREREQS_PID1": "sh",
                    "NEMOFLEET_PREREQS_OS_RELEASE": str(tmp / "os-release"),
                    "NEMOFLEET_PREREQS_CA": str(tmp / "ca.crt"),
                    "NEMOFLEET_PREREQS_DOCKERD_LOG": str(tmp / "dockerd.log"), "NEMOFLEET_PREREQS_WAIT": "3"}
        self.install(*PACKAGES)
        self.stub("apt-get", APT_GET)

    def stub(self, name: str, text: str = "#!/bin/sh\nexit 0\n") -> None:
        (self.state / "stubs").mkdir(exist_ok=True)
        (self.state / "stubs" / name).write_text(text)  # what apt-get "installs" again after a remove
        (self.bin / name).write_text(text)
        (self.bin / name).chmod(0o755)

    def install(self, *packages: str) -> None:
        special = {"docker": DOCKER, "dockerd": DOCKERD, "systemctl": SYSTEMCTL, "python3": PYTHON3}
        for p in packages:
            for c in PACKAGES[p]:
                self.stub(c, special.get(c, "#!/bin/sh\nexit 0\n"))

    def remove(self, *commands: str) -> None:
        for c in commands:
            (self.bin / c).unlink()

    def flag(self, *names: str) -> None:
        for n in names:
            (self.state / n).touch()

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(SCRIPT), *args], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=30)

    def calls(self) -> list[str]:
        p = self.state / "calls"
        return p.read_text().splitlines() if p.exists() else []


@pytest.fixture
def m(tmp_path):
    return Machine(tmp_path)


def sentences(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.strip()]


def test_all_present_and_engine_answering(m):
    m.flag("engine")
    r = m.run()
    assert r.returncode == 0, r.stderr
    assert "prereqs: all present; Docker engine 20.10.24 answering" in r.stdout
    assert not [c for c in m.calls() if c.startswith(("apt-get", "dockerd", "systemctl"))]


def test_not_root_one_sentence_per_missing_prerequisite_with_its_fix(m):
    m.remove("debootstrap", "rsync")
    m.flag("no-venv")
    r = m.run(NEMOFLEET_PREREQS_UID="1000")
    assert r.returncode == 1
    lines = sentences(r)
    assert "prereqs: debootstrap (builds the testbed images) is missing: install it with " \
           "`sudo apt-get install -y debootstrap`." in lines
    assert "prereqs: rsync is missing: install it with `sudo apt-get install -y rsync`." in lines
    assert "prereqs: python3 venv and pip (python3-venv) is missing: install it with " \
           "`sudo apt-get install -y python3-venv`." in lines
    assert any("needs root" in s for s in lines)
    assert any("Docker engine is not answering" in s and "dockerd >" in s for s in lines)
    assert not m.calls() or all(c.startswith("docker ") for c in m.calls())  # nothing installed or started
    assert "Traceback" not in r.stderr


def test_root_on_debian_installs_what_is_missing_once_and_starts_dockerd(m):
    m.remove("debootstrap", "rsync", "gpg", "gpgconf", "docker", "dockerd")
    m.flag("no-venv", "engine-starts")
    r = m.run()
    assert r.returncode == 0, r.stdout + r.stderr
    calls = m.calls()
    apt = [c for c in calls if c.startswith("apt-get")]
    assert apt[0] == "apt-get update -q" and len(apt) == 2
    assert apt[1].startswith("apt-get install -y -q --no-install-recommends ")
    assert set(apt[1].split()[5:]) == {"docker.io", "debootstrap", "rsync", "python3-venv", "gnupg"}
    assert any(c.startswith("dockerd") for c in calls)
    assert not any(c.startswith("systemctl") for c in calls)
    assert f"starting dockerd in the background (log: {m.tmp / 'dockerd.log'})" in r.stdout
    assert "all present" in r.stdout


def test_a_docker_client_without_its_engine_installs_the_engine(m):
    """Seen on this project's own machine image: a static docker CLI in /usr/local/bin and no dockerd.
    The client alone is not the engine: docker.io is installed, then dockerd started."""
    m.remove("dockerd")
    m.flag("engine-starts")
    r = m.run()
    assert r.returncode == 0, r.stdout + r.stderr
    apt = [c for c in m.calls() if c.startswith("apt-get install")]
    assert len(apt) == 1 and apt[0].split()[5:] == ["docker.io"]
    assert any(c.startswith("dockerd") for c in m.calls())


def test_systemd_as_pid1_starts_the_engine_with_systemctl(m):
    m.flag("engine-starts")
    r = m.run(NEMOFLEET_PREREQS_PID1="systemd")
    assert r.returncode == 0, r.stderr
    assert "systemctl start docker" in m.calls()
    assert not any(c.startswith(("dockerd", "apt-get")) for c in m.calls())


def test_an_engine_that_never_answers_is_one_sentence_naming_its_log_within_the_bound(m):
    r = m.run(NEMOFLEET_PREREQS_WAIT="2")
    assert r.returncode == 1
    assert (f"prereqs: the Docker engine did not answer `docker info` within 2 s of being started: its log is "
            f"in {m.tmp / 'dockerd.log'}.") in r.stderr
    assert "dockerd log line" in r.stderr  # its last lines, to see why


def test_check_only_changes_nothing_even_as_root(m):
    m.remove("debootstrap")
    r = m.run("--check")
    assert r.returncode == 1
    assert "install it with `apt-get install -y debootstrap`." in r.stderr
    assert "start it with `dockerd >" in r.stderr
    assert not any(c.startswith(("apt-get", "dockerd", "systemctl")) for c in m.calls())


def test_elsewhere_than_debian_names_the_package_and_installs_nothing(m):
    (m.tmp / "os-release").write_text("ID=fedora\n")
    m.remove("iptables")
    m.flag("engine")
    r = m.run()
    assert r.returncode == 1
    assert sentences(r) == ["prereqs: iptables is missing: install it with your system's package manager "
                            "(Debian's package: iptables)."]
    assert not any(c.startswith("apt-get") for c in m.calls())


def test_ubuntu_counts_as_debian(m):
    (m.tmp / "os-release").write_text("ID=ubuntu\nID_LIKE=debian\n")
    m.remove("curl")
    m.flag("engine")
    r = m.run()
    assert r.returncode == 0, r.stderr
    assert any(c.endswith("--no-install-recommends curl") for c in m.calls())


def test_engine_refusing_this_user(m):
    m.flag("denied")
    r = m.run(NEMOFLEET_PREREQS_UID="1000")
    assert r.returncode == 1
    assert any("permission denied on its socket" in s for s in sentences(r))


def test_unknown_option(m):
    r = m.run("--frobnicate")
    assert r.returncode == 2
    assert sentences(r) == ["prereqs: unknown option '--frobnicate': use no option (check and install) or "
                            "--check (check only)"]


def test_make_demo_make_test_and_ci_run_all_use_it():
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/prereqs.sh" in ci and "apt-get install" not in ci
    rule = {line.split(":")[0]: line for line in makefile.splitlines() if ":" in line and not line.startswith("\t")}
    assert "prereqs" in rule["demo"].split(":", 1)[1] or "prereqs" in rule["testbed"].split(":", 1)[1]
    assert "prereqs" in rule["test"].split(":", 1)[1]
    assert "sh scripts/prereqs.sh" in makefile


def test_the_engine_started_in_the_background_inherits_no_descriptor_of_the_caller(m, tmp_path):
    """`flock /tmp/testbed.lock .ci/run` started dockerd with the lock's descriptor open, so the lock
    stayed held for as long as the engine ran (2026-12-07: the next testbed user waited 38 min). The
    engine gets stdin from /dev/null and descriptors 3 to 9 closed."""
    m.stub("dockerd", DOCKERD + 'for fd in 0 3 4 5 6 7 8 9; do [ -e "/proc/$$/fd/$fd" ] && '
                                'readlink "/proc/$$/fd/$fd" >> "$STATE/open"; done; true\n')
    m.stub("readlink", f"#!/bin/sh\nexec {shutil.which('readlink')} \"$@\"\n")
    m.flag("engine-starts")
    lock = tmp_path / "held.lock"
    with open(lock, "w") as held:  # as flock(1) holds it: a low descriptor, open in the command it runs
        r = subprocess.run(["/bin/sh", str(SCRIPT)], env=m.env, capture_output=True, text=True, timeout=30,
                           pass_fds=(5,), preexec_fn=lambda: os.dup2(held.fileno(), 5))
    assert r.returncode == 0, r.stdout + r.stderr
    opened = (m.state / "open").read_text() if (m.state / "open").exists() else ""
    assert str(lock) not in opened and "/dev/null" in opened, opened
