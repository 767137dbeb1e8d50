"""Faults and hostile input on the testbed: each is refused or bounded with one sentence, and a
host that is refused gets nothing changed. (The README's "Faults and bad input" table lists these.)"""
import json
import time

import pytest

from conftest import on, pyinfra

pytestmark = pytest.mark.e2e


def restarts(host):
    return on(host, "cat /var/lib/nemofleet/health/nemotron-0.restarts 2>/dev/null | wc -l").stdout.strip()


def test_self_heal_is_bounded_by_the_loading_grace_and_an_hourly_cap(converged):
    host = "a100-1"
    bad = "MODEL_NAME=not-served FAIL_RESTART=1 flock /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health"
    on(host, "rm -f /var/lib/nemofleet/health/nemotron-0.restarts; /usr/local/bin/nemofleet-health")  # healthy
    first = on(host, bad, check=False).stdout
    assert "restarting nemofleet-vllm-nemotron-0.service after 1 consecutive failures" in first
    # right after a restart the instance has not been healthy since it started: it is loading
    second = on(host, bad, check=False).stdout
    assert "not restarting nemofleet-vllm-nemotron-0.service: not healthy yet since it started" in second, second
    # without the grace, the hourly cap stops the storm
    capped = f"RESTART_GRACE=0 RESTARTS_PER_HOUR=2 {bad}"
    third = on(host, capped, check=False).stdout
    assert "restarting" in third and restarts(host) == "2"
    fourth = on(host, capped, check=False).stdout
    assert "2 restarts in the last hour (cap 2); needs a person" in fourth and restarts(host) == "2"
    assert 'nemofleet_vllm_self_heal_restarts_total{instance="nemotron-0"} 2' in on(
        host, "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    on(host, "rm -f /var/lib/nemofleet/health/nemotron-0.restarts")
    deadline = time.time() + 120
    while time.time() < deadline and on(host, "/usr/local/bin/nemofleet-health", check=False).returncode:
        time.sleep(2)


@pytest.mark.parametrize("key, value, words", [
    ("health_schedule", "* * * *", "health_schedule '* * * *' is not valid here"),
    ("health_webhook_url", "http://x/$(touch /tmp/pwned)", "health_webhook_url its value is not valid here"),
    ("frontends", json.dumps([{"network": "open-webui_default", "alias": "x,alias=y"}]),
     "frontends alias 'x,alias=y' must be a Docker name"),
    ("gpu_memory_utilisation", "0.8", "unknown setting 'gpu_memory_utilisation' (did you mean gpu_memory_utilization?)"),
    ("http_proxy", 'http://p:3128" "X=1', "http_proxy 'http://p:3128\" \"X=1' is not valid here"),
])
def test_hostile_or_misspelt_setting_refused_and_nothing_changes(converged, key, value, words):
    before = on("h200-1", "md5sum /usr/local/bin/nemofleet-health /etc/cron.d/nemofleet-health "
                          "/etc/systemd/system/nemofleet-vllm-*.service /etc/docker/daemon.json").stdout
    r = pyinfra(hosts=["h200-1"], data={key: value})
    assert r.rc == 1 and f"nemofleet refused h200-1: {words}" in r.out, r.out[-3000:]
    assert r.changed() == []
    assert on("h200-1", "md5sum /usr/local/bin/nemofleet-health /etc/cron.d/nemofleet-health "
                        "/etc/systemd/system/nemofleet-vllm-*.service /etc/docker/daemon.json").stdout == before
    assert not on("h200-1", "test -e /tmp/pwned", check=False).returncode == 0


def test_secrets_appear_in_no_output_unit_or_process_list(converged, bed):
    key = open(bed["dir"] + "/api-key").read().strip() if "dir" in bed else None
    r = pyinfra(hosts=["h200-1"], extra=["-vv"])
    assert r.rc == 0
    for host in ("h200-1",):
        public = on(host, "cat /etc/systemd/system/nemofleet-vllm-*.service /usr/local/bin/nemofleet-health "
                          "/etc/cron.d/nemofleet-health; ps axww -o args").stdout
        secret = on(host, "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env").stdout.strip()
        assert secret and secret not in public and secret not in r.out
        assert key is None or key == secret
        assert on(host, "stat -c %a /etc/nemofleet/vllm.env /etc/nemofleet/api-auth.header "
                        "/etc/nemofleet/health.conf").stdout.split() == ["600", "600", "600"]
