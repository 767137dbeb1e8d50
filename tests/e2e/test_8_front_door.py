"""The front door (issue 17): HAProxy on h100-1 (8 instances) in front of its instances, reached from
a frontend network with the key (401 without), streamed; a rollout that changes a serving flag
restarts the instances one at a time through it with zero failed requests under load; config
changes reload (never restart) it; bad input is refused in one sentence with the proxy untouched.

Only h100-1 is needed: the module brings up and converges that host alone when run on its own."""
import hashlib
import json
import sys

import pytest

from conftest import ROOT, on, pyinfra, served_alone

pytestmark = pytest.mark.e2e
HOST = "h100-1"
CFG = "/etc/haproxy/haproxy.cfg"
sys.path.insert(0, str(ROOT / "bench"))
import front_door as bench  # noqa: E402


@pytest.fixture(scope="module")
def served():
    yield from served_alone(HOST)


def proxy_pid() -> str:
    return on(HOST, "systemctl show -p MainPID --value haproxy").stdout.strip()


def cfg_digest() -> str:
    return hashlib.sha256(on(HOST, f"cat {CFG}").stdout.encode()).hexdigest()


def started() -> dict:
    return {n: on(HOST, f"docker inspect -f '{{{{.State.StartedAt}}}}' {n}").stdout.strip()
            for n in (f"nemotron-{i}" for i in range(8))}


def test_converged_front_door_second_run_zero_changes_and_key_kept_secret(served):
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [], again.changed() or again.out[-3000:]
    key = on(HOST, "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env").stdout.strip()
    assert key and key not in on(HOST, f"cat {CFG}").stdout
    assert on(HOST, "stat -c '%U %a' /etc/nemofleet/front-door.keys").stdout.strip() == "root 600"
    assert key not in on(HOST, "ps -eo args").stdout
    assert on(HOST, "systemctl is-active haproxy").stdout.strip() == "active"
    # all 8 instances are UP behind it, balanced by least outstanding requests
    text = on(HOST, f"cat {CFG}").stdout
    assert "balance leastconn" in text and text.count("    server nemotron-") == 8
    assert all(on(HOST, f"/usr/local/bin/nemofleet-drain state nemotron-{i}").stdout.strip() == "ready" for i in range(8))


def test_frontend_container_streams_through_the_front_door_with_key_and_401_without(served):
    gw = on(HOST, "ip -4 -o addr show dev docker0 | awk '{print $4}' | cut -d/ -f1").stdout.strip()
    probe = (
        "import json, sys, urllib.request as u\n"
        "key = open('/key').read().strip()\n"
        "def call(path, data=None, auth=True):\n"
        "    h = {'Content-Type': 'application/json'}\n"
        "    if auth: h['Authorization'] = 'Bearer ' + key\n"
        "    try:\n"
        f"        r = u.urlopen(u.Request('http://{gw}:8800' + path, data=data, headers=h), timeout=30)\n"
        "        return r.status, r.headers.get('content-type'), r.read().decode()\n"
        "    except u.HTTPError as e:\n"
        "        return e.code, None, ''\n"
        "body = json.dumps({'model': 'nemotron-3.5-lightning', 'stream': True, 'max_tokens': 64,\n"
        "                   'messages': [{'role': 'user', 'content': 'What is 17*23?'}]}).encode()\n"
        "print(json.dumps({'chat': call('/v1/chat/completions', body), 'noauth': call('/v1/models', auth=False)[0],\n"
        "                  'health': call('/health', auth=False)[0]}))\n"
    )
    on(HOST, f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF\nsed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env > /tmp/key")
    try:
        r = on(HOST, "docker run --rm --network open-webui_default --entrypoint python3 -v /tmp/probe.py:/probe.py:ro "
                     "-v /tmp/key:/key:ro vllm/vllm-openai:v0.27.1 /probe.py")
    finally:
        on(HOST, "rm -f /tmp/key /tmp/probe.py")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    status, ctype, text = out["chat"]
    assert status == 200 and ctype.startswith("text/event-stream"), out
    assert text.count("data: {") > 3 and text.rstrip().endswith("data: [DONE]")
    assert out["noauth"] == 401 and out["health"] == 200
    # the instances no longer join the frontend networks: frontends reach the front door
    assert "open-webui_default" not in on(HOST, "docker inspect -f '{{json .NetworkSettings.Networks}}' nemotron-0").stdout


def test_rollout_of_a_serving_flag_under_load_fails_no_request(served, changes):
    pid, before = proxy_pid(), started()
    during, rc, out, took = bench.during_rollout(
        HOST, ["--wait", "120", "--data", 'vllm_extra_args={"seed": 7}'], env={"NEMOFLEET_TESTBED_HOSTS": HOST})
    changes.made(HOST, "a rollout of --seed 7")
    assert rc == 0, out[-3000:]
    assert during["requests"] > 50 and during["failed"] == 0, during
    after = started()
    assert all(before[n] != after[n] for n in before), (before, after)  # every instance restarted
    assert '"--seed","7"' in on(HOST, "docker inspect -f '{{json .Args}}' nemotron-5").stdout
    assert proxy_pid() == pid  # the proxy itself never restarted
    assert all(on(HOST, f"/usr/local/bin/nemofleet-drain state nemotron-{i}").stdout.strip() == "ready" for i in range(8))


def test_rollback_under_load_goes_through_the_front_door_and_fails_no_request(served, changes):
    """The rollout test above kept the inventory's release: rolling back to it restarts the
    instances one at a time through the front door, as the deploy does, and leaves the host exactly
    as the inventory plans it (the next run changes nothing)."""
    pid, before = proxy_pid(), started()
    during, rc, out, took = bench.during_rollout(HOST, ["--wait", "120"], env={"NEMOFLEET_TESTBED_HOSTS": HOST},
                                                 command="rollback")
    changes.made(HOST, "a rollback")
    assert rc == 0, out[-3000:]
    assert during["requests"] > 20 and during["failed"] == 0, during
    assert all(before[n] != started()[n] for n in before)
    assert '"--seed"' not in on(HOST, "docker inspect -f '{{json .Args}}' nemotron-5").stdout
    assert proxy_pid() == pid
    assert all(on(HOST, f"/usr/local/bin/nemofleet-drain state nemotron-{i}").stdout.strip() == "ready" for i in range(8))
    assert pyinfra(hosts=[HOST]).changed() == []


def test_a_config_change_reloads_the_proxy_without_a_restart(served, changes):
    pid = proxy_pid()
    r = pyinfra(hosts=[HOST], data={"front_door_timeout": 7200})
    changes.made(HOST, "front_door_timeout 7200")
    assert r.rc == 0, r.out[-3000:]
    assert "nemofleet serving | Front door: reload HAProxy (connections in flight are kept)" in r.changed()
    assert "timeout server 7200s" in on(HOST, f"cat {CFG}").stdout and proxy_pid() == pid
    assert not [op for op in r.changed() if op.startswith("nemofleet serving | Restart ")]  # no instance restarted
    r = pyinfra(hosts=[HOST])
    assert r.rc == 0 and "timeout server 3600s" in on(HOST, f"cat {CFG}").stdout and proxy_pid() == pid


def test_a_config_that_fails_haproxy_check_is_refused_and_the_proxy_untouched(served):
    # an older HAProxy that does not know a keyword of the rendered config (simulated on the host)
    on(HOST, "printf '%s\\n' '#!/bin/sh' 'case \" $* \" in *\" -c \"*nemofleet-tmp*) "
             "echo \"[ALERT]    (1) : config : parsing [x:44] : unknown keyword http-check send\" >&2; exit 1;; esac' "
             "'exec /usr/sbin/haproxy \"$@\"' > /usr/local/sbin/haproxy && chmod 755 /usr/local/sbin/haproxy")
    pid, digest = proxy_pid(), cfg_digest()
    try:
        r = pyinfra(hosts=[HOST], data={"front_door_timeout": 7200})
    finally:
        on(HOST, "rm -f /usr/local/sbin/haproxy")
    assert r.rc != 0
    assert (f"the front door config of {HOST} fails haproxy -c ([ALERT]    (1) : config : parsing [x:44] : unknown "
            f"keyword http-check send); {CFG} and the running proxy are left as they were") in r.out
    assert cfg_digest() == digest and proxy_pid() == pid
    assert on(HOST, "ls /etc/haproxy/.haproxy.cfg.nemofleet-tmp 2>/dev/null || echo none").stdout.strip() == "none"
    assert bench.phase(HOST, requests=8)["failed"] == 0  # still serving through the old config
    assert pyinfra(hosts=[HOST]).rc == 0


@pytest.mark.parametrize("data, sentence", [
    ({"front_door_port": 8003}, "front_door_port 8003 is the port of an instance (8000-8007 are taken): choose another"),
    ({"front_door_address": "10.99.0.1"}, "front_door_address 10.99.0.1 is not an address of this host"),
    ({"frontends": json.dumps([{"network": "nope_default"}])},
     f"Docker network nope_default does not exist on {HOST}; start its frontend first or set create: true for it"),
    ({"instance_extra_args": json.dumps({"nemotron-1": {"--served-model-name": "other"}})},
     "instance_extra_args.nemotron-1 sets --served-model-name, which the plan decides"),
])
def test_bad_input_refused_in_one_sentence_proxy_untouched(served, data, sentence):
    pid, digest = proxy_pid(), cfg_digest()
    r = pyinfra(hosts=[HOST], data=data)
    assert r.rc != 0 and sentence in r.out, r.out[-3000:]
    assert cfg_digest() == digest and proxy_pid() == pid
    assert not [op for op in r.changed() if "Front door" in op or "Restart " in op], r.changed()
