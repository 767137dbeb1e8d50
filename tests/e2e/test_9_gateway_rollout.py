"""Zero failed requests through a rollout (issue 49): gw-1 configured by the testbed inventory
alone (NEMOFLEET_TESTBED_GATEWAY=1) in front of a100-1 and h200-1, steady client load through it
(the bench's generator, run inside gw-1). A good release (-nf2) rolls out with the canary at its
weight and no client request failing; a flaky canary (-flaky: every 20th completion a 500) is
rolled back by the gate while the gateway retries its 500s on the other host, so no client
request fails; a controller killed mid-rollout leaves its drain, which `nemofleet status` names and
the next rollout puts back.

Brings up only the hosts it needs when run on its own; the GPU hosts go back to loopback after."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, on, pyinfra

sys.path.insert(0, str(ROOT / "bench"))
import canary as bench  # noqa: E402  the bench's load generator, run inside gw-1

from nemofleet import remote, shell  # noqa: E402
from nemofleet.fleet import gateway  # noqa: E402

pytestmark = pytest.mark.e2e
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
BASE = "vllm/vllm-openai:v0.27.1"
GPU_HOSTS = ["a100-1", "h200-1"]
GW = "gw-1"
MODEL = "nemotron-3.5-lightning"
FIGURES: dict = {}


def env() -> dict:
    return dict(os.environ, NEMOFLEET_TESTBED_GATEWAY="1", NEMOFLEET_TESTBED_HOSTS=",".join([*GPU_HOSTS, GW]))


@pytest.fixture(scope="module")
def fleet():
    import nemofleet_testbed as testbed

    was_up = bool(testbed.read_state().get("hosts"))
    gw_was_up = GW in (testbed.read_state().get("hosts") or {})
    testbed.up(only=[*GPU_HOSTS, GW])
    os.environ["NEMOFLEET_TESTBED_GATEWAY"] = "1"
    try:
        r = pyinfra(hosts=GPU_HOSTS)  # they listen where gw-1 reaches them (the inventory's gateway data)
        assert r.rc == 0, r.out[-6000:]
        r = pyinfra("deploys/gateway.py", hosts=[GW])  # no --data: the inventory configures it
        assert r.rc == 0, r.out[-6000:]
        wait_up(GPU_HOSTS)
        yield r
    finally:
        os.environ.pop("NEMOFLEET_TESTBED_GATEWAY", None)
        print(f"\ngateway rollout figures: {json.dumps(FIGURES)}")
        (testbed.testbed_dir() / "gateway-rollout-figures.json").write_text(json.dumps(FIGURES, indent=2) + "\n")
        keep = os.environ.get("NEMOFLEET_KEEP_TESTBED") == "1"
        if not was_up and not keep:
            testbed.down()
        else:
            if not gw_was_up and not keep:
                testbed.remove(GW)
            subprocess.run([NEMOFLEET, "lock", "release", "inventories/testbed.py", "--force"], cwd=ROOT,
                           capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
            assert pyinfra(hosts=GPU_HOSTS).rc == 0  # back on loopback and the base release


def servers() -> dict:
    r = on(GW, shell.join(remote.argv("haproxy_api", "/run/haproxy/nemofleet-admin.sock", "vllm",
                                      "/var/lib/haproxy/nemofleet-server-state", 20, "show")), check=False)
    return gateway.parse(r.stdout.splitlines())


def wait_up(hosts, timeout=120):
    t = time.time()
    while not all(servers().get(h) and servers()[h].op == 2 for h in hosts):
        assert time.time() - t < timeout, servers()
        time.sleep(1)


def release(host):
    return on(host, "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip()


def stot() -> dict:
    """Requests each server of the gateway took so far (`show stat`)."""
    text = on(GW, "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect("
                  "'/run/haproxy/nemofleet-admin.sock');s.sendall(b'show stat\\n');"
                  "import sys;sys.stdout.write(s.makefile().read())\"").stdout
    rows = [ln.split(",") for ln in text.splitlines() if ln.startswith("vllm,")]
    col = text.splitlines()[0].lstrip("# ").split(",").index("stot")
    return {r[1]: int(r[col] or 0) for r in rows if r[1] not in ("BACKEND", "FRONTEND")}


def rollout_under_load(tag, *args):
    load = bench.start_load(GW, MODEL, clients=3)
    time.sleep(3)
    before = stot()
    try:
        r = subprocess.run([NEMOFLEET, "rollout", "inventories/testbed.py", "--canary", "1", "--batch", "1",
                            "--wait", "120", "--bake", "20", "--slo-min-requests", "20", "--json", *args,
                            "--data", f"vllm_image={BASE}-{tag}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=1200, stdin=subprocess.DEVNULL, env=env())
    finally:
        done = bench.stop_load(GW, load)
    after = stot()
    took = {h: after.get(h, 0) - before.get(h, 0) for h in GPU_HOSTS}
    return r.returncode, json.loads(r.stdout), r.stderr, done, took


def test_the_gateway_comes_from_the_inventory_alone_and_retries_failed_answers(fleet):
    text = on(GW, "cat /etc/haproxy/haproxy.cfg").stdout
    assert "balance roundrobin" in text and "retry-on conn-failure empty-response 500 502 503 504" in text
    assert "option http-buffer-request" in text and "load-server-state-from-file global" in text
    assert {h: s.op for h, s in servers().items() if h in GPU_HOSTS} == {"a100-1": 2, "h200-1": 2}


def api(*args) -> dict:
    r = on(GW, shell.join(remote.argv("haproxy_api", "/run/haproxy/nemofleet-admin.sock", "vllm",
                                      "/var/lib/haproxy/nemofleet-server-state", 20, *args)))
    return gateway.parse(r.stdout.splitlines())


def worker() -> str:
    """The HAProxy worker that answers the runtime API now (a reload starts a new one)."""
    text = on(GW, "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect("
                  "'/run/haproxy/nemofleet-admin.sock');s.sendall(b'show info\\n');"
                  "import sys;sys.stdout.write(s.makefile().read())\"").stdout
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Pid:")), "")


def test_a_reload_of_the_gateway_keeps_a_drain_and_a_weight(fleet):
    pid, old = on(GW, "systemctl show -p MainPID --value haproxy").stdout.strip(), worker()
    assert api("drain", "a100-1")["a100-1"].drained and api("weight", 7, "h200-1")["h200-1"].weight == 7
    r = pyinfra("deploys/gateway.py", hosts=[GW], data={"gateway_fall": "4"})  # a new config, reloaded
    assert r.rc == 0 and "fall 4 rise 2" in on(GW, "cat /etc/haproxy/haproxy.cfg").stdout, r.out[-3000:]
    assert on(GW, "systemctl show -p MainPID --value haproxy").stdout.strip() == pid
    t = time.time()
    while worker() in (old, ""):  # the new worker, started from the new config and the state file
        assert time.time() - t < 30, "no new HAProxy worker after the reload"
        time.sleep(0.5)
    now = servers()
    assert now["a100-1"].drained and now["h200-1"].weight == 7, now
    assert not api("ready", "a100-1", "h200-1")["a100-1"].drained
    assert pyinfra("deploys/gateway.py", hosts=[GW]).rc == 0
    now = servers()
    assert not now["a100-1"].drained and now["h200-1"].weight == gateway.FULL, now


def test_a_good_release_rolls_out_with_no_failed_client_request(fleet):
    rc, doc, err, load, took = rollout_under_load("nf2")
    FIGURES["nf2"] = {"requests": load["requests"], "failed": load["failed"], "errors": load["errors"],
                      "steps": doc["batches"][0].get("steps"), "served": took}
    assert rc == 0, err[-3000:]
    assert doc["result"] == "ok" and [b["verdict"] for b in doc["batches"]] == ["pass", "pass"]
    step = doc["batches"][0]["steps"][0]
    assert step["share"] == 0.1 and step["weight"] == 11  # 11 / (11 + 100): 9.9 % of two hosts' requests
    assert doc["batches"][0]["canary_figures"]["requests"] >= 10
    assert "gateway: a100-1 drained" in err and "a100-1 at weight 11 of 100" in err
    for h in GPU_HOSTS:
        assert on(h, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip() == f"{BASE}-nf2"
    assert load["requests"] > 50 and load["failed"] == 0, load
    assert all(not s.drained and s.weight == gateway.FULL for h, s in servers().items() if h in GPU_HOSTS)
    # and back: `nemofleet rollback` under the same load, each host drained while it restarts
    rc, out, load = under_load([NEMOFLEET, "rollback", "inventories/testbed.py", "--wait", "120"])
    FIGURES["rollback"] = {"requests": load["requests"], "failed": load["failed"], "errors": load["errors"]}
    assert rc == 0, out[-3000:]
    for h in GPU_HOSTS:
        assert on(h, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip() == BASE
    assert load["requests"] > 20 and load["failed"] == 0, load
    wait_up(GPU_HOSTS)


def under_load(argv):
    load = bench.start_load(GW, MODEL, clients=3)
    time.sleep(3)
    try:
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL,
                           env=env())
    finally:
        done = bench.stop_load(GW, load)
    return r.returncode, r.stdout + r.stderr, done


def test_a_rebuild_under_load_fails_no_client_request(fleet):
    rc, out, load = under_load([NEMOFLEET, "rebuild", "inventories/testbed.py", "a100-1", "--wait", "120"])
    FIGURES["rebuild"] = {"requests": load["requests"], "failed": load["failed"], "errors": load["errors"]}
    assert rc == 0, out[-3000:]
    assert "gateway: a100-1 drained" in out and load["requests"] > 20 and load["failed"] == 0, load
    assert all(not s.drained and s.weight == gateway.FULL for h, s in servers().items() if h in GPU_HOSTS)


@pytest.mark.parametrize("tag, slo", [("flaky", "error rate"), ("slow", "p95 TTFT")])
def test_a_bad_canary_is_rolled_back_and_its_500s_are_retried_on_the_other_host(fleet, tag, slo):
    before = {h: release(h) for h in GPU_HOSTS}
    t0 = time.time()
    rc, doc, err, load, took = rollout_under_load(tag)
    share = took["a100-1"] / max(1, sum(took.values()))
    # the bad release's share while it baked (the measure): the gate's own figures of the bake,
    # the canary's requests against the baseline's; the whole rollout's share also counts the canary
    # host back at full weight after its rollback, for as long as the rollout then takes
    bake = doc["batches"][0] if doc["batches"] else {}
    c, b = ((bake.get(k) or {}).get("requests") or 0 for k in ("canary_figures", "baseline_figures"))
    baked = c / max(1, c + b)
    FIGURES[tag] = {"back_on_old_release_s": round(time.time() - t0, 1), "requests": load["requests"],
                    "failed": load["failed"], "errors": load["errors"], "canary_share_bake": round(baked, 3),
                    "canary_share_whole_rollout": round(share, 3), "served": took,
                    "verdict": bake.get("reason")}
    assert rc == 1, err[-3000:]
    assert doc["result"] == "rolled_back" and doc["batches"][0]["slo"] == slo, doc
    assert {h: release(h) for h in GPU_HOSTS} == before
    assert load["requests"] > 50 and load["failed"] == 0, load  # a flaky canary's 500s were retried on h200-1
    assert 0 < baked <= 0.12, (c, b)  # its weight (10 %) + 2 points, while it baked
    assert all(not s.drained and s.weight == gateway.FULL for h, s in servers().items() if h in GPU_HOSTS)


def test_a_killed_controller_leaves_a_drain_that_status_names_and_the_next_rollout_puts_back(fleet):
    p = subprocess.Popen([NEMOFLEET, "rollout", "inventories/testbed.py", "--bake", "0", "--wait", "120",
                          "--data", f"vllm_image={BASE}-nf2"], cwd=ROOT, env=env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t = time.time()
        while not (servers().get("a100-1") and servers()["a100-1"].drained):
            assert time.time() - t < 180 and p.poll() is None, "the rollout never drained a100-1"
            time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the controller and its pyinfra, as a crash would
        p.wait()
    st = subprocess.run([NEMOFLEET, "status", "inventories/testbed.py"], cwd=ROOT, env=env(), capture_output=True,
                        text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert "gateway gw-1: a100-1 is drained (a rollout that stopped left it so): the next `nemofleet rollout`" \
        in st.stdout, st.stdout[-3000:]
    r = subprocess.run([NEMOFLEET, "lock", "release", "inventories/testbed.py", "--force"], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([NEMOFLEET, "rollout", "inventories/testbed.py", "--bake", "0", "--wait", "120"], cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "a100-1 left drained or at a canary weight by a run that stopped: set ready" in r.stdout, r.stdout[-3000:]
    assert all(not s.drained and s.weight == gateway.FULL for h, s in servers().items() if h in GPU_HOSTS)
    for h in GPU_HOSTS:
        assert on(h, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip() == BASE
