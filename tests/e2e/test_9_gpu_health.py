"""GPU health (issue 27) on h100-1 (8 instances behind the front door): a GPU with a row-remap
failure at admission is left out and the host serves on the others, saying why; under streamed
load, an Xid 79 on GPU 3 is drained by the next health check (the instance on GPU 3 out of the
front door, nothing restarted, no request fails after that check, status and metrics show it, the
webhook is called once); `clear` + deploy serves on it again, and a second deploy changes nothing.

Only h100-1 is needed: the module brings up and converges that host alone when run on its own.
cron is stopped on the host during a test, so that the test's own health check is the one that acts."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, on, pyinfra, served_alone

pytestmark = pytest.mark.e2e
HOST = "h100-1"
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
HOOK = "http://127.0.0.1:9912/hook"
RESULTS = ROOT / "bench" / "results" / "gpu_health.json"
sys.path.insert(0, str(ROOT / "bench"))
import front_door as bench  # noqa: E402


@pytest.fixture(scope="module")
def served():
    yield from served_alone(HOST)


@pytest.fixture
def no_cron(served):
    on(HOST, "systemctl stop cron")
    yield
    on(HOST, "systemctl start cron")


def nemofleet(*args) -> subprocess.CompletedProcess:
    return subprocess.run([NEMOFLEET, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=dict(os.environ, NEMOFLEET_TESTBED_HOSTS=HOST))


def started() -> dict:
    names = on(HOST, "docker ps --format '{{.Names}}' | grep '^nemotron-' | sort").stdout.split()
    return {n: on(HOST, f"docker inspect -f '{{{{.State.StartedAt}}}}' {n}").stdout.strip() for n in names}


def door(name: str) -> str:
    return on(HOST, f"/usr/local/bin/nemofleet-drain state {name}").stdout.strip()


def health(env: str = "") -> subprocess.CompletedProcess:
    return on(HOST, f"{env} flock /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health", check=False)


def test_a_gpu_with_a_remap_failure_is_left_out_and_the_others_serve(no_cron):
    before = started()
    assert len(before) == 8
    try:
        assert nemofleet("testbed", "gpu-fault", HOST, "1", "remap-failure").returncode == 0
        r = pyinfra(hosts=[HOST])
        assert r.rc == 0, r.out[-4000:]
        assert "GPU 1 (GPU-8c1e7d20-6a4b-4f3c-b2d1-000000000001) is left out of the plan: remapped_rows.failure is Yes" in r.out
        assert "replace the GPU" in r.out
        after = started()
        assert sorted(after) == sorted(n for n in before if n != "nemotron-1")
        assert all(after[n] == before[n] for n in after), (before, after)  # nothing else restarted or renamed
        load = bench.phase(HOST, requests=40)
        assert load["failed"] == 0 and load["requests"] == 40, load
        plan = nemofleet("plan", "inventories/testbed.py", "--limit", HOST, "--json")
        assert json.loads(plan.stdout)[HOST]["plan"]["excluded_gpus"] == [1], plan.stdout[-2000:]
    finally:
        nemofleet("testbed", "gpu-fault", HOST, "1", "clear")
        back = pyinfra(hosts=[HOST])
        assert back.rc == 0, back.out[-4000:]
    assert "nemotron-1" in started() and door("nemotron-1") == "ready"
    assert pyinfra(hosts=[HOST]).changed() == []


def test_xid79_under_load_is_drained_by_the_next_check_and_returns_at_the_deploy(no_cron):
    receiver = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        body = self.rfile.read(int(self.headers['Content-Length']))\n"
        "        open('/tmp/gpuhook.log', 'ab').write(body + b'\\n')\n"
        "        self.send_response(204); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', 9912), H).serve_forever()\n"
    )
    on(HOST, f"cat > /tmp/gpuhook.py <<'EOF'\n{receiver}EOF\nrm -f /tmp/gpuhook.log; "
             "(setsid python3 /tmp/gpuhook.py >/dev/null 2>&1 &); sleep 1")
    env = f"WEBHOOK_URL={HOOK}"
    try:
        assert health(env).returncode == 0  # all healthy, state recorded
        before = started()
        stop = "/tmp/nf_gpu_stop"
        on(HOST, f"rm -f {stop}")
        p = bench.in_host(HOST, stop_file=stop, requests=bench.DURING_MAX)
        time.sleep(3)  # the load flows
        t_fault = time.monotonic()
        fault = nemofleet("testbed", "gpu-fault", HOST, "3", "xid79")
        assert fault.returncode == 0, fault.stdout + fault.stderr
        time.sleep(5)  # requests meet the broken GPU until the check runs
        check = health(env)
        t_check = time.monotonic()
        on(HOST, f"touch {stop}")
        between, _ = p.communicate(timeout=600)
        between = json.loads(between.strip().splitlines()[-1])
        assert check.returncode == 1
        assert ("GPU 3 (GPU-8c1e7d20-6a4b-4f3c-b2d1-000000000003) is sick: nvidia-smi reports it lost ([GPU is lost]) "
                "after Xid 79; reboot the host") in check.stdout, check.stdout
        assert door("nemotron-3") == "drain" and all(door(f"nemotron-{i}") == "ready" for i in range(8) if i != 3)
        after = bench.phase(HOST, requests=120)
        assert after["failed"] == 0 and after["requests"] == 120, after
        again = health(env)  # still drained, never restarted, no second webhook
        assert "instance nemotron-3 drained: GPU 3:" in again.stdout
        assert started() == before  # no instance restarted, the one on GPU 3 included
        hooks = on(HOST, "cat /tmp/gpuhook.log").stdout.splitlines()
        assert len(hooks) == 1 and '"instance":"nemotron-3","state":"gpu_sick"' in hooks[0], hooks
        prom = on(HOST, "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
        assert 'nemofleet_gpu_healthy{gpu="3",UUID="GPU-8c1e7d20-6a4b-4f3c-b2d1-000000000003"' in prom
        assert [ln for ln in prom.splitlines() if ln.startswith('nemofleet_gpu_healthy{gpu="3",')][0].endswith(" 0")
        st = nemofleet("status", "inventories/testbed.py", "--limit", HOST)
        assert "GPU 3 (GPU-8c1e7d20-6a4b-4f3c-b2d1-000000000003) SICK since" in st.stdout and "Xid 79" in st.stdout, st.stdout
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"between_fault_and_check": between, "after_check": after,
                                       "fault_to_check_s": round(t_check - t_fault, 1)}, indent=2) + "\n")

        assert nemofleet("testbed", "gpu-fault", HOST, "3", "clear").returncode == 0
        back = pyinfra(hosts=[HOST])
        assert back.rc == 0, back.out[-4000:]
        changed = back.changed()  # only the step that puts the drained instance back
        assert len(changed) == 1 and "GPUs healthy again" in changed[0], changed
        assert door("nemotron-3") == "ready" and started() == before
        served_again = bench.phase(HOST, requests=80)
        assert served_again["failed"] == 0, served_again
        assert pyinfra(hosts=[HOST]).changed() == []
        assert "SICK" not in nemofleet("status", "inventories/testbed.py", "--limit", HOST).stdout
    finally:
        nemofleet("testbed", "gpu-fault", HOST, "3", "clear")
        on(HOST, "pkill -f /tmp/gpuhook.py; rm -f /tmp/gpuhook.py /tmp/gpuhook.log", check=False)
