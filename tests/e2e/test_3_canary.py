"""The SLO-gated canary under client load (issue 38): a release that passes every health check
but serves five times slower (-slow) or fails every 20th completion (-flaky) is rolled back by the
bake with exit 1, the hosts outside the canary never touched and failing no request; a good
release (-nf2) goes everywhere. Timings are the bench's (bench/canary.py), not asserted here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, on

sys.path.insert(0, str(ROOT / "bench"))
import canary as bench  # noqa: E402  the bench's load generator, run inside each test host
from conftest import pyinfra  # noqa: E402

pytestmark = pytest.mark.e2e
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
BASE = "vllm/vllm-openai:v0.27.1"
HOSTS = ["a100-1", "h100-1", "h200-1"]


def release(host):
    return on(host, "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip()


def rollout_under_load(tag):
    loads = {h: bench.start_load(h) for h in HOSTS}
    try:
        r = subprocess.run([NEMOFLEET, "rollout", "inventories/testbed.py", "--canary", "1", "--batch", "1",
                            "--wait", "120", "--bake", "20", "--json", "--data", f"vllm_image={BASE}-{tag}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL,
                           env=dict(os.environ))
    finally:
        done = {h: bench.stop_load(h, p) for h, p in loads.items()}
    return r.returncode, json.loads(r.stdout), r.stderr, done


@pytest.mark.parametrize("tag, slo", [("slow", "p95 TTFT"), ("flaky", "error rate")])
def test_a_worse_release_is_rolled_back_by_the_canary_gate(converged, changes, tag, slo):
    before = {h: release(h) for h in HOSTS}
    rc, doc, err, load = rollout_under_load(tag)
    changes.made("a100-1", f"a canary of -{tag}")
    assert rc == 1, err[-3000:]
    assert doc["result"] == "rolled_back", doc
    assert doc["hosts"]["a100-1"]["canary"] is True and doc["hosts"]["a100-1"]["result"] == "rolled back"
    b = doc["batches"][0]
    assert b["verdict"] == "fail" and b["slo"] == slo and b["baseline"]["hosts"] == ["h100-1", "h200-1"]
    assert f"{slo}: canary" in err and "vs baseline" in err  # which SLO broke, with both figures
    for h in ("h100-1", "h200-1"):  # never touched, and no client request failed there
        assert doc["hosts"][h]["result"] == "not reached" and release(h) == before[h]
        assert load[h]["requests"] > 50 and load[h]["failed"] == 0, load
    assert release("a100-1") == before["a100-1"]
    assert "canary fail:" in on("a100-1", "tail -n 5 /var/lib/nemofleet/audit.log").stdout
    st = subprocess.run([NEMOFLEET, "status", "inventories/testbed.py"], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, stdin=subprocess.DEVNULL)
    assert st.stdout.count("(in sync)") >= 3 and "DRIFT" not in st.stdout.split("== broken-1")[0], st.stdout
    assert "last canary gate" in st.stdout and f"fail: {slo}" in st.stdout


def test_a_good_release_passes_every_bake(converged, changes):
    rc, doc, err, load = rollout_under_load("nf2")
    for h in HOSTS:
        changes.made(h, "a canary rollout of -nf2")
    assert rc == 0, err[-3000:]
    assert doc["result"] == "ok" and [b["verdict"] for b in doc["batches"]] == ["pass"] * 3
    assert doc["batches"][2]["baseline"]["kind"].startswith("the same hosts' own")  # no old host left
    for h in HOSTS:
        assert doc["hosts"][h]["result"] == "ok" and doc["hosts"][h]["to"] == release(h) != doc["hosts"][h]["from"]
        assert on(h, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip() == f"{BASE}-nf2"
    # its own way back: the fleet returns to the base release, as the tests after this one expect
    back = pyinfra(hosts=HOSTS)
    assert back.rc == 0, back.out[-3000:]
    for h in HOSTS:
        assert on(h, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip() == BASE
