"""The deploy lock of issue 25: a plain pyinfra run takes it before its first change and gives it
back at disconnect (nemofleet.lock.run, its lock scripts run for real with bash against a
temporary state directory); a manual lock's token is a random secret, a forged one is refused;
--lock-ttl has a maximum; `lock release` says when a host is unreachable."""
import os
import re
import shlex
import subprocess
import time

import pytest
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateOperationHostData
from pyinfra.connectors.util import CommandOutput, OutputLine

from nemofleet import cli, paths
from nemofleet.lock import run as runlock
from nemofleet import hostcmd as commands
from nemofleet.lock import info as lockinfo
from nemofleet.fleet import driver
from nemofleet.lock import fleet as lock
from nemofleet.fleet.driver import Exec, FleetError


# ---------------------------------------------------------------------------- a fake pyinfra host

class Host:
    """A pyinfra host whose commands run with bash against tmp_path (the lock under STATE_DIR)."""

    def __init__(self, name, state_dir, state):
        self.name, self.state_dir, self.state = name, state_dir, state
        self.logs, self.scripts, self.disconnected, self.down = [], [], False, False
        self.executing_op_hash = None  # pyinfra sets it while an operation runs on the host

    def run_shell_command(self, command, **kwargs):
        if self.down:
            raise OSError("No route to host")
        script = command.get_raw_value().replace(paths.STATE_DIR, str(self.state_dir))
        self.scripts.append(script)
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        lines = [OutputLine("stdout", ln) for ln in p.stdout.splitlines()]
        lines += [OutputLine("stderr", ln) for ln in p.stderr.splitlines()]
        return p.returncode == 0, CommandOutput(lines)

    def log(self, message, log_func=None):
        self.logs.append(message)

    def disconnect(self):
        self.disconnected = True


class State:
    def __init__(self):
        self.is_executing = False
        self.ops = {}


def op(state, host, op_hash, *commands_, if_=True):
    """One operation of `host`: yields `commands_` (strings) when `if_()` holds, like an op with _if."""
    def gen():
        if state.is_executing and not (if_() if callable(if_) else if_):
            return
        for c in commands_:
            yield StringCommand(c)

    state.ops.setdefault(host, {})[op_hash] = StateOperationHostData(gen, {}, OperationMeta(op_hash, None))
    return op_hash


def execute(state, host, op_hash) -> tuple[bool, list[str]]:
    """Run an operation as pyinfra does: its commands in order, stopping at the first that fails.
    Returns (success, the string commands it ran)."""
    ran = []
    for c in state.ops[host][op_hash].command_generator():
        if isinstance(c, FunctionCommand):
            if c.execute(state, host, {}) is False:
                return False, ran
        else:
            ran.append(c.get_raw_value())
            if subprocess.run(["bash", "-c", c.get_raw_value()], capture_output=True).returncode:
                return False, ran
    return True, ran


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A fresh plain run (its own token and taken-hosts record) on host "h" of tmp_path's state
    dir; call it again for a second, concurrent run of another operator."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    monkeypatch.delenv(driver.LOCK_TOKEN_ENV, raising=False)
    monkeypatch.delenv(runlock.TTL_ENV, raising=False)
    monkeypatch.setattr(runlock, "_connector_args", lambda state, host: {})

    def use(host):
        """Be `host`'s controller process again (each run is its own process in life)."""
        monkeypatch.setenv("NEMOFLEET_OPERATOR", host.operator)
        monkeypatch.setattr(runlock, "RUN_TOKEN", host.token)
        monkeypatch.setattr(runlock, "_TAKEN", host.taken)

    def new(operator="alice"):
        state = State()
        host = Host("h", state_dir, state)
        host.operator, host.token, host.taken = operator, os.urandom(16).hex(), {}
        use(host)
        return state, host

    new.lock, new.use = state_dir / "lock", use
    return new


def holder(run):
    info = (run.lock / "info").read_text()
    return re.search(r"^holder=(.*)$", info, re.M).group(1)


# ---------------------------------------------------------------------------- plain runs

def test_converged_host_takes_no_lock_and_runs_no_lock_command(run):
    state, host = run()
    op(state, host, "a", if_=True)  # yields nothing: converged
    op(state, host, "b", "true", if_=lambda: False)  # an _if that does not hold
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a") == (True, []) and execute(state, host, "b") == (True, [])
    host.disconnect()
    assert host.scripts == [] and host.disconnected and not run.lock.exists()


def test_first_change_takes_the_lock_and_disconnect_releases_it(run):
    state, host = run()
    op(state, host, "a")
    op(state, host, "b", "echo one", "echo two")
    op(state, host, "c", "echo three")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a") == (True, [])
    assert execute(state, host, "b") == (True, ["echo one", "echo two"])
    assert holder(run).startswith("alice@") and len(host.scripts) == 1  # taken once, before "echo one"
    assert "message=plain pyinfra deploy" in (run.lock / "info").read_text()
    assert runlock.RUN_TOKEN not in (run.lock / "info").read_text()  # only its digest
    assert execute(state, host, "c") == (True, ["echo three"]) and len(host.scripts) == 1
    host.disconnect()
    assert host.disconnected and not run.lock.exists() and "deploy lock released" in host.logs
    assert all(runlock.RUN_TOKEN not in s for s in host.scripts)  # the token never reaches the host


def test_second_concurrent_plain_run_is_refused_with_the_holders_name(run):
    state1, host1 = run("alice")
    op(state1, host1, "a", "echo change")
    runlock.guard(state1, host1)
    state1.is_executing = True
    assert execute(state1, host1, "a")[0]
    state2, host2 = run("bob")  # passed its preflight before alice's take: the take itself refuses
    op(state2, host2, "a", "echo change")
    runlock.guard(state2, host2)
    state2.is_executing = True
    assert execute(state2, host2, "a") == (False, [])  # not one command of the operation ran
    assert re.fullmatch(r"nemofleet refused h: this host is locked by alice@\S+ since \S+ \(plain pyinfra deploy\), "
                        r"expires .*; wait for it \(`nemofleet lock status`\) or, if it is abandoned, "
                        r"`nemofleet lock release --force`", host2.logs[-1]), host2.logs
    host2.disconnect()  # bob took nothing: releases nothing
    assert holder(run).startswith("alice@") and len(host2.scripts) == 1
    run.use(host1)
    host1.disconnect()
    assert not run.lock.exists()


def test_failed_host_releases_at_disconnect(run):
    """pyinfra skips a failed host's remaining operations; its disconnect still releases."""
    state, host = run()
    op(state, host, "a", "echo ok", "false", "echo never")
    op(state, host, "b", "echo skipped")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a") == (False, ["echo ok", "false"])  # "false" failed: the host stops here
    assert run.lock.exists()
    host.disconnect()
    assert not run.lock.exists()


def test_a_disconnect_inside_an_operation_keeps_the_lock(run):
    """operations/reboot.py disconnects and reconnects around a reboot: not the end of the run."""
    state, host = run()
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a")[0]
    host.executing_op_hash = "reboot"
    host.disconnect()
    assert host.disconnected and run.lock.exists() and len(host.scripts) == 1
    host.executing_op_hash = None
    host.disconnect()  # the CLI's, after the run
    assert not run.lock.exists()


def test_change_detection_takes_nothing(run):
    """A run without -y iterates each operation up to its first command before executing: no lock."""
    state, host = run()
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    first = next(state.ops[host]["a"].command_generator())
    assert first.get_raw_value() == "echo change" and host.scripts == [] and not run.lock.exists()


def test_under_a_token_nothing_is_wrapped(run, monkeypatch):
    state, host = run()
    monkeypatch.setenv(driver.LOCK_TOKEN_ENV, "f" * 32)
    op(state, host, "a", "echo change")
    gen = state.ops[host]["a"].command_generator
    runlock.guard(state, host)
    assert state.ops[host]["a"].command_generator is gen and runlock.token() == "f" * 32
    monkeypatch.delenv(driver.LOCK_TOKEN_ENV)
    assert runlock.token() == runlock.RUN_TOKEN


def test_exempt_operation_takes_no_lock_and_guard_wraps_once(run):
    state, host = run()
    op(state, host, "verdict", "echo refused")
    runlock.exempt(OperationMeta("verdict", None))
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "verdict") == (True, ["echo refused"]) and not run.lock.exists()
    assert execute(state, host, "a")[0] and len(host.scripts) == 1


def test_expired_lock_of_a_killed_controller_is_taken_over(run, monkeypatch):
    state, host = run("carol")
    monkeypatch.setenv(runlock.TTL_ENV, "1m")
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a")[0]  # carol's controller is then killed: no disconnect, no release
    info = (run.lock / "info").read_text()
    expires = int(re.search(r"^expires=(\d+)$", info, re.M).group(1))
    assert expires - time.time() <= 61
    (run.lock / "info").write_text(info.replace(f"expires={expires}", f"expires={int(time.time()) - 1}"))
    state2, host2 = run("dave")
    op(state2, host2, "a", "echo change")
    runlock.guard(state2, host2)
    state2.is_executing = True
    assert execute(state2, host2, "a")[0]
    assert holder(run).startswith("dave@")
    assert re.fullmatch(r"the deploy lock of carol@\S+ since \S+ \(plain pyinfra deploy\) had expired; taken over",
                        host2.logs[0]), host2.logs


def test_long_run_refreshes_its_lock_and_stops_when_it_was_lost(run):
    state, host = run()
    for h in "abc":
        op(state, host, h, f"echo {h}")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a")[0]
    runlock._TAKEN["h"] -= runlock.DEFAULT_TTL  # long ago: the next change refreshes first
    assert execute(state, host, "b") == (True, ["echo b"])
    assert len(host.scripts) == 2 and shlex.split(host.scripts[-1])[5:7] == [str(run.lock), "refresh"]  # the refresh
    runlock._TAKEN["h"] -= runlock.DEFAULT_TTL
    subprocess.run(["rm", "-rf", str(run.lock)], check=True)  # broken with --force meanwhile
    assert execute(state, host, "c") == (False, [])
    assert host.logs[-1] == ("nemofleet stopped h: its deploy lock was lost (state=LOST); nothing more changes "
                             "here")
    n = len(host.scripts)
    host.disconnect()
    assert len(host.scripts) == n  # not ours any more: no release


def test_bad_lock_ttl_refuses_the_host_in_one_sentence(run, monkeypatch):
    state, host = run()
    monkeypatch.setenv(runlock.TTL_ENV, "30d")
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    state.is_executing = True
    assert execute(state, host, "a") == (False, [])
    assert host.logs == ["nemofleet refused h: NEMOFLEET_LOCK_TTL 30d is over 7 days; a lock left by a killed "
                         "controller would block the fleet that long (a rollout refreshes its lock every batch)"]
    assert host.scripts == []


def test_unreachable_host_at_take_and_at_release_is_a_sentence(run):
    state, host = run()
    op(state, host, "a", "echo change")
    runlock.guard(state, host)
    state.is_executing = True
    host.down = True
    assert execute(state, host, "a") == (False, [])
    assert host.logs == ["nemofleet refused h: could not take the deploy lock (No route to host)"]
    host.down = False
    assert execute(state, host, "a")[0]
    host.down = True
    host.disconnect()
    assert host.disconnected and host.logs[-1] == (
        "warning: could not release the deploy lock on h (No route to host); it expires by its TTL, and "
        "`nemofleet lock status` shows it")


def test_preflight_of_a_host_this_run_locked_passes():
    """The bootstrap path: preflight runs after the run's own take (runlock.token() is this run's)."""
    info = {"holder": "alice@ctl", "token_sha256": commands.token_digest(runlock.RUN_TOKEN), "expires": 9e9}
    assert lockinfo.lock_refusal(info, runlock.RUN_TOKEN, time.time()) is None
    assert lockinfo.lock_refusal(info, "0" * 32, time.time()) is not None


# ---------------------------------------------------------------------------- manual tokens, TTL, CLI

def test_lock_ttl_has_a_maximum():
    assert lock.parse_ttl("7d") == 7 * 86400 and lock.parse_ttl("168h") == 7 * 86400
    for bad, words in (("8d", "is over 7 days"), ("604801", "is over 7 days"), ("9" * 40, "must be seconds"),
                       ("1e9", "must be seconds"), ("٣h", "must be seconds"), ("nan", "must be seconds")):
        with pytest.raises(FleetError, match=words):
            lock.parse_ttl(bad)


def test_a_token_from_outside_must_be_one_nemofleet_made(monkeypatch):
    assert lock.check_token("0123456789abcdef" * 2) == "0123456789abcdef" * 2
    for forged in ("manual:alice@ctl", "t1", "A" * 32, "a" * 31, "a" * 64, "a" * 32 + "\n", commands.token_digest("x")):
        with pytest.raises(FleetError, match="is not a lock token nemofleet made"):
            lock.check_token(forged)
    monkeypatch.setenv(driver.LOCK_TOKEN_ENV, "manual:alice@ctl")
    monkeypatch.setattr(driver, "exec_all", lambda *a, **k: pytest.fail("a forged token reached a host"))
    with pytest.raises(FleetError, match="NEMOFLEET_LOCK_TOKEN is not a lock token"):
        lock.acquire("inv", ["h"], "m")


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """`nemofleet lock` on a one-host inventory whose host runs the scripts with bash (or is down)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    inv = tmp_path / "inv.py"
    inv.write_text("hosts = ['h1']\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(driver.LOCK_TOKEN_ENV, raising=False)
    down = set()

    def exec_all(inventory, hosts, script, timeout=0, env=None):
        out = {}
        for h in hosts:
            if h in down:
                out[h] = Exec(h, 255, "could not connect to h1: timed out", reachable=False)
                continue
            p = subprocess.run(["bash", "-c", script.replace(paths.STATE_DIR, str(state_dir))],
                               capture_output=True, text=True, timeout=30)
            out[h] = Exec(h, p.returncode, p.stdout + p.stderr)
        return out

    monkeypatch.setattr(driver, "exec_all", exec_all)
    return str(inv), down


def test_manual_lock_token_is_a_random_secret_shown_once(fleet, capsys, monkeypatch):
    inv, _ = fleet
    monkeypatch.setenv("NEMOFLEET_OPERATOR", "alice")
    assert cli.main(["lock", "acquire", inv, "--message", "maintenance"]) == 0
    out = capsys.readouterr().out
    token = re.search(r"^export NEMOFLEET_LOCK_TOKEN=([0-9a-f]{32})$", out, re.M).group(1)
    assert cli.main(["lock", "status", inv]) == 0
    status = capsys.readouterr().out
    assert "locked by alice@" in status and token not in status and "manual:" not in status
    # anyone who read `lock status`: the holder's name, the digest it stores, a well-formed guess
    monkeypatch.setenv("NEMOFLEET_OPERATOR", "bob")
    for forged in ("manual:alice@" + os.uname().nodename, commands.token_digest(token)):
        monkeypatch.setenv(driver.LOCK_TOKEN_ENV, forged)
        assert cli.main(["lock", "release", inv]) == 2
        assert "is not a lock token nemofleet made" in capsys.readouterr().err
    monkeypatch.setenv(driver.LOCK_TOKEN_ENV, "0" * 32)
    assert cli.main(["lock", "release", inv]) == 2
    cap = capsys.readouterr()
    assert "NOT released: held by alice@" in cap.out and "held by someone else" in cap.err
    monkeypatch.delenv(driver.LOCK_TOKEN_ENV)
    assert cli.main(["lock", "release", inv]) == 2
    assert "needs the holder's token in NEMOFLEET_LOCK_TOKEN" in capsys.readouterr().err
    assert cli.main(["lock", "status", inv]) == 0 and "locked by alice@" in capsys.readouterr().out
    monkeypatch.setenv(driver.LOCK_TOKEN_ENV, token)
    assert cli.main(["lock", "release", inv]) == 0 and "released" in capsys.readouterr().out
    assert cli.main(["lock", "status", inv]) == 0 and "free" in capsys.readouterr().out


def test_two_manual_locks_get_different_tokens(fleet, capsys):
    inv, _ = fleet
    tokens = set()
    for _ in range(2):
        assert cli.main(["lock", "acquire", inv]) == 0
        tokens.add(re.search(r"NEMOFLEET_LOCK_TOKEN=(\S+)", capsys.readouterr().out).group(1))
        assert cli.main(["lock", "release", inv, "--force"]) == 0
        capsys.readouterr()
    assert len(tokens) == 2


def test_lock_ttl_over_the_maximum_is_one_sentence(fleet, capsys):
    inv, _ = fleet
    assert cli.main(["lock", "acquire", inv, "--lock-ttl", "30d"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lock refused: --lock-ttl 30d is over 7 days") and err.count("\n") == 1
    assert cli.main(["lock", "status", inv]) == 0 and "free" in capsys.readouterr().out


def test_release_on_an_unreachable_host_says_unreachable(fleet, capsys, monkeypatch):
    inv, down = fleet
    down.add("h1")
    monkeypatch.setenv(driver.LOCK_TOKEN_ENV, "0" * 32)
    assert cli.main(["lock", "release", inv]) == 2
    cap = capsys.readouterr()
    assert "h1             NOT released: unreachable (could not connect to h1: timed out)" in cap.out
    assert "could not reach h1" in cap.err and "someone else" not in cap.err + cap.out
    assert cli.main(["lock", "release", inv, "--force"]) == 2 and "unreachable" in capsys.readouterr().out


# ---------------------------------------------------------------------------- real pyinfra, @local

def pyinfra_run(tmp_path, monkeypatch, ops):
    """Run `ops` [(name, shell commands, _if)] with pyinfra's own API on @local, the lock under
    tmp_path, each op guarded as deploys/nemotron.py does; returns (lock held before disconnect,
    the lock commands run, the results)."""
    from pyinfra.api import Config, Inventory, State as PyinfraState
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.operations import server

    monkeypatch.setattr(paths, "LOCK", str(tmp_path / "lock"))  # an argument of the lock program
    monkeypatch.delenv(driver.LOCK_TOKEN_ENV, raising=False)
    monkeypatch.setattr(runlock, "_TAKEN", {})
    lock_commands = []
    real_run = runlock._run
    monkeypatch.setattr(runlock, "_run", lambda s, h, script: lock_commands.append(script) or real_run(s, h, script))
    inventory = Inventory((["@local"], {}))
    state = PyinfraState(inventory, Config())
    connect_all(state)
    for name, cmds, if_ in ops:
        add_op(state, server.shell, name=name, commands=cmds, _if=if_)
    for h in inventory:
        runlock.guard(state, h)
    try:
        run_ops(state)
    except PyinfraError:
        pass  # "No hosts remaining!": the CLI then disconnects in its finally, as here
    finally:
        held = (tmp_path / "lock").exists()
        disconnect_all(state)
    return held, lock_commands, state.get_results_for_host(next(iter(inventory)))


def test_real_pyinfra_takes_before_the_first_command_and_releases_after_a_failure(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    held, lock_commands, results = pyinfra_run(tmp_path, monkeypatch, [
        ("converged", ["true"], lambda: False),
        ("the lock is held by its first command", [f"test -d {lock}"], None),
        ("fails", ["false"], None),
        ("skipped", [f"touch {tmp_path}/never"], None)])
    assert results.success_ops == 2 and results.error_ops == 1 and not (tmp_path / "never").exists()
    assert held and not lock.exists() and len(lock_commands) == 2  # take, then release at disconnect


def test_real_pyinfra_converged_run_runs_no_lock_command(tmp_path, monkeypatch):
    held, lock_commands, results = pyinfra_run(tmp_path, monkeypatch, [
        ("converged", ["true"], lambda: False), ("also", ["true"], lambda: False)])
    assert results.success_ops == 2 and not held and lock_commands == []
