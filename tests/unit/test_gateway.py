"""The fleet gateway (issue 17 item 5): its HAProxy config and its refusals, one sentence each."""
import pytest

from nemofleet import desired, paths
from nemofleet_testbed import load_profiles

KEY = {"vllm_api_key": "sk-nf-" + "a" * 32}
BACKENDS = [{"host": "10.0.0.5", "port": 8800}, {"host": "h200-01.example.internal", "port": 8000, "name": "h200-01"},
            {"host": "fd00::7", "port": 8800}]


def gateway_build(host, data, secrets):
    """The one decision (desired.build -> decide) for a host of group gateway: no facts at all."""
    return desired.build(host, data, {}, secrets, groups=["gateway"])


def build(**data):
    return gateway_build("gw-01", {"gateway_backends": BACKENDS, **data}, KEY)


def test_config_balances_leastconn_over_the_backends_with_health_ejection():
    d = build()
    assert d.refusals == [] and d.front_door
    text = d.front_door_config
    assert "frontend gateway\n    bind 0.0.0.0:8800\n" in text
    assert "    balance leastconn\n" in text and "http-check send meth GET uri /health" in text
    assert "default-server check inter 2s fall 3 rise 2 observe layer7 error-limit 5 on-error mark-down" in text
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
