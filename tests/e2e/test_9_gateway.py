"""The fleet gateway (issue 17 item 5): gw-1 (no GPU) runs HAProxy in front of a100-1 and h200-1
(one instance each, their ports published on the testbed network for this module only); chat
completions through it succeed with the key and get 401 without; a GPU host whose vLLM stops is
ejected (requests keep succeeding) and taken back when it serves again; a second run changes
nothing; a config change reloads it; bad backends are refused in one sentence with the gateway
untouched. All traffic stays inside the testbed network (curl runs inside gw-1).

Brings up only the hosts it needs when run on its own."""
import hashlib
import json
import os
import time

import pytest

from conftest import docker_available, on, pyinfra

pytestmark = pytest.mark.e2e
GPU_HOSTS = ["a100-1", "h200-1"]
GW = "gw-1"
CFG = "/etc/haproxy/haproxy.cfg"
# the GPU hosts' instance ports, published on every address of the host for the gateway to reach
# them over the testbed network (this module's data only; the default stays 127.0.0.1)
GPU_DATA = {"bind_address": "0.0.0.0"}
TIMES: dict = {}


def backends() -> list[dict]:
    import nemofleet_testbed as testbed

    return [{"host": testbed.container(h), "port": 8000, "name": h} for h in GPU_HOSTS]


def gateway_run(data=None):
    return pyinfra("deploys/gateway.py", hosts=[GW], data={"gateway_backends": json.dumps(backends()), **(data or {})})


@pytest.fixture(scope="module")
def fleet():
    import nemofleet_testbed as testbed

    if not docker_available():
        pytest.fail("the end-to-end tests need a running Docker engine and debootstrap (run .ci/run as root)")
    was_up = bool(testbed.read_state().get("hosts"))
    testbed.up(only=[*GPU_HOSTS, GW])
    t = time.time()
    r = pyinfra(hosts=GPU_HOSTS, data=GPU_DATA)
    assert r.rc == 0, r.out[-6000:]
    TIMES["gpu_converge_s"] = round(time.time() - t, 1)
    t = time.time()
    r = gateway_run()
    assert r.rc == 0, r.out[-6000:]
    TIMES["gateway_first_run_s"] = round(time.time() - t, 1)
    on(GW, "printf 'Authorization: %s\\n' \"$(cat /etc/nemofleet/front-door.keys)\" > /root/.gw-auth; "
           "chmod 600 /root/.gw-auth")
    t = time.time()
    for h in GPU_HOSTS:  # the GPU hosts' (re)started instances pass the gateway's checks
        wait_status(h, "UP", timeout=60)
    TIMES["backends_up_after_gateway_run_s"] = round(time.time() - t, 1)
    yield r
    print(f"\ngateway figures: {json.dumps(TIMES)}")
    (testbed.testbed_dir() / "gateway-figures.json").write_text(json.dumps(TIMES, indent=2) + "\n")
    keep = os.environ.get("NEMOFLEET_KEEP_TESTBED") == "1"
    if not was_up and not keep:
        testbed.down()
        return
    if not keep:
        testbed.remove(GW)
    for h in GPU_HOSTS:  # back on loopback, as the rest of the suite expects
        on(h, "systemctl start nemofleet-vllm-nemotron-0", check=False)
    assert pyinfra(hosts=GPU_HOSTS).rc == 0


def call(path="/v1/chat/completions", auth=True, stream=False) -> tuple[int, str]:
    body = json.dumps({"model": "nemotron-3.5-lightning", "max_tokens": 16, "stream": stream,
                       "messages": [{"role": "user", "content": "What is 17*23?"}]})
    data = f"-H 'Content-Type: application/json' --data '{body}'" if path.endswith("completions") else ""
    r = on(GW, f"curl -s --max-time 30 -o /tmp/gw-out -w '%{{http_code}}' {'-H @/root/.gw-auth' if auth else ''} "
               f"{data} http://127.0.0.1:8800{path}; echo; cat /tmp/gw-out", check=False)
    code, _, text = r.stdout.partition("\n")
    return int(code or 0), text


def stat() -> dict:
    """{server: (status, total sessions)} of the gateway's backend, from HAProxy's runtime API."""
    script = ("import socket\n"
              "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect('/run/haproxy/nemofleet-admin.sock')\n"
              "s.sendall(b'show stat\\n'); out = b''\n"
              "while True:\n"
              "    c = s.recv(65536)\n"
              "    if not c: break\n"
              "    out += c\n"
              "print(out.decode())\n")
    text = on(GW, f"python3 - <<'EOF'\n{script}EOF").stdout
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
    head = text.splitlines()[0].lstrip("# ").split(",")
    col = {h: i for i, h in enumerate(head)}
    return {r[1]: (r[col["status"]], int(r[col["stot"]] or 0)) for r in rows
            if r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}


def wait_status(server: str, want: str, timeout: float = 60) -> float:
    t = time.time()
    while True:
        status = stat()[server][0]
        if status.startswith(want):
            return round(time.time() - t, 1)
        assert time.time() - t < timeout, f"{server} is {status}, not {want}, after {timeout}s"
        time.sleep(0.2)


def proxy_pid() -> str:
    return on(GW, "systemctl show -p MainPID --value haproxy").stdout.strip()


def cfg_digest() -> str:
    return hashlib.sha256(on(GW, f"cat {CFG}").stdout.encode()).hexdigest()


def test_gateway_balances_over_both_hosts_with_key_and_401_without(fleet):
    assert on(GW, "systemctl is-active haproxy").stdout.strip() == "active"
    text = on(GW, f"cat {CFG}").stdout
    assert "balance roundrobin" in text and "fall 3 rise 2 observe layer7" in text
    for b in backends():
        assert f"    server {b['name']} {b['host']}:8000\n" in text
    key = on(GW, "cat /etc/nemofleet/front-door.keys").stdout.strip().split()[-1]
    assert key not in text and key not in fleet.out
    assert on(GW, "stat -c '%U %a' /etc/nemofleet/front-door.keys").stdout.strip() == "root 600"
    assert all(s.startswith("UP") for s, _ in stat().values()), stat()
    before = {n: t for n, (_, t) in stat().items()}
    for _ in range(8):
        code, body = call()
        assert code == 200 and json.loads(body)["object"] == "chat.completion", body
    after = stat()
    assert all(after[n][1] > before[n] for n in before), (before, after)  # both hosts answered
    code, body = call(stream=True)
    assert code == 200 and body.rstrip().endswith("data: [DONE]") and body.count("data: {") >= 2
    assert call(auth=False)[0] == 401 and call("/v1/models", auth=False)[0] == 401
    assert call("/health", auth=False)[0] == 200
    # no GPU was asked of gw-1: deploys/nemotron.py leaves a gateway host alone
    r = pyinfra(hosts=[GW])
    assert r.rc == 0 and r.changed() == [] and "deploys/gateway.py configures it" in r.out, r.out[-3000:]


def test_a_host_that_stops_serving_is_ejected_and_comes_back(fleet):
    victim = GPU_HOSTS[0]
    on(victim, "systemctl stop nemofleet-vllm-nemotron-0")
    t = time.time()
    ok = failed = 0
    try:
        while not stat()[victim][0].startswith("DOWN"):
            assert time.time() - t < 60, stat()
            code, body = call()
            ok, failed = ok + (code == 200), failed + (code != 200)
        TIMES["ejected_after_s"] = round(time.time() - t, 1)
        TIMES["requests_while_ejecting"], TIMES["failed_while_ejecting"] = ok + failed, failed
        assert failed == 0, (ok, failed)
        assert stat()[GPU_HOSTS[1]][0].startswith("UP")
        for _ in range(6):  # all served by the other host now
            assert call()[0] == 200
    finally:
        on(victim, "systemctl start nemofleet-vllm-nemotron-0")
    t = time.time()
    TIMES["back_after_start_s"] = wait_status(victim, "UP", timeout=120)
    before = stat()[victim][1]
    for _ in range(8):
        assert call()[0] == 200
    assert stat()[victim][1] > before  # takes requests again


def test_second_gateway_run_changes_nothing(fleet):
    t = time.time()
    again = gateway_run()
    TIMES["gateway_noop_run_s"] = round(time.time() - t, 1)
    assert again.rc == 0 and again.changed() == [], again.changed() or again.out[-3000:]


def test_a_config_change_reloads_the_gateway_without_a_restart(fleet):
    pid = proxy_pid()
    r = gateway_run({"gateway_fall": 4})
    assert r.rc == 0, r.out[-3000:]
    assert "nemofleet gateway | Gateway: reload HAProxy (connections in flight are kept)" in r.changed(), r.changed()
    assert "fall 4 rise 2" in on(GW, f"cat {CFG}").stdout and proxy_pid() == pid
    r = gateway_run()
    assert r.rc == 0 and "fall 3 rise 2" in on(GW, f"cat {CFG}").stdout and proxy_pid() == pid
    assert call()[0] == 200


@pytest.mark.parametrize("bad, sentence", [
    ([{"host": "a100-1\n    server evil 6.6.6.6:80", "port": 8000}],
     "gateway_backends entry 1: host 'a100-1\\n    server evil 6.6.6.6:80' is not an IP address or a host name"),
    ([{"host": "10.0.0.5", "port": 70000}], "gateway_backends entry 1 (10.0.0.5): port 70000 is not a TCP port (1-65535)"),
    ([], "gateway_backends is empty: list the model endpoints of the GPU hosts"),
])
def test_bad_backends_refused_in_one_sentence_gateway_untouched(fleet, bad, sentence):
    pid, digest = proxy_pid(), cfg_digest()
    r = pyinfra("deploys/gateway.py", hosts=[GW], data={"gateway_backends": json.dumps(bad)})
    assert r.rc != 0 and sentence in r.out, r.out[-3000:]
    assert cfg_digest() == digest and proxy_pid() == pid
    assert not [op for op in r.changed() if "Gateway" in op], r.changed()
    assert call()[0] == 200


def test_an_unresolvable_backend_fails_haproxy_check_and_the_gateway_is_untouched(fleet):
    pid, digest = proxy_pid(), cfg_digest()
    r = pyinfra("deploys/gateway.py", hosts=[GW],
                data={"gateway_backends": json.dumps([*backends(), {"host": "no-such-host.invalid", "port": 8800}])})
    assert r.rc != 0 and f"the gateway config of {GW} fails haproxy -c (" in r.out, r.out[-3000:]
    assert cfg_digest() == digest and proxy_pid() == pid
    assert call()[0] == 200
