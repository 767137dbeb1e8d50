"""The fleet gateway (issue 17 item 5): its HAProxy config and its refusals, one sentence each."""
from pathlib import Path

import pytest

from nemofleet import desired, paths, render
from nemofleet_testbed import load_profiles

KEY = {"vllm_api_key": "sk-nf-" + "a" * 32}
BACKENDS = [{"host": "10.0.0.5", "port": 8800}, {"host": "h200-01.example.internal", "port": 8000, "name": "h200-01"},
            {"host": "fd00::7", "port": 8800}]


def gateway_build(host, data, secrets):
    """The one decision (desired.build -> decide) for a host of group gateway: no facts at all."""
    return desired.build(host, data, {}, secrets, groups=["gateway"])


def build(**data):
    return gateway_build("gw-01", {"gateway_backends": BACKENDS, **data}, KEY)


def test_config_balances_by_weight_over_the_backends_with_health_ejection():
    d = build()
    assert d.refusals == [] and d.front_door
    text = d.front_door_config
    assert "frontend gateway\n    bind 0.0.0.0:8800\n" in text
    # roundrobin: the one algorithm that keeps a light (canary) server at its weight (docs/gateway.md)
    assert "    balance roundrobin\n" in text and "http-check send meth GET uri /health" in text
    assert ("default-server check inter 2s fall 3 rise 2 observe layer7 error-limit 5 on-error mark-down "
            f"weight {render.GATEWAY_WEIGHT}\n") in text
    servers = [line.strip() for line in text.splitlines() if line.strip().startswith("server ")]
    assert servers == ["server 10.0.0.5:8800 10.0.0.5:8800", "server h200-01 h200-01.example.internal:8000",
                       "server fd00::7:8800 [fd00::7]:8800"]
    assert "timeout server 3600s" in text and "timeout tunnel 3600s" in text
    assert f"-f {paths.FRONT_DOOR_KEYS}" in text and "stats socket /run/haproxy/nemofleet-admin.sock mode 600" in text
    assert KEY["vllm_api_key"] not in text  # the key lives only in the 0600 patterns file
    assert d.front_door_secrets == {paths.FRONT_DOOR_KEYS: (f"Bearer {KEY['vllm_api_key']}\n", "0600")}
    assert d.secret_dirs == {paths.ETC: "0700"} and d.front_door_files == {}
    assert d.frontend_lines == ["gateway: base URL http://gw-01:8800/v1 over 3 backend(s) (10.0.0.5:8800, "
                                "h200-01.example.internal:8000, [fd00::7]:8800)"]


def test_config_follows_its_settings():
    text = build(gateway_port=9000, gateway_address="10.1.0.2", gateway_fall=5, gateway_rise=3,
                 front_door_timeout=7200).front_door_config
    assert "    bind 127.0.0.1:9000\n    bind 10.1.0.2:9000\n" in text
    assert "fall 5 rise 3" in text and "timeout server 7200s" in text
    assert "bind 127.0.0.1:9000\n    #" in build(gateway_port=9000, gateway_address="127.0.0.1").front_door_config


def test_same_input_same_config():
    assert build().front_door_config == build().front_door_config


@pytest.mark.parametrize("backends, sentence", [
    ([{"host": "10.0.0.5\n    server evil 6.6.6.6:80", "port": 8800}],
     "gateway_backends entry 1: host '10.0.0.5\\n    server evil 6.6.6.6:80' is not an IP address or a host name"),
    ([{"host": "10.0.0.5", "port": 8800}, {"host": "a b", "port": 1}],
     "gateway_backends entry 2: host 'a b' is not an IP address or a host name"),
    ([{"host": "10.0.0.5", "port": 70000}], "gateway_backends entry 1 (10.0.0.5): port 70000 is not a TCP port (1-65535)"),
    ([{"host": "10.0.0.5", "port": True}], "gateway_backends entry 1 (10.0.0.5): port True is not a TCP port (1-65535)"),
    ([{"host": "10.0.0.5"}], "gateway_backends entry 1 (10.0.0.5): port None is not a TCP port (1-65535)"),
    ([{"host": "10.0.0.5", "port": 1, "weight": 3}],
     "gateway_backends entry 1 has unknown keys weight (known: host, port, name)"),
    ([{"host": "10.0.0.5", "port": 1, "name": "x y"}],
     "gateway_backends entry 1 (10.0.0.5): name 'x y' must be letters, digits, '_', '.', '-'"),
    ([{"host": "10.0.0.5", "port": 1}, {"host": "10.0.0.5", "port": 1}], "gateway_backends entry 2 repeats 10.0.0.5:1"),
    ([{"host": "a", "port": 1, "name": "n"}, {"host": "b", "port": 1, "name": "n"}],
     "gateway_backends entry 2 repeats the name n"),
    (["10.0.0.5:8800"], "gateway_backends entry 1 must be a mapping {host, port, name}, not '10.0.0.5:8800'"),
    ([], "gateway_backends is empty: list the model endpoints of the GPU hosts"),
])
def test_bad_backends_refused_in_one_sentence(backends, sentence):
    d = gateway_build("gw-01", {"gateway_backends": backends}, KEY)
    assert len(d.refusals) == 1 and d.refusals[0].startswith(sentence), d.refusals
    assert d.front_door_config is None and not d.front_door_secrets


@pytest.mark.parametrize("host, data", [("gw-01", {}), ("127.0.0.1", {}), ("localhost", {}), ("::1", {}),
                                        ("0.0.0.0", {}), ("10.0.0.9", {"ssh_hostname": "10.0.0.9"}),
                                        ("10.1.0.2", {"gateway_address": "10.1.0.2"})])
def test_a_backend_that_is_the_gateway_itself_is_refused(host, data):
    d = gateway_build("gw-01", {"gateway_backends": [*BACKENDS, {"host": host, "port": 8800}], **data}, KEY)
    assert d.refusals == [f"gateway_backends entry 4 ({host}:8800) is this gateway's own endpoint: every request "
                          "would loop back to it; list the GPU hosts' front doors"] and not d.front_door_config
    # the same host on another port is another service (a GPU host's front door on the gateway machine)
    assert not gateway_build("gw-01", {"gateway_backends": [*BACKENDS, {"host": host, "port": 8000}], **data},
                             KEY).refusals


def test_no_key_refused_and_bad_listen_settings_refused():
    assert gateway_build("gw-01", {"gateway_backends": BACKENDS}, {"vllm_api_key": None}).refusals == [
        "no API key: set vllm_api_key or vllm_api_key_file (a file on the controller) so /v1 is not open to anyone "
        "who can reach the port"]
    assert build(gateway_address="gw.example").refusals == [
        "gateway_address 'gw.example' is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::1)"]
    assert build(gateway_port=0).refusals == ["gateway_port 0 must be at least 1"]
    assert build(gateway_fall=0).refusals == ["gateway_fall 0 must be at least 1"]


def test_a_gateway_needs_no_gpu_facts():
    # the gateway's decision takes no facts at all: nothing about GPUs, drivers or Docker is checked on a gateway host
    assert build().refusals == []


def test_testbed_gateway_host_is_optional_and_has_no_gpu():
    gw = load_profiles()["gw-1"]
    assert gw["group"] == "gateway" and gw["optional"] and gw["gpus"] == [] and gw["driver_state"] == "absent"


def _lines(text: str, section: str) -> list[str]:
    """The statements of one section of a rendered HAProxy config (comments left out)."""
    out, inside = [], False
    for line in text.splitlines():
        if line and not line.startswith(" "):
            inside = line.split()[0] == section
        elif inside and line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


def test_a_failed_answer_is_retried_on_another_server_and_the_request_is_buffered_for_it():
    """Item 3 of issue 49: refused/reset connections, an empty answer and 500/502/503/504 are
    retried (never a response timeout: a long generation is not sent twice), each retry on another
    server, the request buffered whole so that it can be sent again (up to tune.bufsize)."""
    text = build().front_door_config
    defaults = _lines(text, "defaults")
    assert "retry-on conn-failure empty-response 500 502 503 504" in defaults
    assert "option http-buffer-request" in defaults and "option redispatch 1" in defaults
    assert f"retries {render.PROXY_RETRIES}" in defaults and render.PROXY_RETRIES == 3
    assert not [ln for ln in defaults if "response-timeout" in ln or "junk-response" in ln]
    assert f"tune.bufsize {render.PROXY_BUFSIZE}" in _lines(text, "global") and render.PROXY_BUFSIZE == 256 * 1024
    # the gateway keeps drains and weights set through its runtime API across a reload
    assert f"server-state-file {render.GATEWAY_STATE}" in _lines(text, "global")
    assert "load-server-state-from-file global" in defaults


def test_front_doors_share_the_retries_but_keep_leastconn_and_no_state_file():
    """The template is shared: a host's front door retries the same failures on another of its
    instances, but balances leastconn over its equal instances with no weights and no state file
    (its drains are its own drain script's, never left behind by a controller)."""
    text = render.haproxy_config(["x"], "front_door", ["127.0.0.1:8800"], [("nemotron-0", "127.0.0.1:8000")],
                                 3600, fall=2, rise=1)
    defaults = _lines(text, "defaults")
    assert "retry-on conn-failure empty-response 500 502 503 504" in defaults and "option http-buffer-request" in defaults
    assert "balance leastconn" in _lines(text, "backend") and "weight" not in text.split("backend")[-1]
    assert "server-state-file" not in text and "load-server-state-from-file" not in text


def test_testbed_inventory_configures_its_gateway_from_the_hosts_that_are_up(tmp_path, monkeypatch):
    """Item 0: with NEMOFLEET_TESTBED_GATEWAY=1 the testbed inventory gives gw-1 one backend per GPU
    host that is up, named after it (how a rollout finds its server): the front door of a host with
    several GPUs, the instance port of one with one, each listening where gw-1 reaches it."""
    import json
    import runpy

    state = {"key": "k", "hosts": {"a100-1": {"port": 1, "group": "gpu_a100", "gpus": 1},
                                   "h100-1": {"port": 2, "group": "gpu_h100", "gpus": 8},
                                   "broken-1": {"port": 3, "group": "gpu_a100", "gpus": 1},
                                   "gw-1": {"port": 4, "group": "gateway", "gpus": 0}}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("NEMOFLEET_TESTBED_DIR", str(tmp_path))
    monkeypatch.setenv("NEMOFLEET_TESTBED_GATEWAY", "1")
    monkeypatch.delenv("NEMOFLEET_TESTBED_HOSTS", raising=False)
    monkeypatch.delenv("NEMOFLEET_TESTBED_BROKEN", raising=False)
    inv = runpy.run_path(str(Path(__file__).resolve().parents[2] / "inventories" / "testbed.py"))
    (gw, data), = inv["gateway"]
    assert gw == "gw-1" and [b["name"] for b in data["gateway_backends"]] == ["a100-1", "h100-1"]
    ports = {b["name"]: b["port"] for b in data["gateway_backends"]}
    assert ports == {"a100-1": 8000, "h100-1": 8800}
    hosts = dict(inv["gpu_a100"] + inv["gpu_h100"])
    assert hosts["a100-1"]["bind_address"] == "0.0.0.0" and hosts["h100-1"]["front_door_address"] == "0.0.0.0"
