"""Load figures on a real converged host: the health script reads the instance's vLLM /metrics into
the textfile under nemofleet names with the instance label, and `nemofleet status` shows them.

One host is enough (NEMOFLEET_METRICS_HOST, default h200-1): the module brings up and converges
only that host when run on its own; in a full run the session's testbed already has it."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, on, served_alone

pytestmark = pytest.mark.e2e
HOST = os.environ.get("NEMOFLEET_METRICS_HOST", "h200-1")
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
PROM = "/var/lib/prometheus/node-exporter/nemofleet.prom"
HEALTH = "flock -w 60 /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health"
LOAD = re.compile(r'^nemofleet_vllm_(num_requests_running|num_requests_waiting|kv_cache_usage_ratio)'
                  r'\{instance="([^"]+)"\} (\S+)$', re.M)


@pytest.fixture(scope="module")
def served():
    yield from served_alone(HOST)


def load(text: str) -> dict[tuple[str, str], str]:
    return {(m.group(2), m.group(1)): m.group(3) for m in LOAD.finditer(text)}


def test_health_exports_the_load_of_each_instance_and_status_shows_it(served):
    # a chat request held in flight for a while (a stand-in knob), sent like any client, with the key
    body = ('{"model":"nemotron-3.5-lightning","messages":[{"role":"user","content":"hi"}],'
            '"max_tokens":64,"standin_hold_seconds":40}')
    on(served, "H=/etc/nemofleet/api-auth.header; nohup curl -s --max-time 60 $([ -r $H ] && echo -H @$H) "
               f"-H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:8000/v1/chat/completions "
               ">/dev/null 2>&1 </dev/null &")
    deadline, figures = time.time() + 20, {}
    while time.time() < deadline:
        on(served, HEALTH)
        prom = on(served, f"cat {PROM}").stdout
        figures = load(prom)
        if figures.get(("nemotron-0", "num_requests_running")) == "1":
            break
        time.sleep(1)
    assert figures.get(("nemotron-0", "num_requests_running")) == "1", prom
    assert figures[("nemotron-0", "num_requests_waiting")] == "0"
    assert 0 < float(figures[("nemotron-0", "kv_cache_usage_ratio")]) < 0.1
    for metric in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"):
        assert f"# TYPE nemofleet_vllm_{metric} gauge" in prom
    assert "vllm:" not in prom.replace("(vllm:", "")  # only in HELP texts: Prometheus names have no ':'

    r = subprocess.run([NEMOFLEET, "status", "inventories/testbed.py", "--limit", served], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, NEMOFLEET_TESTBED_HOSTS=served))
    row = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith("nemotron-0 ")), "")
    assert re.search(r"healthy +last healthy .* running +1 waiting +0 KV +\d+\.\d%", row), r.stdout + r.stderr


def test_an_instance_whose_metrics_cannot_be_read_has_no_load_lines(served):
    # nothing listens on port 1: /health and /metrics fail at once; no restart, no zeros
    r = on(served, f"FAIL_RESTART=0 VLLM_URL=http://127.0.0.1:1 {HEALTH}", check=False)
    prom = on(served, f"cat {PROM}").stdout
    assert r.returncode == 1 and 'nemofleet_vllm_up{instance="nemotron-0"' in prom, r.stdout + prom
    assert load(prom) == {}, prom
    deadline = time.time() + 60  # back to healthy with its load lines
    while time.time() < deadline and on(served, HEALTH, check=False).returncode:
        time.sleep(2)
    assert ("nemotron-0", "num_requests_running") in load(on(served, f"cat {PROM}").stdout)
