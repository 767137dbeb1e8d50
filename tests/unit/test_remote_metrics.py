"""remote/metrics.py, the canary gate's read of a host (fleet/rollout.METRICS_SCRIPT), run here as
the rollout runs it (its shell line through sh) against a local /metrics that wants the key, with
the host's files in a temporary directory: the instances come from the health program's config,
a headless worker's port 0 is skipped, the key comes from the 0600 header file, and the answer
splits back into what canary.py reads."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nemofleet import canary, paths
from nemofleet.fleet import rollout

KEY = "sk-metrics-test-0123456789"
METRICS = """# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 7.0
vllm:num_requests_running{model_name="m"} 1.0
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 7.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 7.0
"""


def serve():
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ok = self.headers.get("authorization") == f"Bearer {KEY}" and self.path == "/metrics"
            data = METRICS.encode() if ok else b"Unauthorized"
            self.send_response(200 if ok else 401)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_the_gate_reads_each_instance_of_the_health_config(tmp_path):
    httpd = serve()
    try:
        port = httpd.server_address[1]
        (tmp_path / "health.json").write_text(json.dumps({"address": "127.0.0.1", "instances": [
            {"name": "nemotron-0", "port": port, "model": "m"}, {"name": "worker", "port": 0, "model": "m"},
            {"name": "x; id", "port": port, "model": "m"}, {"name": "nemotron-1", "port": 1, "model": "m"}]}))
        (tmp_path / "api-auth.header").write_text(f"Authorization: Bearer {KEY}\n")
        line = rollout.METRICS_SCRIPT
        assert KEY not in line
        for p in (paths.HEALTH_CONFIG, paths.API_AUTH):
            line = line.replace(p, str(tmp_path / p.rsplit("/", 1)[1]))
        r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stderr, r.stderr
        gpu, texts = canary.split_instances(r.stdout.splitlines())
        assert list(texts) == ["nemotron-0", "nemotron-1"]  # the worker and the hostile name left out
        assert "num_requests_running" not in texts["nemotron-0"] and texts["nemotron-1"] == ""
        samples = canary.parse(texts["nemotron-0"])
        assert any(name == "vllm:request_success_total" and v == 7.0 for (name, _), v in samples.items())
    finally:
        httpd.shutdown()


def test_not_deployed_is_no_instance(tmp_path):
    line = rollout.METRICS_SCRIPT.replace(paths.HEALTH_CONFIG, str(tmp_path / "none.json"))
    r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("@@gpu") and "@@instance" not in r.stdout
