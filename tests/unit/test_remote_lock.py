"""The fleet layer's remote programs (remote/lock.py, release.py, gpu_return.py, host_status.py)
against hostile input: lock info files that are huge numbers, binary junk, symlinks, directories or
FIFOs; holders, messages, audit fields and release ids with newlines, line separators and shell
metacharacters. Each command is run as a host runs it (its command line under bash, in a
directory where a `$(touch ...)` would leave its marker): the program never ends in a traceback or
a hang, the marker never appears, a forged key never reaches the controller, and the controller's
parser (lockinfo) stays bounded."""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemofleet import hostcmd as commands
from nemofleet import paths, remote
from nemofleet.lock import info as lockinfo
from test_fleet_commands import T1, _release, sandbox  # noqa: F401 - sandbox is the fixture

REMOTE = Path(remote.__file__).parent
LOCK = [sys.executable, *remote.argv("lock")[1:]]  # as a host runs it: the prelude, then lock.py
PAYLOADS = ["$(touch MARK)", "`touch MARK`", "x; touch MARK", "x' ; touch MARK; '", 'x" ; touch MARK; "',
            "x\ntouch MARK", "x\\\ntouch MARK", "%s%n$((1))${IFS}", "-h", "--force", ""]
BREAKS = "a\nb\rc\x0bd\x0ce\x1cf\x85g\u2028h\u2029i\x00j"


def no_marker(tmp: Path):
    return not any(p.name == "MARK" for p in tmp.rglob("MARK"))


def info(sandbox, text: bytes | str, age: float = 0):
    lock = sandbox.state / "lock"
    lock.mkdir(exist_ok=True)
    (lock / "info").write_bytes(text if isinstance(text, bytes) else text.encode())
    if age:
        old = time.time() - age
        os.utime(lock, (old, old))
    return lock


def test_the_program_and_the_controller_agree_on_the_no_info_ttl():
    spec = importlib.util.spec_from_file_location("remote_lock", REMOTE / "lock.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.NO_INFO_TTL == commands.NO_INFO_TTL


def test_the_lock_program_loads_only_os_stat_sys_and_time():
    """`status` runs in every deploy's facts on every host: nothing beyond what `os` loads anyway
    (no `re`, `shutil` or `json`, each a measurable part of a python start)."""
    def loaded(code):
        code = f"import sys; before = set(sys.modules)\n{code}\nprint(sorted(set(sys.modules) - before))"
        return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                               timeout=30).stdout.strip()

    program = (f"sys.argv = ['lock.py', {str(REMOTE / 'x' / 'lock')!r}, 'status']\n"
               f"exec(compile({remote.source('lock')!r}, 'lock.py', 'exec'), {{'__name__': 'm'}})")
    assert loaded(program) == loaded("import os, stat, sys, time")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_free_text_is_never_code_and_never_a_second_line(sandbox, payload):
    """Every free-text field of every command: the holder, the message, the audit's operator, event
    and detail, a rollback's expected id."""
    assert sandbox(commands.lock_acquire(payload, "t1", 7200, payload))["state"] == "ACQUIRED"
    st = sandbox(commands.lock_status())
    assert st["token_sha256"] == T1 and isinstance(st["expires"], int)
    assert st["holder"] == commands.one_line(payload)
    assert st.get("message") == commands.one_line(payload)
    text = (sandbox.state / "lock" / "info").read_text()
    assert len(text.splitlines()) == 5 and "\r" not in text
    assert sandbox(commands.lock_refresh("t1", 60))["state"] == "REFRESHED"
    assert sandbox(commands.lock_release("t1"))["state"] == "RELEASED"
    sandbox(commands.audit_command(payload, payload, payload))
    assert len((sandbox.state / "audit.log").read_text().splitlines()) == 1
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    if payload:
        out = sandbox(commands.rollback(expect=payload), check_rc=1)
        assert f"not {commands.one_line(payload)}: not rolling back" in out["_stderr"]
        assert len(out["_stderr"].strip().splitlines()) == 1
    assert no_marker(sandbox.tmp)


def test_line_separators_of_every_kind_cannot_forge_a_key(sandbox):
    forged = f"{BREAKS}\ntoken_sha256=forged\u2028expires=1\x85state=FREE"
    assert sandbox(commands.lock_acquire(forged, "t1", 7200, forged))["state"] == "ACQUIRED"
    st = sandbox(commands.lock_status())
    assert st["state"] == "HELD" and st["token_sha256"] == T1 and st["expires"] > 1000
    assert len(st["_stdout"].splitlines()) == 7  # state, the five keys, now
    sandbox(commands.audit_command(forged, "rollout", forged))
    log = (sandbox.state / "audit.log").read_text(encoding="utf-8")
    assert len(log.splitlines()) == 1


def test_an_info_file_that_forges_the_state_or_a_key_twice_is_not_believed(sandbox):
    info(sandbox, f"holder=mallory\nstate=FREE\nnow=1\ntoken_sha256={T1}\ntoken_sha256={T1}\nexpires=99\n")
    st = sandbox(commands.lock_status())
    assert st["state"] == "HELD" and st["holder"] == "mallory" and st["now"] > 1000
    assert "token_sha256" not in st  # given twice: dropped, so it owns nothing
    assert sandbox(commands.lock_release("t1"))["state"] == "NOT_HOLDER"
    assert sandbox(commands.lock_refresh("t1", 60))["state"] == "LOST"


@pytest.mark.parametrize("expires", ["1" + "0" * 5000, "9" * 13, "１２３", "²", "-5", "1e9", "0x10", " 12"])
def test_an_expiry_that_is_not_a_time_reads_as_none(sandbox, expires):
    """expires=10**5000 (and any other non-time) is a lock without expiry: held while its directory
    is younger than NO_INFO_TTL, taken over after; never a crash on the host or the controller."""
    info(sandbox, f"holder=alice\ntoken_sha256={'b' * 64}\nexpires={expires}\n")
    st = sandbox(commands.lock_status())
    assert st["state"] == "HELD" and st["holder"] == "alice" and "expires" not in st
    held = lockinfo.holder_info(st)
    assert lockinfo.until(held) == "no expiry recorded" and not lockinfo.expired(held, time.time())
    assert sandbox(commands.lock_acquire("bob", "t2", 60, ""))["state"] == "HELD"
    old = time.time() - commands.NO_INFO_TTL - 5
    os.utime(sandbox.state / "lock", (old, old))
    out = sandbox(commands.lock_acquire("bob", "t2", 60, ""))
    assert out["state"] == "ACQUIRED" and out["expired_holder"] == "alice"


def test_racing_takeovers_of_an_expired_lock_leave_one_holder_and_name_the_old_one_once(sandbox):
    """Six controllers take over the same expired lock at once: one holds it, the old holder is
    reported once, the others are told who holds it now, no temporary directory is left."""
    sandbox(commands.lock_acquire("crashed@ctl", "t0", -10, ""))
    procs = [subprocess.Popen(["bash", "-c", commands.lock_acquire(f"c{i}@ctl", f"t{i + 1}", 7200, "")],
                              stdout=subprocess.PIPE, text=True, cwd=sandbox.tmp) for i in range(6)]
    outs = [lockinfo.parse(p.communicate(timeout=30)[0].splitlines()) for p in procs]
    winners = [i for i, o in enumerate(outs) if o["state"] == "ACQUIRED"]
    assert len(winners) == 1 and sum("expired_holder" in o for o in outs) == 1
    assert [o.get("expired_holder") for o in outs if "expired_holder" in o] == ["crashed@ctl"]
    holder = sandbox(commands.lock_status())["holder"]
    assert holder == f"c{winners[0]}@ctl" and all(o["holder"] == holder for o in outs if o["state"] == "HELD")
    assert [p.name for p in sandbox.state.iterdir()] == ["lock"]


def test_the_controllers_parser_is_bounded():
    """A host that answers anything (a compromised one): lockinfo.parse leaves out a time that is
    none (valuetypes.host_time: ASCII digits below 2**40), and the sentences built from what it
    reads, or from a lock built by hand, never raise."""
    huge = "1" + "0" * 5000
    out = lockinfo.parse(["state=HELD", f"expires={huge}", f"now={huge}", "expired_expires=²", "released_expires=٣",
                          f"holder={'x' * 10**6}"])
    assert not {"expires", "now", "expired_expires", "released_expires"} & set(out) and out["state"] == "HELD"
    held = lockinfo.holder_info(out)
    assert lockinfo.until(held, 0) == "no expiry recorded" and not lockinfo.expired(held, 0)
    assert lockinfo.lock_refusal(held, None, 0).startswith("this host is locked by x")
    assert lockinfo.holder_info(lockinfo.parse(["expired_expires=99999999999"]), "expired_")["expires"] == 99999999999
    assert "expired at" in lockinfo.until({"expires": 999999999999}, 10**12)  # 12 digits: still a date
    # a lock built by hand (a facts file's, `nemofleet lock status`'s with the host's `now`)
    for info, now in (({"expires": 10**20}, 0), ({"expires": 1700000000}, "not a number"), ({"expires": "x"}, None),
                      ({"expires": 1700000000}, float("nan")), ({"expires": True}, 10**400)):
        assert lockinfo.until(info, now) and lockinfo.expired(info, now) in (True, False)
    assert lockinfo.until({"expires": 10**20}, 0) == "no expiry recorded"


@pytest.mark.parametrize("kind", ["binary", "not-utf8", "missing", "symlink", "directory", "fifo", "huge", "empty"])
def test_an_unreadable_info_file_reads_as_unknown_and_never_hangs(sandbox, kind):
    lock = sandbox.state / "lock"
    lock.mkdir()
    target = sandbox.tmp / "elsewhere"
    target.write_text(f"holder=outside\ntoken_sha256={T1}\nexpires=9999999999\n")
    f = lock / "info"
    if kind == "binary":
        f.write_bytes(os.urandom(4096).replace(b"\n", b"") + b"\n\xff\xfe\x00holder=x\n")
    elif kind == "not-utf8":
        f.write_bytes(b"holder=\xff\xfe\nexpires=1\n")
    elif kind == "symlink":
        f.symlink_to(target)  # never followed: the info file is the lock's own
    elif kind == "directory":
        f.mkdir()
    elif kind == "fifo":
        os.mkfifo(f)
    elif kind == "huge":
        f.write_bytes(b"holder=x\n" + b"m" * (1 << 20))
    elif kind == "empty":
        f.write_bytes(b"")
    st = sandbox(commands.lock_status())
    assert st["state"] == "HELD" and st["holder"] == "unknown" and len(st["_stdout"].splitlines()) == 3
    assert sandbox(commands.lock_acquire("bob", "t1", 60, ""))["state"] == "HELD"  # not ours through a link
    assert sandbox(commands.lock_release("t1"))["state"] == "NOT_HOLDER"
    out = sandbox(commands.lock_release(None, force=True))
    assert out["state"] == "RELEASED" and out["released_holder"] == "unknown"
    assert target.exists() and not lock.exists()


@pytest.mark.parametrize("kind", ["file", "symlink-to-dir", "dangling-symlink"])
def test_a_lock_path_that_is_not_a_directory_is_held_and_can_be_broken(sandbox, kind):
    lock, elsewhere = sandbox.state / "lock", sandbox.tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    if kind == "file":
        lock.write_text("holder=x\n")
    elif kind == "symlink-to-dir":
        lock.symlink_to(elsewhere)
    else:
        lock.symlink_to(sandbox.tmp / "nowhere")
    assert sandbox(commands.lock_status())["holder"] == "unknown"
    assert sandbox(commands.lock_acquire("bob", "t2", 60, ""))["state"] == "HELD"
    assert sandbox(commands.lock_release(None, force=True))["state"] == "RELEASED"
    assert not os.path.lexists(lock) and (elsewhere / "keep").exists()  # the link went, not what it named
    assert sandbox(commands.lock_acquire("bob", "t2", 60, ""))["state"] == "ACQUIRED"


def test_a_stale_temporary_directory_with_a_symlink_inside_is_removed_without_following_it(sandbox):
    outside = sandbox.tmp / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    stale = sandbox.state / "lock.new.4242"
    stale.mkdir()
    (stale / "link").symlink_to(outside)
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    fresh = sandbox.state / "lock.new.4243"
    fresh.mkdir()  # another controller's, mid-step: left alone
    sandbox(commands.lock_acquire("alice", "t1", 60, ""))
    assert not stale.exists() and fresh.exists() and (outside / "precious").exists()


@pytest.mark.parametrize("argv", [[], ["/x"], ["relative/lock", "status"], ["/x", "nope"], ["/x", "status", "extra"],
                                  ["/x", "acquire", "h", "not-a-digest", "60", "m"],
                                  ["/x", "acquire", "h", "a" * 64, "1" * 5000, "m"],
                                  ["/x", "acquire", "h", "a" * 64, "六十", "m"],
                                  ["/x", "refresh", "A" * 64, "60"], ["/x", "release", "a" * 64, "please"]])
def test_bad_arguments_are_one_sentence(tmp_path, argv):
    argv = [a.replace("/x", str(tmp_path / "lock")) for a in argv]
    r = subprocess.run([*LOCK, *argv], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "lock").exists()


def test_arguments_that_are_not_utf8_never_crash(tmp_path):
    lock = str(tmp_path / "lock").encode()
    r = subprocess.run([*LOCK, lock, b"acquire", b"\xff\xfeholder",
                        ("a" * 64).encode(), b"60", b"m\xff\x00"[:2]], capture_output=True, timeout=30)
    assert r.returncode == 0 and b"state=ACQUIRED" in r.stdout, r.stderr
    text = (tmp_path / "lock" / "info").read_text(encoding="utf-8")
    assert "holder=\ufffd\ufffdholder\n" in text


def test_an_unwritable_state_directory_is_one_sentence(tmp_path):
    (tmp_path / "state").write_text("a file where the directory should be")
    r = subprocess.run([*LOCK, str(tmp_path / "state" / "lock"), "acquire",
                        "h", "a" * 64, "60", ""], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.startswith("the deploy lock could not be changed:"), r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------------------- release and status

@pytest.mark.parametrize("record", [b"id=\xff\xfe\nimage=x\n", b"\x00" * 100, b"id=a\nid=b\n", b"no newline at the end"])
def test_release_read_of_a_hostile_record(sandbox, record):
    (sandbox.state / "release").write_bytes(record)
    out = sandbox(commands.release_read())
    assert len(out["units_sha256"]) == 16 and out["_stdout"].splitlines()[-1].startswith("units_sha256=")


def test_rollback_names_units_as_arguments_never_as_shell_words(sandbox):
    """A unit file named with shell syntax in the unit directory: disabled and removed by name."""
    evil = "nemofleet-vllm-$(touch MARK);x.service"
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    _release(sandbox, "bbbbbbbbbbbb", {"nemofleet-vllm-nemotron-0.service": "new", evil: "evil"})
    out = sandbox(commands.rollback(expect="aaaaaaaaaaaa"))
    assert "rolled back to aaaaaaaaaaaa" in out["_stdout"]
    assert f"disable --now -- {evil}" in sandbox.log.read_text() and not (sandbox.units / evil).exists()
    assert no_marker(sandbox.tmp)


def test_keep_without_a_release_record_says_so(sandbox):
    out = sandbox(commands.keep_previous(), check_rc=1)
    assert out["_stderr"].strip() == f"no release record at {paths.RELEASE} to keep"


def status_lines(sandbox, models: Path, prom: Path) -> list[str]:
    return sandbox(commands.status(str(models), str(prom)))["_stdout"].splitlines()


def test_status_prints_what_fleet_status_parses(sandbox):
    models, prom = sandbox.tmp / "models", sandbox.tmp / "prom"
    (models / "org--m@x").mkdir(parents=True)
    (models / "org--m@x" / ".nemofleet-complete").write_text("")
    (models / "org--m@x" / "model.safetensors.index.json").write_text('{"metadata": {"total_size": "7"}}')
    (models / ".hidden").mkdir()
    prom.mkdir()
    (prom / "nemofleet.prom").write_text('# HELP x\nnemofleet_vllm_up{instance="nemotron-0"} 1\n')
    health = sandbox.state / "health"
    health.mkdir()
    (health / "gpu-GPU-1.sick").write_text("GPU-1 1764846000 0 Xid 79\nsecond line\n")
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "[Unit]\nDescription=nemofleet vLLM (m on GPU 0)\n"})
    (sandbox.state / "audit.log").write_text("2026-12-01T00:00:00Z a canary pass 1\n2026-12-02T00:00:00Z b rollout x\n"
                                             "2026-12-03T00:00:00Z c canary fail 2\n2026-12-04T00:00:00Z d rollout y\n")
    (sandbox.bin / "systemctl").write_text("#!/bin/sh\ncase \"$1\" in is-active) echo active ;; list-units) "
                                           "echo 'nemofleet-weights-org--m.service loaded active running x'; "
                                           "echo '$(touch MARK) loaded' ;; esac\n")
    (sandbox.bin / "journalctl").write_text("#!/bin/sh\nprintf 'Downloading 10%%\\rDownloading 55%%\\n'\n")
    (sandbox.bin / "journalctl").chmod(0o755)
    assert status_lines(sandbox, models, prom) == [
        "release id=aaaaaaaaaaaa", "release image=img:aaaaaaaaaaaa",
        "unit nemofleet-vllm-nemotron-0.service active nemofleet vLLM (m on GPU 0)",
        'prom nemofleet_vllm_up{instance="nemotron-0"} 1',
        "gpusick GPU-1 1764846000 0 Xid 79",
        "weights org--m@x 0 of 7 (0%) tensor bytes, complete",
        "download nemofleet-weights-org--m.service active: Downloading 55%",
        "canary 2026-12-03T00:00:00Z c canary fail 2"]
    assert no_marker(sandbox.tmp)


@pytest.mark.parametrize("index", [b"\xff\xfe", b"[" * 100000, b'{"metadata": {"total_size": 1e400}}',
                                   b'{"metadata": {"total_size": ' + b"9" * 5000 + b"}}",
                                   b'{"metadata": {"total_size": -5}}', b'{"metadata": {"total_size": [1]}}',
                                   b'{"metadata": "x"}', b"null"], ids=lambda v: repr(v)[:30])
def test_status_weights_of_a_hostile_model_directory(sandbox, index):
    models = sandbox.tmp / "models"
    d = models / "m"
    d.mkdir(parents=True)
    (d / "model.safetensors.index.json").write_bytes(index)
    (d / "bad-header.safetensors").write_bytes(b"\xff" * 8 + b"x")  # a header longer than the file
    (d / "short.safetensors").write_bytes(b"\x01")
    os.mkfifo(d / "fifo.safetensors")  # never waited on
    (d / "loop.safetensors").symlink_to(d / "loop.safetensors")
    (d / ".nemofleet-complete").mkdir()  # a directory is no marker
    (models / "file-not-dir").write_text("")
    assert [ln for ln in status_lines(sandbox, models, sandbox.tmp) if ln.startswith("weights")] == [
        "weights m 0 of ? tensor bytes, incomplete"]


def test_status_of_a_bare_host_prints_nothing_and_exits_0(sandbox):
    assert status_lines(sandbox, sandbox.tmp / "no-models", sandbox.tmp / "no-prom") == []
