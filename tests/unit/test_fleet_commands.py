"""The fleet's remote commands: exact strings (golden), and the lock, audit and rollback scripts
run with bash against a temporary state directory to prove they work."""
import os
import stat
import subprocess

import pytest

from nemofleet import paths
from nemofleet.fleet import commands, lockinfo
from nemofleet.fleet.commands import token_digest

T1 = token_digest("t1")


# ---------------------------------------------------------------------------- golden strings

def test_audit_line_golden():
    assert commands.audit_command("alice@ctl", "rollout", "a -> b: ok") == (
        "mkdir -p /var/lib/nemofleet && printf '%s %s\\n' \"$(date -u +%FT%TZ)\" "
        "'alice@ctl rollout a -> b: ok' >> /var/lib/nemofleet/audit.log")


def test_audit_detail_cannot_forge_a_line_or_run_a_command():
    cmd = commands.audit_command("bob", "rollout", "x\n2026-01-01T00:00:00Z root release $(reboot) 'q'")
    assert "\n" not in cmd and "'\"'\"'q'\"'\"'" in cmd  # one line, single-quoted through


def test_gate_golden():
    assert commands.gate() == ("FAIL_RESTART=0 timeout 180 flock -w 60 /run/lock/nemofleet-health.lock "
                               "/usr/local/bin/nemofleet-health")


def test_release_read_golden():
    assert commands.release_read() == (
        "cat /var/lib/nemofleet/release 2>/dev/null; printf 'units_sha256=%s\\n' "
        "\"$(cat /etc/systemd/system/nemofleet-vllm-*.service 2>/dev/null | sha256sum | cut -c1-16)\"")


def test_keep_previous_golden():
    assert commands.keep_previous() == (
        "set -e; d=/var/lib/nemofleet/previous; rm -rf $d.new; mkdir -p $d.new; "
        "cp /etc/systemd/system/nemofleet-vllm-*.service $d.new/ 2>/dev/null || true; "
        "cp /var/lib/nemofleet/release $d.new/release; rm -rf $d; mv $d.new $d")


def test_lock_status_golden():
    assert commands.lock_status() == (
        "s=/var/lib/nemofleet; d=/var/lib/nemofleet/lock; now=$(date +%s)\n"
        "if [ -d \"$d\" ]; then echo state=HELD; if [ -r \"$d/info\" ]; then cat \"$d/info\"; "
        "else echo holder=unknown; fi; else echo state=FREE; fi\n"
        "echo now=$now\n")


def test_lock_release_golden():
    assert commands.lock_release("t1") == (
        "s=/var/lib/nemofleet; d=/var/lib/nemofleet/lock; now=$(date +%s)\n"
        "if [ ! -d \"$d\" ]; then echo state=FREE; exit 0; fi\n"
        f"if [ \"$(sed -n 's/^token_sha256=//p' \"$d/info\" 2>/dev/null)\" = {T1} ]; then\n"
        "  t=\"$d.released.$$\"; mv \"$d\" \"$t\" && rm -rf \"$t\" && echo state=RELEASED\n"
        "else echo state=NOT_HOLDER; if [ -r \"$d/info\" ]; then cat \"$d/info\"; else echo holder=unknown; fi; fi\n")


def test_lock_acquire_golden():
    assert commands.lock_acquire("alice@ctl", "t1", 7200, "drain") == (
        "s=/var/lib/nemofleet; d=/var/lib/nemofleet/lock; now=$(date +%s); mkdir -p \"$s\"\n"
        f"if [ \"$(sed -n 's/^token_sha256=//p' \"$d/info\" 2>/dev/null)\" = {T1} ]; then echo state=OWNED; "
        "echo now=$now; exit 0; fi\n"
        "exp=$(sed -n 's/^expires=//p' \"$d/info\" 2>/dev/null)\n"
        "case $exp in ''|*[!0-9]*) exp='';; esac\n"
        "if [ -d \"$d\" ] && [ -n \"$exp\" ] && [ \"$exp\" -le \"$now\" ]; then\n"
        "  t=\"$d.expired.$$\"\n"
        "  if mv \"$d\" \"$t\" 2>/dev/null; then\n"
        "    if [ \"$(sed -n 's/^expires=//p' \"$t/info\" 2>/dev/null)\" = \"$exp\" ]; then\n"
        "      sed 's/^/expired_/' \"$t/info\"; rm -rf \"$t\"\n"
        "    else mv \"$t\" \"$d\" 2>/dev/null || true; fi\n"
        "  fi\n"
        "fi\n"
        "if mkdir \"$d\" 2>/dev/null; then\n"
        "  printf 'holder=%s\\ntoken_sha256=%s\\nsince=%s\\nexpires=%s\\nmessage=%s\\n' alice@ctl "
        f"{T1} \"$(date -u +%FT%TZ)\" \"$((now + 7200))\" drain > \"$d/info.tmp\" && mv \"$d/info.tmp\" \"$d/info\"\n"
        "  echo state=ACQUIRED\n"
        "else echo state=HELD; if [ -r \"$d/info\" ]; then cat \"$d/info\"; else echo holder=unknown; fi; fi\n"
        "echo now=$now\n")


def test_status_uses_the_hosts_own_paths():
    cmd = commands.status("/data/models", "/srv/prom")
    assert "for d in /data/models/*/" in cmd and "grep -v '^#' /srv/prom/nemofleet.prom" in cmd
    assert "/srv/nemofleet/models" not in cmd and "/var/lib/prometheus" not in cmd
    assert "'/data/my models'/*/" in commands.status("/data/my models/", "/p")  # quoted, one trailing slash


def test_rollback_with_expect_guards_the_kept_release():
    assert "not rolling back" in commands.rollback("abc123def456")
    assert "not rolling back" not in commands.rollback()


# ---------------------------------------------------------------------------- scripts under bash

@pytest.fixture
def sandbox(tmp_path):
    """Run a command with the state and unit dirs under tmp_path and fake systemctl/flock."""
    state, units, bindir = tmp_path / "state", tmp_path / "units", tmp_path / "bin"
    for d in (state, units, bindir):
        d.mkdir()
    log = tmp_path / "systemctl.log"
    fake = bindir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)

    def run(script: str, check_rc: int | None = 0) -> dict:
        script = script.replace(paths.STATE_DIR, str(state)).replace(paths.UNIT_DIR, str(units))
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
        if check_rc is not None:
            assert p.returncode == check_rc, p.stdout + p.stderr
        out = lockinfo.parse(p.stdout.splitlines())
        out["_stdout"], out["_stderr"] = p.stdout, p.stderr
        return out

    run.state, run.units, run.log = state, units, log
    return run


def test_acquire_twice_is_held_by_the_first(sandbox):
    assert sandbox(commands.lock_acquire("alice@ctl", "t1", 7200, "drain"))["state"] == "ACQUIRED"
    second = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert second["state"] == "HELD" and second["holder"] == "alice@ctl" and second["message"] == "drain"
    assert second["token_sha256"] == T1 and "=t1\n" not in (sandbox.state / "lock/info").read_text()  # only its hash
    assert second["expires"] - second["now"] in (7199, 7200)
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
    (sandbox.state / "lock").mkdir()  # a holder that died between mkdir and writing its info
    out = sandbox(commands.lock_acquire("bob@ctl", "t2", 7200, ""))
    assert out["state"] == "HELD" and out["holder"] == "unknown"


def test_refresh_extends_only_the_holders_lock(sandbox):
    sandbox(commands.lock_acquire("alice@ctl", "t1", 100, ""))
    out = sandbox(commands.lock_refresh("t1", 9000))
    assert out["state"] == "REFRESHED"
    st = sandbox(commands.lock_status())
    assert st["expires"] - st["now"] in (8999, 9000)
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


def test_rollback_goes_through_the_front_door_one_instance_at_a_time_when_there_is_one():
    script = commands.rollback(expect="aaaaaaaaaaaa", ready_timeout=45)
    assert f"[ -x {paths.DRAIN_SCRIPT} ] && systemctl is-active -q haproxy" in script
    assert (f"READY_TIMEOUT=45 timeout 165 flock -w 60 {paths.HEALTH_LOCK} {paths.DRAIN_SCRIPT} restart \"$i\" "
            "|| echo \"instance $i: not ready through the front door yet\"") in script
    assert "else timeout 60 systemctl restart --no-block -- \"$n\"; fi" in script  # no front door: all at once
