"""Load figures an operator can look at: the health script reads each instance's vLLM /metrics into
the textfile (nemofleet_* names, an `instance` label), `nemofleet status` shows them, and the
Grafana dashboard and docs/monitoring.md name only metrics the health script exports."""
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import standin_server

from nemofleet.fleet.status import gpu_lines, load_text, unit_lines
from nemofleet.plan import Gpu
from opharness import make_plan  # noqa: E402
from nemofleet.render import health_config, health_program
from nemofleet.settings import defaults

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "src" / "nemofleet" / "remote" / "health.py"  # the health program
DASHBOARD = ROOT / "docs" / "grafana" / "nemofleet.json"
MONITORING = ROOT / "docs" / "monitoring.md"
GPUS = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, "9.0") for i in range(2)]
EXPORTED = set(re.findall(r"nemofleet_[a-z_]+", TEMPLATE.read_text()))

UNITS = [
    "release id=r1",
    "unit nemofleet-vllm-nemotron-0.service active nemofleet vLLM nemotron-0 (nemotron on GPU 0)",
    "unit nemofleet-vllm-nemotron-1.service failed nemofleet vLLM nemotron-1 (nemotron on GPU 1)",
    'prom nemofleet_vllm_up{instance="nemotron-0",model="nemotron",port="8000"} 1',
    'prom nemofleet_vllm_up{instance="nemotron-1",model="nemotron",port="8001"} 0',
    'prom nemofleet_vllm_last_success_timestamp_seconds{instance="nemotron-0"} 990',
    'prom nemofleet_vllm_last_success_timestamp_seconds{instance="nemotron-1"} 0',
]


# --- nemofleet status ---------------------------------------------------------------------------

def test_status_lines_a_host_cannot_have_printed_are_left_out():
    """A unit line of two words (it raised IndexError), a drained GPU's time in non-ASCII digits or
    beyond any clock (int('²') raised, gmtime overflowed), a last-success time of 5000 digits."""
    lines = ["unit nemofleet-vllm-x.service", "unit", *UNITS,
             'prom nemofleet_vllm_last_success_timestamp_seconds{instance="nemotron-1"} ' + "9" * 5000]
    out = unit_lines(lines, 1000.0)
    assert len(out) == 2 and out[1].startswith("nemotron-1") and "never" in out[1]
    uuid = "GPU-bab4e095-173a-5610-3df3-6282798f662e"
    assert gpu_lines([f"gpusick {uuid} ١٧٠٠٠٠٠٠٠٠ 0 xid 79", f"gpusick {uuid} ² 0 x", f"gpusick {uuid} {10**20} 0 x",
                      f"gpusick {uuid} 1700000000 0 xid 79"]) == [
        f"GPU 0 ({uuid}) SICK since 2023-11-14T22:13:20Z, its instances out of the front door: xid 79"]
    assert load_text({"num_requests_running": "1e309", "num_requests_waiting": "NaN", "kv_cache_usage_ratio": "1.2e-05"}) \
        == "running   - waiting   - KV   0.0%"


def test_status_shows_running_waiting_and_kv_per_instance():
    lines = UNITS + ['prom nemofleet_vllm_num_requests_running{instance="nemotron-0"} 3',
                     'prom nemofleet_vllm_num_requests_waiting{instance="nemotron-0"} 12',
                     'prom nemofleet_vllm_kv_cache_usage_ratio{instance="nemotron-0"} 0.4567']
    first, second = unit_lines(lines, 1000)
    assert first == ("nemotron-0     active     healthy    last healthy 10s ago    "
                     "running   3 waiting  12 KV  45.7%  nemotron on GPU 0")
    # an instance whose /metrics could not be read has no load lines: dashes, never zeros
    assert second == ("nemotron-1     failed     UNHEALTHY  last healthy never      "
                      "running   - waiting   - KV      -  nemotron on GPU 1")


def test_load_figures_belong_to_their_own_instance():
    lines = UNITS + ['prom nemofleet_vllm_num_requests_running{instance="nemotron-1"} 7',
                     'prom nemofleet_vllm_num_requests_running{instance="nemotron-10"} 9']
    first, second = unit_lines(lines, 1000)
    assert "running   - waiting" in first and "running   7 waiting   - KV      -" in second


@pytest.mark.parametrize("figures, text", [
    ({}, "running   - waiting   - KV      -"),
    ({"num_requests_running": "0", "num_requests_waiting": "0", "kv_cache_usage_ratio": "0"},
     "running   0 waiting   0 KV   0.0%"),
    ({"num_requests_running": "1234", "kv_cache_usage_ratio": "1"}, "running 1234 waiting   - KV 100.0%"),
    ({"num_requests_running": "2.0", "kv_cache_usage_ratio": "0.0125"}, "running   2 waiting   - KV   1.2%"),
    ({"num_requests_running": "NaN", "num_requests_waiting": "x", "kv_cache_usage_ratio": "nan"},
     "running   - waiting   - KV      -"),
])
def test_load_text(figures, text):
    assert load_text(figures) == text


# --- the health script reads /metrics -----------------------------------------------------------

FAKE_CURL = r"""#!/bin/bash
# curl for the health script: /health 200, /v1/models lists $SERVED, /metrics from $FAKE/metrics.PORT
url=${@: -1}; port=${url#http://127.0.0.1:}; port=${port%%/*}
echo "$*" >> "$FAKE/curl.log"
[ -e "$FAKE/down.$port" ] && exit 7
case $url in
  */health) printf 200 ;;
  */v1/models) printf '{"data": [{"id": "%s"}]}' "$SERVED" ;;
  */metrics) cat "$FAKE/metrics.$port" 2>/dev/null || exit 22 ;;
  *) exit 22 ;;
esac
"""

TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="nemotron"} 2.0
vllm:num_requests_running{engine="1",model_name="nemotron"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="nemotron"} 1.0
vllm:num_requests_waiting{engine="1",model_name="nemotron"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="nemotron"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="nemotron"} 0.5
vllm:num_requests_running_total{engine="0"} 99
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a b"} 7.0
"""


@pytest.fixture
def health(tmp_path):
    """Run the health program with the rendered config of a two-instance host against a fake curl."""
    plan = make_plan("h", GPUS, {})
    config = health_config(plan, defaults()).replace("/var/lib/nemofleet/health", str(tmp_path / "state"))
    config = config.replace("/etc/nemofleet/", str(tmp_path / "etc") + "/")
    (tmp_path / "health.json").write_text(config)
    (tmp_path / "health.py").write_text(health_program())
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "curl").write_text(FAKE_CURL)
    (tmp_path / "bin" / "curl").chmod(0o755)

    def run() -> list[str]:
        env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE": str(tmp_path), "SERVED": plan.served_name,
               "PROM_DIR": str(tmp_path / "prom")}
        p = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "health.py"), str(tmp_path / "health.json")],
                           capture_output=True, text=True, env=env, timeout=30)
        assert "Traceback" not in p.stderr, p.stderr
        return (tmp_path / "prom" / "nemofleet.prom").read_text().splitlines()

    run.dir = tmp_path
    return run


def samples(prom: list[str], metric: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in (re.match(metric + r'\{instance="([^"]+)"\} (\S+)$', ln) for ln in prom)
            if m}


def test_health_script_exports_load_summed_over_engines(health):
    (health.dir / "metrics.8000").write_text(TWO_ENGINES)
    (health.dir / "metrics.8001").write_text(
        'vllm:num_requests_running{engine="0",model_name="nemotron"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="nemotron"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="nemotron"} 0.0125\n')
    prom = health()
    assert samples(prom, "nemofleet_vllm_num_requests_running") == {"nemotron-0": "5", "nemotron-1": "1"}
    assert samples(prom, "nemofleet_vllm_num_requests_waiting") == {"nemotron-0": "1", "nemotron-1": "0"}
    # the KV-cache ratio of several engines is their mean (a sum could pass 1)
    assert samples(prom, "nemofleet_vllm_kv_cache_usage_ratio") == {"nemotron-0": "0.375", "nemotron-1": "0.0125"}
    for metric in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"):
        assert f"# TYPE nemofleet_vllm_{metric} gauge" in prom
    assert not any(":" in ln.split("{")[0] for ln in prom if not ln.startswith("#"))  # no vllm: names leak
    # bounded like every other call, with the API key header helper (harmless: /metrics is open)
    metrics_calls = [ln for ln in (health.dir / "curl.log").read_text().splitlines() if ln.endswith("/metrics")]
    assert len(metrics_calls) == 2 and all("--max-time 5" in ln for ln in metrics_calls)


def test_an_unreadable_metrics_endpoint_leaves_out_that_instances_load(health):
    (health.dir / "metrics.8000").write_text(TWO_ENGINES)
    (health.dir / "down.8001").write_text("")  # instance down: /health and /metrics unreachable
    prom = health()
    assert 'nemofleet_vllm_up{instance="nemotron-1",model="nemotron-3.5-lightning",port="8001"} 0' in prom
    for metric in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"):
        assert set(samples(prom, f"nemofleet_vllm_{metric}")) == {"nemotron-0"}
    # /metrics answering without any vLLM figure (not a vLLM server, or an error page): no lines either
    (health.dir / "down.8001").unlink()
    (health.dir / "metrics.8001").write_text("<html>nothing</html>\n")
    assert set(samples(health(), "nemofleet_vllm_num_requests_running")) == {"nemotron-0"}


def test_an_older_server_kv_name_is_a_fallback_only(health):
    (health.dir / "metrics.8000").write_text(  # before v0.11: gpu_cache_usage_perc, no kv_cache_usage_perc
        'vllm:num_requests_running{model_name="nemotron"} 4.0\n'
        'vllm:gpu_cache_usage_perc{model_name="nemotron"} 0.5\n')
    (health.dir / "metrics.8001").write_text(  # both names: the current one wins
        'vllm:gpu_cache_usage_perc{engine="0",model_name="nemotron"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="nemotron"} 0.2\n')
    prom = health()
    assert samples(prom, "nemofleet_vllm_kv_cache_usage_ratio") == {"nemotron-0": "0.5", "nemotron-1": "0.2"}
    assert samples(prom, "nemofleet_vllm_num_requests_running") == {"nemotron-0": "4"}
    assert samples(prom, "nemofleet_vllm_num_requests_waiting") == {}  # a figure it lacks is left out


def test_textfile_lines_feed_status(health):
    (health.dir / "metrics.8000").write_text(TWO_ENGINES)
    prom = ["prom " + ln for ln in health() if not ln.startswith("#")]  # what `status` cats
    units = [ln for ln in UNITS if ln.startswith("unit ")]
    assert "running   5 waiting   1 KV  37.5%" in unit_lines(units + prom, time.time())[0]


# --- the testbed's stand-in vLLM ----------------------------------------------------------------

@pytest.fixture
def standin(monkeypatch):
    with standin_server.serving(monkeypatch, max_num_seqs=2) as served:
        yield served[1]


def _figures(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^vllm:(\w+)\{[^}]*\} (\S+)$", text, re.M)}


def test_standin_metrics_count_requests_in_flight(standin):
    idle = _figures(standin)
    assert (idle["num_requests_running"], idle["num_requests_waiting"], idle["kv_cache_usage_perc"]) == (0, 0, 0)
    body = json.dumps({"model": "nemotron", "messages": [{"role": "user", "content": "hi"}],
                       "standin_hold_seconds": 1.5}).encode()

    def ask():
        req = urllib.request.Request(standin + "/v1/chat/completions", body, {"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    askers = [threading.Thread(target=ask) for _ in range(3)]
    for t in askers:
        t.start()
    deadline = time.time() + 5
    while time.time() < deadline and _figures(standin)["num_requests_running"] + \
            _figures(standin)["num_requests_waiting"] < 3:
        time.sleep(0.05)
    busy = _figures(standin)
    assert (busy["num_requests_running"], busy["num_requests_waiting"]) == (2, 1)  # --max-num-seqs 2
    assert 0 < busy["kv_cache_usage_perc"] < 0.1
    for t in askers:
        t.join()
    done = _figures(standin)
    assert (done["num_requests_running"], done["kv_cache_usage_perc"], done["request_success_total"]) == (0, 0, 3)


# --- dashboard and docs cannot drift from the script --------------------------------------------

def _exprs(dashboard: dict) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            out += [t["expr"] for t in sub.get("targets", [])]
    out += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return out


def test_the_template_exports_the_load_metrics():
    assert {"nemofleet_vllm_num_requests_running", "nemofleet_vllm_num_requests_waiting",
            "nemofleet_vllm_kv_cache_usage_ratio", "nemofleet_vllm_up"} <= EXPORTED
    assert not any(":" in m or "gpu_cache" in m for m in EXPORTED)


def test_dashboard_names_only_metrics_the_health_script_exports():
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41 and dash["uid"] and dash["title"]
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    assert {v["name"] for v in dash["templating"]["list"]} >= {"host", "vllm_instance"}
    exprs = _exprs(dash)
    assert len(exprs) >= 7
    for expr in exprs:
        named = set(re.findall(r"nemofleet_[a-z_]+", expr))
        assert named, f"{expr!r} names no nemofleet metric"
        assert named <= EXPORTED, f"{expr!r} names {named - EXPORTED}, which the health script does not export"
        assert "vllm:" not in expr
    shown = " ".join(exprs)
    for metric in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio", "up",
                   "self_heal_restarts_total"):
        assert f"nemofleet_vllm_{metric}" in shown
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_monitoring_doc_lists_every_exported_metric():
    doc = MONITORING.read_text()
    missing = sorted(m for m in EXPORTED if f"`{m}`" not in doc)
    assert not missing, f"docs/monitoring.md does not describe {missing}"
    for name in set(re.findall(r"\bnemofleet_[a-z_]+", doc)):
        assert name in EXPORTED, f"docs/monitoring.md names {name}, which the health script does not export"


def test_drift_is_said_in_words():
    """Status names what differs (image, model, instances) before the ids; flags or GPUs when the
    record's fields agree and the ids do not."""
    from nemofleet.fleet.status import HostStatus, _record

    host = _record(["release id=aaaaaaaaaaaa", "release image=vllm/vllm-openai:v0.27.1",
                    "release model=nvidia/N@0123", "release instances=nemotron-0", "unit x"])
    assert host == {"id": "aaaaaaaaaaaa", "image": "vllm/vllm-openai:v0.27.1", "model": "nvidia/N@0123",
                    "instances": "nemotron-0"}
    want = dict(host, id="bbbbbbbbbbbb", image="vllm/vllm-openai:v0.32.0")
    r = HostStatus("h", release="aaaaaaaaaaaa", planned="bbbbbbbbbbbb", record=host, planned_record=want)
    assert r.drift() == ("DRIFT: image vllm/vllm-openai:v0.27.1 -> vllm/vllm-openai:v0.32.0 "
                         "(release aaaaaaaaaaaa -> bbbbbbbbbbbb)")
    r.planned_record = dict(host, id="bbbbbbbbbbbb")
    assert r.drift().startswith("DRIFT: the same image, model and instances, other flags or GPUs")
    assert HostStatus("h", release="a", planned="a").drift() == "in sync"
    assert "refused" in HostStatus("h", release="a", planned=None).drift()
    assert HostStatus("h", release=None, planned="b").drift() == "DRIFT: nothing deployed yet; the inventory plans release b"


def test_a_host_whose_settings_are_refused_is_still_read_where_the_defaults_put_things():
    from nemofleet.fleet import status as st
    from nemofleet import settings, spec

    script, problems = st._script_for(spec.read("h", {"models_root": "/"}))
    assert problems and problems[0].startswith("models_root '/' is a system directory")
    assert settings.defaults().models_root in script
