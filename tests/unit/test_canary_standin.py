"""The testbed's stand-in vLLM exports what the canary gate reads under vLLM's real names, keeps
its documented latency, and the -flaky release fails exactly every 20th completion."""
import json
import urllib.error
import urllib.request

import pytest
import standin_server

from nemofleet import canary


@pytest.fixture
def standin(monkeypatch):
    with standin_server.serving(monkeypatch, max_num_seqs=8) as served:
        yield served


def ask(base):
    body = json.dumps({"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


def figures(base):
    return canary.figures_of(canary.parse(urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()))


def test_flaky_fails_every_20th_completion_and_metrics_count_it(standin):
    mod, base = standin
    mod.LATENCY, mod.FAIL_EVERY = 0.0, 20
    codes = [ask(base) for _ in range(40)]
    assert [i + 1 for i, c in enumerate(codes) if c != 200] == [20, 40]
    urllib.request.urlopen(base + "/version", timeout=5).read()  # not a request the gate counts
    f = figures(base)
    assert (f.requests, f.errors) == (40, 2) and f.ttft[float("inf")] == 38 and f.e2e[float("inf")] == 38
    assert f.unreadable == 0  # prometheus_client's text, as vLLM exports it: every line the gate reads is read


def test_latency_is_fixed_and_lands_in_vllms_buckets(standin):
    mod, base = standin
    mod.LATENCY = 0.2  # the default release: 0.1 s to the first token, 0.2 s in all
    for _ in range(5):
        assert ask(base) == 200
    f = figures(base)
    assert 0.08 < f.p95("ttft") <= 0.25 and 0.1 < f.p95("e2e") <= 0.3
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    for line in ("# TYPE vllm:time_to_first_token_seconds histogram", "# TYPE vllm:e2e_request_latency_seconds histogram",
                 "# TYPE http_requests_total counter", "# TYPE vllm:request_success_total counter"):
        assert line in text
    assert 'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 5.0' in text
