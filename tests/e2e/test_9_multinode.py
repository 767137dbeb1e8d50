"""A multi-node serving group on two testbed hosts (issue 18): mn-1 (head) and mn-2 (headless
worker) serve one model, TP1 x PP2, on vLLM's multiprocessing executor across nodes. The stand-in
server checks the multi-node arguments and the worker really rendezvouses with the head over the
testbed network (a TCP handshake on the head's --master-port); the head's /health answers only
once the worker has joined, and a lost member takes the group down until it is back."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, docker_available, on, pyinfra
import nemofleet_testbed as testbed

pytestmark = pytest.mark.e2e
HEAD, WORKER = "mn-1", "mn-2"
MEMBERS = [HEAD, WORKER]
UNIT = "nemofleet-vllm-nemotron-mn.service"
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))


@pytest.fixture(scope="module")
def group():
    if not docker_available():
        pytest.fail("the end-to-end tests need a running Docker engine and debootstrap (run .ci/run as root)")
    was_up = bool(testbed.read_state().get("hosts"))
    testbed.up(only=MEMBERS)
    first = pyinfra(hosts=MEMBERS)
    yield first
    if os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        for h in MEMBERS:
            testbed.remove(h)
    if not was_up and os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()


def address(host):
    return on(host, "ip -o -4 addr show eth0 | awk '{print $4}' | cut -d/ -f1").stdout.strip()


def journal(host):
    return on(host, f"journalctl -u {UNIT} -o cat --no-pager").stdout


def health(host):
    return on(host, "/usr/local/bin/nemofleet-health", check=False)


def wait_healthy(host, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = health(host)
        if r.returncode == 0:
            return time.time() - t0
        time.sleep(2)
    raise AssertionError(f"{host} not healthy after {timeout}s: {r.stdout}")


def test_group_converges_with_a_real_rendezvous_and_changes_nothing_twice(group):
    assert group.rc == 0, group.out[-6000:]
    head_ip, worker_ip = address(HEAD), address(WORKER)
    # the arguments each member runs: the same line but for the rank and --headless
    args = {h: on(h, "docker inspect -f '{{json .Args}}' nemotron-mn").stdout for h in MEMBERS}
    for h in MEMBERS:
        assert '"--nnodes","2"' in args[h] and f'"--master-addr","{head_ip}"' in args[h]
        assert '"--pipeline-parallel-size","2"' in args[h] and '"--master-port","29501"' in args[h]
        assert on(h, "docker inspect -f '{{.HostConfig.NetworkMode}}' nemotron-mn").stdout.strip() == "host"
    assert '"--node-rank","0"' in args[HEAD] and "--headless" not in args[HEAD]
    assert '"--node-rank","1"' in args[WORKER] and '"--headless"' in args[WORKER]
    env = on(WORKER, "docker inspect -f '{{json .Config.Env}}' nemotron-mn").stdout
    assert f"VLLM_HOST_IP={worker_ip}" in env and "NCCL_SOCKET_IFNAME=eth0" in env and "GLOO_SOCKET_IFNAME=eth0" in env
    # the handshake happened over the testbed network, worker -> head
    assert f"node 1 joined from {worker_ip}" in journal(HEAD)
    assert f"node 1 joined the head at {head_ip}:29501" in journal(WORKER)
    # the head serves the group's API; the worker has none
    key = on(HEAD, "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env").stdout.strip().strip("'\"")
    body = '{"model":"nemotron-3.5-lightning","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
    chat = on(HEAD, f"curl -fsS -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                    f"-d '{body}' http://127.0.0.1:8000/v1/chat/completions")
    assert '"choices"' in chat.stdout
    assert on(WORKER, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health", check=False).stdout != "200"
    # the plan said what it did and why
    assert "fits one host of serving_group mn" in group.out and "no InfiniBand/RoCE adapter on mn-1, mn-2" in group.out
    assert "not encrypted" in group.out
    # health of both members, and the group metric
    assert health(HEAD).returncode == 0 and health(WORKER).returncode == 0
    prom = on(HEAD, "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    assert 'nemofleet_serving_group_member_up{group="mn",role="head",rank="0",instance="nemotron-mn"} 1' in prom
    # Molecule's idempotence step, and what it costs: each member's HostFacts and read-ahead batch,
    # its HostFacts again for the other member's plan, and the worker's probe of the head's port
    second = pyinfra(hosts=MEMBERS, extra=["-vv"])
    assert second.rc == 0 and second.changed() == [], second.changed()
    for h, most in ((HEAD, 3), (WORKER, 4)):
        sent = [ln for ln in second.out.splitlines() if ln.startswith(f"[{h}] >>> ")]
        assert len(sent) <= most, "\n".join(x[:160] for x in sent)


def test_one_member_alone_is_refused_and_changes_nothing(group):
    before = on(WORKER, f"systemctl show -p ActiveEnterTimestamp --value {UNIT}").stdout
    r = pyinfra(hosts=MEMBERS, extra=["--limit", WORKER])
    assert r.rc != 0
    assert "mn-1 is not part of this run (deploy every member of mn together: --limit mn-1,mn-2)" in r.out, r.out[-3000:]
    assert r.changed() == []
    assert on(WORKER, f"systemctl show -p ActiveEnterTimestamp --value {UNIT}").stdout == before


def test_a_worker_that_cannot_reach_the_head_is_refused_before_anything_changes(group):
    """A firewall that drops the rendezvous port (new connections only: the running group keeps
    its link) is found by the worker's preflight probe, in one sentence; nothing changes."""
    rule = f"OUTPUT -p tcp --syn -d {address(HEAD)} --dport 29501 -j DROP"
    on(WORKER, f"iptables -I {rule}")
    try:
        r = pyinfra(hosts=MEMBERS)
    finally:
        on(WORKER, f"iptables -D {rule}")
    assert r.rc != 0
    assert f"serving_group mn: this host gets no answer from the head mn-1 at {address(HEAD)}:29501 within 3 s" in r.out
    assert r.changed() == [], r.changed()
    ok = pyinfra(hosts=MEMBERS)
    assert ok.rc == 0 and ok.changed() == [], ok.out[-3000:]


def test_a_lost_member_takes_the_group_down_until_it_is_back(group):
    on(WORKER, f"systemctl stop {UNIT}")
    t0 = time.time()
    while health(HEAD).returncode == 0 and time.time() - t0 < 60:
        time.sleep(1)
    down_after = time.time() - t0
    assert down_after < 60, "the head still answered /health with a member lost"
    assert "UNHEALTHY" in health(HEAD).stdout and "is not active" in health(WORKER).stdout
    prom = on(HEAD, "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    assert re.search(r'nemofleet_serving_group_member_up\{group="mn",role="head".*\} 0', prom)
    assert "node 1 left the group" in journal(HEAD)
    on(WORKER, f"systemctl start {UNIT}")
    back_after = wait_healthy(HEAD)
    assert health(WORKER).returncode == 0
    print(f"group down {down_after:.1f}s after the worker stopped; back {back_after:.1f}s after it started")


def test_rollout_restarts_and_gates_the_group_as_one_unit(group):
    old = {h: on(h, "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip() for h in MEMBERS}
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(MEMBERS))
    r = subprocess.run([NEMOFLEET, "rollout", "inventories/testbed.py", "--wait", "120", "--data", "max_num_seqs=16"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "batch 1: mn-1, mn-2" in out  # one unit, one batch
    new = {h: on(h, "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip() for h in MEMBERS}
    for h in MEMBERS:
        assert new[h] != old[h] and re.search(rf"^{h}\s+{old[h]} -> {new[h]}\s+ok\b", out, re.M), out
        assert '"--max-num-seqs","16"' in on(h, "docker inspect -f '{{json .Args}}' nemotron-mn").stdout
    # back to the inventory's release, and nothing left to change
    back = pyinfra(hosts=MEMBERS)
    assert back.rc == 0, back.out[-3000:]
    wait_healthy(HEAD)
    again = pyinfra(hosts=MEMBERS)
    assert again.changed() == [], again.out[-5000:]


@pytest.mark.parametrize("planted", [
    "10.0.0.9$(cd;touch${IFS}nf-pwned)",  # command substitution in an IPv4 address
    "fd00::9%eth0$(cd;touch${IFS}nf-pwned)",  # a crafted IPv6 scope id (the audit's root shell)
    "10.0.0.9;cd;touch${IFS}nf-pwned",
    "10.0.0.9`cd;touch${IFS}nf-pwned`",
])
def test_a_compromised_head_s_address_never_runs_on_a_worker(group, planted):
    """The head's facts are what a compromised or odd head says: its `ip -o addr` gains a line whose
    address carries a payload (the head's own `ip`, shadowed). The group's deploy reads the head's
    addresses for every worker's unit; whatever it decides (plan on the real address, or refuse the
    group naming the head), the payload reaches no command line and runs nowhere."""
    shim = ("#!/bin/sh\n/sbin/ip \"$@\"; rc=$?\n"
            "case \"$*\" in *addr*) printf '%s\\n' '9: eth0    inet " + planted + "/24 scope global eth0' ;; esac\n"
            "exit $rc\n")
    on(HEAD, f"cat > /usr/local/sbin/ip <<'EOF'\n{shim}EOF\nchmod 755 /usr/local/sbin/ip; rm -f /root/nf-pwned /tmp/nf-pwned")
    try:
        assert planted in on(HEAD, "ip -o addr show").stdout
        units = {h: on(h, f"cat /etc/systemd/system/{UNIT}").stdout for h in MEMBERS}
        r = pyinfra(hosts=MEMBERS)
        out = r.out
        status = subprocess.run([NEMOFLEET, "status", "inventories/testbed.py"], cwd=ROOT, capture_output=True,
                                text=True, timeout=600, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(MEMBERS)))
    finally:
        on(HEAD, "rm -f /usr/local/sbin/ip")
    assert "Traceback" not in out + status.stdout + status.stderr, out[-3000:]
    for h in MEMBERS:
        assert on(h, "ls /root/nf-pwned /tmp/nf-pwned 2>/dev/null", check=False).stdout == "", f"the payload ran on {h}"
        assert on(h, f"cat /etc/systemd/system/{UNIT}").stdout == units[h]  # the units name the real address
        assert "nf-pwned" not in on(h, f"systemctl show -p ExecStartPre -p ExecStart {UNIT}").stdout
    if r.rc:  # refused: the group, naming the head as the member whose facts are bad
        assert "mn-1" in out and r.changed() == [], out[-3000:]
    else:
        assert r.changed() == [], out[-3000:]
