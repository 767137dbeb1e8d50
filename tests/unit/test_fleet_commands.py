"""The fleet's remote commands: exact argument lists (golden), and the lock, audit, rollback and
GPU-return programs run as a host runs them (the command line under bash) against a temporary
state directory, to prove they work."""
import calendar
import os
import shlex
import stat
import subprocess
import time

import pytest

from nemofleet import paths, remote, shell
from nemofleet import hostcmd as commands
from nemofleet.lock import info as lockinfo
from nemofleet.hostcmd import token_digest

T1 = token_digest("t1")


# ---------------------------------------------------------------------------- golden argument lists

def words(cmd: str, program: str) -> list[str]:
    """The arguments a command gives its remote program (each command is one argument list:
    `python3 -I -S -c <the program's file> ARGS`, joined by shell.join)."""
    w = shlex.split(cmd)
    assert w[:4] == ["python3", "-I", "-S", "-c"] and w[4] == remote.source(program), cmd[:80]
    assert cmd == shell.join(w)  # every word quoted by the one boundary, nothing else in the line
    return w[5:]


def test_audit_line_golden():
    assert words(commands.audit_command("alice@ctl", "rollout", "a -> b: ok"), "release") == [
        "audit", "/var/lib/nemofleet/audit.log", "alice@ctl", "rollout", "a -> b: ok"]


def test_audit_detail_cannot_forge_a_line_or_run_a_command():
    cmd = commands.audit_command("bob", "rollout", "x\n2026-01-01T00:00:00Z root release $(reboot) 'q'")
    assert words(cmd, "release")[-1] == "x 2026-01-01T00:00:00Z root release $(reboot) 'q'"  # one line, one word
    assert "'\"'\"'q'\"'\"'" in cmd  # single-quoted through


def test_gate_golden():
    assert commands.gate() == ("FAIL_RESTART=0 timeout 180 flock -w 60 /run/lock/nemofleet-health.lock "
                               "/usr/local/bin/nemofleet-health")


def test_release_read_golden():
    assert words(commands.release_read(), "release") == [
        "read", "/var/lib/nemofleet/release", "/etc/systemd/system", "nemofleet-vllm-"]


def test_keep_previous_golden():
    assert words(commands.keep_previous(), "release") == [
        "keep", "/var/lib/nemofleet/release", "/etc/systemd/system", "nemofleet-vllm-", "/var/lib/nemofleet/previous"]


def test_lock_status_golden():
    """The program runs only when something is at the lock's path (the facts of every deploy read
    it: no python start on a host without a lock)."""
    cmd = commands.lock_status()
    head = "if [ -e /var/lib/nemofleet/lock ] || [ -L /var/lib/nemofleet/lock ]; then "
    tail = "; else echo state=FREE; echo now=$(date +%s); fi"
    assert cmd.startswith(head) and cmd.endswith(tail)
    assert words(cmd[len(head):-len(tail)], "lock") == ["/var/lib/nemofleet/lock", "status"]


def test_lock_release_golden():
    assert words(commands.lock_release("t1"), "lock") == ["/var/lib/nemofleet/lock", "release", T1]
    assert words(commands.lock_release(None, force=True), "lock") == ["/var/lib/nemofleet/lock", "release", "-", "force"]


def test_lock_acquire_golden():
    cmd = commands.lock_acquire("alice@ctl", "t1", 7200, "drain")
    assert words(cmd, "lock") == ["/var/lib/nemofleet/lock", "acquire", "alice@ctl", T1, "7200", "drain"]
    assert "t1" not in words(cmd, "lock")  # only the token's SHA-256 reaches the host


def test_lock_refresh_golden():
    assert words(commands.lock_refresh("t1", 900), "lock") == ["/var/lib/nemofleet/lock", "refresh", T1, "900"]


def test_status_uses_the_hosts_own_paths():
    cmd = commands.status("/data/models", "/srv/prom")
    assert cmd.startswith("timeout 150 python3 -I -S -c ") and cmd.endswith("\n")
    w = shlex.split(cmd)[2:]
    assert w[:4] == ["python3", "-I", "-S", "-c"] and w[4] == remote.source("host_status")
    assert w[5:] == ["/var/lib/nemofleet/release", "/etc/systemd/system", "nemofleet-vllm-", "/srv/prom/nemofleet.prom",
                     "/var/lib/nemofleet/health", "/data/models", ".nemofleet-complete", "/var/lib/nemofleet/audit.log"]
    assert "/srv/nemofleet/models" not in cmd and "/var/lib/prometheus" not in cmd
    w = shlex.split(commands.status("/data/my models/", "/p"))
    assert w[7 + 5] == "/data/my models" and w[7 + 3] == "/p/nemofleet.prom"  # one word, one trailing slash less


def test_rollback_with_expect_guards_the_kept_release():
    assert words(commands.rollback("abc123def456"), "release") == [
        "rollback", "/var/lib/nemofleet/release", "/etc/systemd/system", "nemofleet-vllm-", "/var/lib/nemofleet/previous",
        "/usr/local/bin/nemofleet-drain", "/run/lock/nemofleet-health.lock", "abc123def456", "60"]
    assert words(commands.rollback(), "release")[7] == ""  # no expected release: any kept one


def test_gpu_returns_golden():
    cmd, = commands.gpu_returns({"GPU-x": ["nemotron-3", "nemotron-4"]}, True)
    w = shlex.split(cmd)
    assert w[:4] == ["flock", "-w", "900", "/run/lock/nemofleet-health.lock"]
    assert w[4:8] == ["python3", "-I", "-S", "-c"] and w[8] == remote.source("gpu_return")
    assert w[9:] == ["/var/lib/nemofleet/health", "/usr/local/bin/nemofleet-drain", "1", "GPU-x", "nemotron-3", "nemotron-4"]
    assert shlex.split(commands.gpu_returns({"GPU-x": ["a"]}, False)[0])[11] == "0"


# ---------------------------------------------------------------------------- scripts under bash

def sandbox_paths(monkeypatch, tmp_path):
    """Point every host path the commands name into tmp_path (hostcmd reads `paths` when it builds
    a command, and every path reaches the program as an argument)."""
    state, units = tmp_path / "state", tmp_path / "units"
    for name, value in {"STATE_DIR": state, "LOCK": state / "lock", "RELEASE": state / "release",
                        "PREVIOUS": state / "previous", "AUDIT_LOG": state / "audit.log",
                        "HEALTH_STATE": state / "health", "UNIT_DIR": units,
                        "UNIT_GLOB": f"{units}/{paths.UNIT_PREFIX}*.service",
                        "DRAIN_SCRIPT": tmp_path / "bin" / "nemofleet-drain",
                        "HEALTH_LOCK": tmp_path / "health.lock"}.items():
        monkeypatch.setattr(paths, name, str(value))
    return state, units


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Run a command with the state and unit dirs under tmp_path and fake systemctl (and, when a
    test writes one, a fake drain script), in tmp_path as the working directory."""
    state, units = sandbox_paths(monkeypatch, tmp_path)
    bindir = tmp_path / "bin"
    for d in (state, units, bindir):
        d.mkdir()
    log = tmp_path / "systemctl.log"
    fake = bindir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)

    def run(script: str, check_rc: int | None = 0) -> dict:
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30, cwd=tmp_path)
        assert "Traceback" not in p.stderr, p.stderr
        if check_rc is not None:
            assert p.returncode == check_rc, p.stdout + p.stderr
        out = lockinfo.parse(p.stdout.splitlines())
        out["_stdout"], out["_stderr"] = p.stdout, p.stderr
        return out

    run.state, run.units, run.log, run.bin, run.tmp = state, units, log, bindir, tmp_path
    return run


def test_acquire_twice_is_held_by_the_first(sandbox):
    assert sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, "drain"))["state"] == "ACQUIRED"
    second = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert second["state"] == "HELD" and second["holder"] == "alice@ctl" and second["message"] == "drain"
    assert second["token_sha256"] == T1 and "=t1\n" not in (sandbox.state / "lock/info").read_text()  # only its hash
    # the first holder's expiry, unmoved by the second acquire: its own acquire time (since) + 7200 s,
    # read from what the host wrote rather than from the clock (a loaded machine took 3 s between the two)
    since = calendar.timegm(time.strptime(second["since"], "%Y-%m-%dT%H:%M:%SZ"))
    assert second["expires"] == since + 7200 and second["now"] >= since
    assert lockinfo.describe(lockinfo.holder_info(second)).startswith("alice@ctl since 20")


def test_acquire_with_the_holders_token_is_owned(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, ""))
    assert sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, ""))["state"] == "OWNED"


def test_release_by_a_non_holder_is_refused(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, "drain"))
    out = sandbox(commands.lock_release("t2"))
    assert out["state"] == "NOT_HOLDER" and out["holder"] == "alice@ctl"
    assert (sandbox.state / "lock").is_dir()
    assert sandbox(commands.lock_release(None))["state"] == "NOT_HOLDER"
    assert sandbox(commands.lock_release("t1"))["state"] == "RELEASED"
    assert not (sandbox.state / "lock").exists()
    assert sandbox(commands.lock_release("t1"))["state"] == "FREE"


def test_force_release_names_whose_lock_it_broke(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, ""))
    out = sandbox(commands.lock_release(None, force=True))
    assert out["state"] == "RELEASED" and out["released_holder"] == "alice@ctl"
    assert not (sandbox.state / "lock").exists()


def test_expired_lock_is_taken_over_and_says_whose(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", -10, "crashed"))
    out = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert out["state"] == "ACQUIRED" and out["expired_holder"] == "alice@ctl"
    assert out["expired_message"] == "crashed"
    assert sandbox(commands.lock_status())["holder"] == "bob@ctl"
    assert not list(sandbox.state.glob("lock.expired.*"))


def test_unexpired_lock_is_not_taken_over(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 60, ""))
    assert sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))["state"] == "HELD"


def test_lock_without_info_is_held_by_unknown(sandbox):
    (sandbox.state / "lock").mkdir()  # an older nemofleet that died between mkdir and writing its info
    out = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert out["state"] == "HELD" and out["holder"] == "unknown"


def test_lock_without_info_expires_by_its_age(sandbox):
    lock = sandbox.state / "lock"
    lock.mkdir()
    old = time.time() - commands.NO_INFO_TTL - 5
    os.utime(lock, (old, old))
    out = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert out["state"] == "ACQUIRED" and out["expired_holder"] == "unknown"
    assert sandbox(commands.lock_status())["holder"] == "bob@ctl"


@pytest.mark.parametrize("killed_at", ["rename", "info"])
def test_acquire_appears_with_its_info_in_one_step(sandbox, killed_at):
    """Every lock a controller leaves has its expiry: the info is written before the directory is
    renamed into place, so the program killed at any step leaves no lock or a complete one. Here it
    dies (os._exit, as a SIGKILL would leave it) at its rename into place, or while it writes the
    info file (info.tmp, renamed to info inside the new directory)."""
    argv = shlex.split(commands.lock_acquire("alice@ctl", "t1", 7200, ""))
    die = ("import os, sys\n"
           f"real_open, real_rename = os.open, os.rename\n"
           "def rename(a, b, *k, **kw):\n    os._exit(9)\n"
           "def open_(p, *a, **kw):\n    os._exit(9) if str(p).endswith(('/info', '/info.tmp')) else None\n"
           "    return real_open(p, *a, **kw)\n"
           f"os.{'rename = rename' if killed_at == 'rename' else 'open = open_'}\n"
           "sys.argv = ['lock.py'] + sys.argv[1:]\n"
           "exec(compile(SOURCE, 'lock.py', 'exec'), {'__name__': '__main__'})\n").replace("SOURCE", repr(argv[4]))
    p = subprocess.run(["python3", "-I", "-S", "-c", die, *argv[5:]], capture_output=True, text=True, timeout=30)
    assert p.returncode == 9, p.stdout + p.stderr
    assert not (sandbox.state / "lock").exists()  # no lock at all, only a temporary directory
    assert [d.name.split(".")[:2] for d in sandbox.state.iterdir()] == [["lock", "new"]]
    assert sandbox(commands.lock_status())["state"] == "FREE"
    assert sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, ""))["state"] == "ACQUIRED"
    info = (sandbox.state / "lock/info").read_text()
    assert "expires=" in info and f"token_sha256={T1}" in info


def test_two_acquires_at_once_one_wins(sandbox):
    """Racing controllers: exactly one holds the lock, the others are told who does."""
    procs = []
    for i in range(6):
        script = commands.lock_acquire(f"c{i}@ctl", f"t{i}", 7200, "")
        procs.append(subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True))
    outs = [lockinfo.parse(p.communicate(timeout=30)[0].splitlines()) for p in procs]
    winners = [i for i, o in enumerate(outs) if o["state"] == "ACQUIRED"]
    assert len(winners) == 1
    holder = sandbox(commands.lock_status())["holder"]
    assert holder == f"c{winners[0]}@ctl"
    assert all(o["holder"] == holder for o in outs if o["state"] == "HELD")
    assert [p.name for p in sandbox.state.iterdir()] == ["lock"]  # no temporary directory left


def test_stale_temporary_directories_are_removed(sandbox):
    stale = sandbox.state / "lock.new.4242"
    stale.mkdir()
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, ""))
    assert not stale.exists()


def test_forged_token_cannot_release_or_refresh(sandbox):
    """What `lock status` shows (holder, digest) is not the token: neither releases the lock."""
    sandbox(commands.lock_acquire("alice@ctl", "a" * 32, 7200, ""))
    st = sandbox(commands.lock_status())
    for forged in (f"manual:{st['holder']}", st["token_sha256"], "manual:alice@ctl"):
        assert sandbox(commands.lock_release(forged))["state"] == "NOT_HOLDER"
        assert sandbox(commands.lock_refresh(forged, 60))["state"] == "LOST"
    assert sandbox(commands.lock_release("a" * 32))["state"] == "RELEASED"


def test_refresh_extends_only_the_holders_lock(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 100, ""))
    before = int(time.time())
    out = sandbox(commands.lock_refresh("t1", 9000))
    after = int(time.time())
    assert out["state"] == "REFRESHED"
    st = sandbox(commands.lock_status())
    # 9000 s from the refresh's own clock, bracketed by the controller's clock around the refresh
    # (not by the status read's: a loaded machine may take seconds between the two)
    assert before + 9000 <= st["expires"] <= after + 9000
    assert sandbox(commands.lock_refresh("t2", 9000))["state"] == "LOST"


def test_message_with_newline_cannot_forge_a_key(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, "x\ntoken_sha256=forged\nexpires=1 $(touch /tmp/pwn)"))
    st = sandbox(commands.lock_status())
    assert st["token_sha256"] == T1 and st["expires"] > 1000
    assert st["message"] == "x token_sha256=forged expires=1 $(touch /tmp/pwn)"


def test_status_of_a_free_host(sandbox):
    out = sandbox(commands.lock_status())
    assert out["state"] == "FREE" and isinstance(out["now"], int)


def test_audit_appends_one_line(sandbox):
    sandbox(commands.audit_command("alice@ctl", "rollout", "a -> b: ok"))
    sandbox(commands.audit_command("alice@ctl", "rebuild", "x\ny"))
    lines = (sandbox.state / "audit.log").read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith("Z alice@ctl rollout a -> b: ok") and lines[1].endswith("rebuild x y")


def _release(sandbox, rid: str, units: dict):
    (sandbox.state / "release").write_text(f"id={rid}\nimage=img:{rid}\n")
    for u in sandbox.units.glob("nemofleet-vllm-*.service"):
        u.unlink()
    for name, text in units.items():
        (sandbox.units / name).write_text(text)


def test_keep_previous_then_rollback_restores_units_and_record(sandbox):
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    before = sandbox(commands.release_read())
    _release(sandbox, "bbbbbbbbbbbb", {"nemofleet-vllm-nemotron-0.service": "new",
                                       "nemofleet-vllm-nemotron-1.service": "extra"})
    changed = sandbox(commands.release_read())
    assert changed["id"] == "bbbbbbbbbbbb" and changed["units_sha256"] != before["units_sha256"]
    out = sandbox(commands.rollback(expect="aaaaaaaaaaaa"))
    assert "rolled back to aaaaaaaaaaaa" in out["_stdout"]
    assert (sandbox.units / "nemofleet-vllm-nemotron-0.service").read_text() == "old"
    assert not (sandbox.units / "nemofleet-vllm-nemotron-1.service").exists()  # not in the kept release
    assert sandbox(commands.release_read()) | {"_stdout": "", "_stderr": ""} == before | {"_stdout": "", "_stderr": ""}
    log = sandbox.log.read_text()
    assert "disable --now -- nemofleet-vllm-nemotron-1.service" in log and "restart --no-block -- nemofleet-vllm-nemotron-0.service" in log


def test_rollback_refuses_a_kept_release_other_than_expected(sandbox):
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    out = sandbox(commands.rollback(expect="cccccccccccc"), check_rc=1)
    assert "the kept release is aaaaaaaaaaaa, not cccccccccccc" in out["_stderr"]
    assert not sandbox.log.exists()  # nothing was touched


def test_rollback_without_a_kept_release_says_so(sandbox):
    out = sandbox(commands.rollback(), check_rc=1)
    assert "no previous release kept on this host" in out["_stderr"]


def test_rollback_goes_through_the_front_door_one_instance_at_a_time_when_there_is_one(sandbox):
    """With a front door (the drain script, haproxy active, the instance known to it) each instance
    restarts through it under the health lock, bounded by ready_timeout + 120 s; one that is not
    ready in time is named and the others still go; no instance is restarted behind its back."""
    calls = sandbox.tmp / "calls.log"
    for name, body in {"systemctl": 'echo "systemctl $*" >> "$T/calls.log"\n',
                       "nemofleet-drain": ('echo "drain $* READY_TIMEOUT=$READY_TIMEOUT" >> "$T/calls.log"\n'
                                           '[ "$1 $2" = "restart nemotron-0" ] && exit 1\nexit 0\n'),
                       "timeout": 'echo "timeout $*" >> "$T/calls.log"\nshift\nexec "$@"\n'}.items():
        (sandbox.bin / name).write_text(f"#!/bin/sh\nT={sandbox.tmp}\n{body}")
        (sandbox.bin / name).chmod(0o755)
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old0", "nemofleet-vllm-nemotron-1.service": "old1"})
    sandbox(commands.keep_previous())
    _release(sandbox, "bbbbbbbbbbbb", {"nemofleet-vllm-nemotron-0.service": "new0", "nemofleet-vllm-nemotron-1.service": "new1"})
    out = sandbox(commands.rollback(expect="aaaaaaaaaaaa", ready_timeout=45))
    assert out["_stdout"].splitlines() == ["instance nemotron-0: not ready through the front door yet",
                                           "rolled back to aaaaaaaaaaaa"]
    log = calls.read_text()
    drain = str(sandbox.bin / "nemofleet-drain")
    for i in ("nemotron-0", "nemotron-1"):
        assert f"timeout 165 flock -w 60 {paths.HEALTH_LOCK} {drain} restart {i}\n" in log
        assert f"drain restart {i} READY_TIMEOUT=45" in log and f"drain state {i} READY_TIMEOUT=" in log
        assert f"restart --no-block -- nemofleet-vllm-{i}.service" not in log  # only through the front door
    assert "timeout 120 systemctl daemon-reload" in log and "timeout 10 systemctl is-active -q haproxy" in log
    # no front door (haproxy not active): all at once, each systemctl call bounded
    (sandbox.bin / "systemctl").write_text(f"#!/bin/sh\necho \"systemctl $*\" >> {calls}\n"
                                           "[ \"$1\" = is-active ] && exit 3\nexit 0\n")
    calls.write_text("")
    sandbox(commands.keep_previous())
    sandbox(commands.rollback())
    log = calls.read_text()
    assert "drain restart" not in log
    assert "timeout 60 systemctl restart --no-block -- nemofleet-vllm-nemotron-0.service" in log


def test_a_failing_systemctl_stops_the_rollback_with_one_sentence(sandbox):
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    _release(sandbox, "bbbbbbbbbbbb", {"nemofleet-vllm-nemotron-0.service": "new"})
    (sandbox.bin / "systemctl").write_text("#!/bin/sh\n[ \"$1\" = daemon-reload ] && exit 5\nexit 0\n")
    out = sandbox(commands.rollback(), check_rc=1)
    assert out["_stderr"].strip().splitlines() == ["rollback stopped: `systemctl daemon-reload` failed (exit 5)"]


def test_gpu_return_removes_its_markers_and_puts_the_instances_back(sandbox):
    health = sandbox.state / "health"
    health.mkdir()
    for name in ("gpu-GPU-x.sick", "gpu-GPU-x.healthy_runs", "nemotron-3.gpu_sick", "gpu-GPU-y.sick", "other.gpu_sick"):
        (health / name).write_text("1\n")
    drain = sandbox.bin / "nemofleet-drain"
    drain.write_text(f"#!/bin/sh\necho \"$*\" >> {sandbox.tmp}/drain.log\n")
    drain.chmod(0o755)
    cmd, = commands.gpu_returns({"GPU-x": ["nemotron-3"]}, True)
    sandbox(cmd)
    assert sorted(p.name for p in health.iterdir()) == ["gpu-GPU-y.sick", "other.gpu_sick"]
    assert (sandbox.tmp / "drain.log").read_text() == "in nemotron-3\n"
    assert "is-active -q haproxy" in sandbox.log.read_text()
    # a drain that fails stops with one sentence (the deploy's operation fails)
    drain.write_text("#!/bin/sh\nexit 4\n")
    out = sandbox(cmd, check_rc=1)
    assert "instance nemotron-3 could not be put back in the front door" in out["_stderr"]


@pytest.mark.parametrize("uuid, names", [("../../etc", ["a"]), ("GPU-x", ["../x"]), ("GPU-x", [".."]),
                                         ("", ["a"]), ("GPU-x", ["a/b"])])
def test_gpu_return_refuses_a_name_that_is_not_a_plain_file_name(sandbox, uuid, names):
    (sandbox.state / "health").mkdir()
    victim = sandbox.state / "x.gpu_sick"
    victim.write_text("keep")
    out = sandbox(commands.gpu_returns({uuid: names}, False)[0], check_rc=1)
    assert "is not a plain GPU UUID or instance name" in out["_stderr"] and victim.exists()
