"""The deploy lock on a real host (issue 25): two concurrent plain deploys of one host, the second
refused with the holder's name; a forged manual token refused; the lock of a killed controller
expires and is taken over; a converged run takes no lock.

One host is enough (a100-1): the module brings up and converges only that host when run on its
own; in a full run the session's testbed already has it. A deploy is held in the middle of its
run (so it holds the lock) by drifting a unit file, which makes it restart the instance, and
dropping the instance's port on the host, which keeps its ready wait waiting."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PYINFRA, ROOT, Run, on, pyinfra, served_alone

pytestmark = pytest.mark.e2e
HOST = "a100-1"
INV = "inventories/testbed.py"
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
DROP = "OUTPUT -p tcp --dport 8000 -j DROP"  # the instance's port: its ready wait gets no answer
LOCK = "/var/lib/nemofleet/lock"


@pytest.fixture(scope="module")
def host():
    yield from served_alone(HOST)


def nemofleet(*args, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if k != "NEMOFLEET_LOCK_TOKEN"}
    e.update(env or {})
    r = subprocess.run([NEMOFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr


def start_deploy(env: dict, data: tuple[str, ...] = ()) -> subprocess.Popen:
    """A plain deploy of HOST in the background (conftest.pyinfra's command), with `--data` items."""
    e = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=HOST, **env)
    e.pop("NEMOFLEET_LOCK_TOKEN", None)
    extra = [arg for item in data for arg in ("--data", item)]
    return subprocess.Popen([PYINFRA, "-y", INV, "deploys/nemotron.py", *extra], cwd=ROOT, env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def drift() -> None:
    """A unit file the next deploy rewrites (and so restarts its instance, then waits until ready)."""
    on(HOST, "for u in /etc/systemd/system/nemofleet-vllm-*.service; do echo '# drift' >> $u; done")


def lock_info() -> dict:
    r = on(HOST, f"cat {LOCK}/info 2>/dev/null; echo now=$(date +%s)", check=False)
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return out if "holder" in out else {}


def wait_for_holder(prefix: str, proc: subprocess.Popen, timeout: float = 600) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        info = lock_info()
        if info.get("holder", "").startswith(prefix):
            return info
        if proc.poll() is not None:
            pytest.fail(f"the deploy ended before it held the lock: {proc.stdout.read()[-4000:]}")
        time.sleep(1)
    proc.kill()
    pytest.fail(f"no lock of {prefix} after {timeout:.0f}s: {lock_info()}")


def test_converged_run_takes_no_lock(host):
    r = pyinfra(hosts=[HOST])
    assert r.rc == 0 and r.changed() == [], r.out[-4000:]
    assert "deploy lock" not in r.out and not lock_info()


def test_second_concurrent_plain_deploy_is_refused_with_the_holders_name(host):
    drift()
    on(HOST, f"iptables -I {DROP}")
    first = start_deploy({"NEMOFLEET_OPERATOR": "carol"})
    try:
        info = wait_for_holder("carol@", first)
        assert info["message"] == "plain pyinfra deploy" and 0 < int(info["expires"]) - int(info["now"]) <= 7200
        second = pyinfra(hosts=[HOST], env={"NEMOFLEET_OPERATOR": "dave"})
        assert second.rc != 0 and second.changed() == [], second.out[-4000:]
        assert re.search(rf"nemofleet refused {HOST}: this host is locked by carol@\S+ since \S+ "
                         r"\(plain pyinfra deploy\), expires .*; wait for it", second.out), second.out[-4000:]
        assert lock_info()["holder"].startswith("carol@")  # the refused run took and released nothing
    finally:
        on(HOST, f"iptables -D {DROP}", check=False)
    out = first.communicate(timeout=900)[0]
    assert first.returncode == 0, out[-4000:]
    assert "deploy lock released" in out, out[-4000:]
    assert not lock_info()
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [] and not lock_info(), again.out[-4000:]


def test_two_plain_deploys_started_at_once_one_holds_the_other_is_refused(host):
    """Both may pass preflight while the host is free: the atomic take decides, and the other stops
    before its first change with the winner's name."""
    drift()
    on(HOST, f"iptables -I {DROP}")
    # each run also wants a health schedule of its own: whichever runs second still has a change to
    # make after the first made its own (else, started a little later, it could find the units the
    # winner already rewrote and have nothing to change), so it must meet the winner's lock
    schedule = {"gina": "*/2 * * * *", "hank": "*/3 * * * *"}
    runs = {name: start_deploy({"NEMOFLEET_OPERATOR": name}, (f"health_schedule={schedule[name]}",))
            for name in ("gina", "hank")}
    winner, outs = None, {}
    try:
        end = time.time() + 600
        while not lock_info() and time.time() < end:
            time.sleep(0.5)
        winner = lock_info()["holder"].split("@")[0]
        loser = "hank" if winner == "gina" else "gina"
        out = outs[loser] = runs[loser].communicate(timeout=600)[0]
        lost = Run(subprocess.CompletedProcess([], runs[loser].returncode, out, ""))
        assert lost.rc != 0 and lost.changed() == [], out[-4000:]
        assert re.search(rf"nemofleet refused {HOST}: this host is locked by {winner}@\S+ since \S+ "
                         r"\(plain pyinfra deploy\)", out), out[-4000:]
        assert lock_info()["holder"].startswith(winner + "@")
    finally:
        on(HOST, f"iptables -D {DROP}", check=False)
        # both runs end here, whatever was asserted: a winner left running would hold the lock into
        # the next test
        outs.update({name: proc.communicate(timeout=900)[0] for name, proc in runs.items() if name not in outs})
    assert runs[winner].returncode == 0 and "deploy lock released" in outs[winner], outs[winner][-4000:]
    assert not lock_info()


def test_lock_of_a_killed_controller_expires_and_is_taken_over(host):
    drift()
    on(HOST, f"iptables -I {DROP}")
    try:
        first = start_deploy({"NEMOFLEET_OPERATOR": "erin", "NEMOFLEET_LOCK_TTL": "60"})
        info = wait_for_holder("erin@", first)
        first.kill()  # SIGKILL mid-run: nothing releases its lock
        first.wait(timeout=60)
    finally:
        on(HOST, f"iptables -D {DROP}", check=False)
    held = lock_info()
    assert held["holder"].startswith("erin@") and int(held["expires"]) - int(held["now"]) <= 60, held
    refused = pyinfra(hosts=[HOST], env={"NEMOFLEET_OPERATOR": "frank"})
    assert refused.rc != 0 and re.search(r"this host is locked by erin@", refused.out), refused.out[-4000:]
    time.sleep(max(0, int(held["expires"]) - int(lock_info()["now"]) + 2))  # by the host's clock
    drift()
    r = pyinfra(hosts=[HOST], env={"NEMOFLEET_OPERATOR": "frank"})
    assert r.rc == 0, r.out[-4000:]
    assert re.search(r"the deploy lock of erin@\S+ since \S+ \(plain pyinfra deploy\) had expired; "
                     "taken over", r.out), r.out[-4000:]
    assert not lock_info() and pyinfra(hosts=[HOST]).changed() == []


def test_forged_manual_token_is_refused(host):
    rc, out = nemofleet("lock", "acquire", INV, "--limit", HOST, "--message", "maintenance",
                        env={"NEMOFLEET_OPERATOR": "alice"})
    assert rc == 0, out
    token = re.search(r"^export NEMOFLEET_LOCK_TOKEN=([0-9a-f]{32})$", out, re.M).group(1)
    try:
        rc, status = nemofleet("lock", "status", INV, "--limit", HOST)
        assert "locked by alice@" in status and token not in status
        holder = re.search(r"locked by (alice@\S+)", status).group(1)
        # what the old token was (manual:<operator>), and a well-formed guess
        rc, out = nemofleet("lock", "release", INV, "--limit", HOST,
                            env={"NEMOFLEET_LOCK_TOKEN": f"manual:{holder}", "NEMOFLEET_OPERATOR": "bob"})
        assert rc == 2 and "NEMOFLEET_LOCK_TOKEN is not a lock token nemofleet made" in out, out
        rc, out = nemofleet("lock", "release", INV, "--limit", HOST, env={"NEMOFLEET_LOCK_TOKEN": "0" * 32})
        assert rc == 2 and f"{HOST}" in out and "NOT released: held by alice@" in out, out
        for forged in (f"manual:{holder}", "0" * 32):  # nor does a forged token let a deploy through
            plain = pyinfra(hosts=[HOST], env={"NEMOFLEET_LOCK_TOKEN": forged})
            assert plain.rc != 0 and plain.changed() == [], plain.out[-3000:]
            assert re.search(rf"nemofleet refused {HOST}: this host is locked by alice@\S+ since \S+ \(maintenance\)",
                             plain.out), plain.out[-3000:]
        assert "locked by alice@" in nemofleet("lock", "status", INV, "--limit", HOST)[1]
        rc, out = nemofleet("lock", "release", INV, "--limit", HOST, env={"NEMOFLEET_LOCK_TOKEN": token})
        assert rc == 0 and "released" in out, out
    finally:
        nemofleet("lock", "release", INV, "--limit", HOST, "--force")
    assert "free" in nemofleet("lock", "status", INV, "--limit", HOST)[1]
