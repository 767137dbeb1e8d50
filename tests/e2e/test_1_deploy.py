"""The main job against the testbed: converge, idempotence, refusals, serving, secrets."""
import json
import time

import pytest

from conftest import on, pyinfra, wait_for

pytestmark = pytest.mark.e2e
HOSTS = ["a100-1", "h100-1", "h200-1"]


def test_first_converge_serves_every_host(converged):
    first = converged["first"]
    assert first.rc == 0
    assert not first.errors()
    assert "nemofleet serving | vLLM units" in first.changed()
    for host in HOSTS:
        units = on(host, "systemctl list-units --no-legend 'nemofleet-vllm-*' | awk '{print $1, $3, $4}'").stdout.split("\n")
        units = [u for u in units if u]
        want = 8 if host == "h100-1" else 1
        assert len(units) == want, units
        assert all(u.endswith("active running") for u in units), units


def test_second_run_reports_zero_changes(converged):
    """Molecule's idempotence step: a second converge on converged hosts changes nothing."""
    second = converged["second"]
    assert second.rc == 0, second.out[-4000:]
    assert second.rows, second.out[-2000:]
    assert second.changed() == [], f"operations changed on the second run: {second.changed()}"
    assert all(r["nochange"] == str(r["hosts"]) for r in second.rows)


def test_broken_host_refused_with_its_sentence_others_proceed(converged):
    r = pyinfra(deploy="deploys/nemotron.py", env={"NEMOFLEET_TESTBED_BROKEN": "1"})
    assert r.rc == 1
    assert ("nemofleet refused broken-1: driver 535.104.05 supports CUDA 12.2 but vllm/vllm-openai:v0.27.1 "
            "needs CUDA 12.8 (driver >= 570.26)") in r.out
    assert "nemofleet refused broken-1: the NVIDIA Container Toolkit is not installed" in r.out
    # the other hosts proceed, with zero changes; the broken host got nothing at all
    assert r.changed() == []
    assert on("broken-1", "ls /etc/nemofleet /etc/systemd/system/nemofleet-vllm-* 2>&1 || true").stdout.count("No such file") == 2
    assert on("broken-1", "test -e /etc/docker/daemon.json && echo yes || echo no").stdout.strip() == "no"
    # an honest dry run: --dry runs no command, yet names the host the preflight refuses, with its sentences
    dry = pyinfra(deploy="deploys/nemotron.py", hosts=["broken-1", "h200-1"], extra=("--dry",),
                  env={"NEMOFLEET_TESTBED_BROKEN": "1"})
    assert "Traceback" not in dry.out, dry.out[-3000:]
    said = [line for line in dry.out.splitlines() if "preflight would refuse this host: " in line]
    assert all("broken-1" in line for line in said) and len(said) >= 2, dry.out[-3000:]
    assert any("preflight would refuse this host: driver 535.104.05 supports CUDA 12.2 but "
               "vllm/vllm-openai:v0.27.1 needs CUDA 12.8 (driver >= 570.26)" in line for line in said), said
    assert any("the NVIDIA Container Toolkit is not installed" in line for line in said), said


def test_chat_through_frontend_network_with_key_and_401_without(converged):
    import nemofleet_testbed as testbed

    key = (testbed.testbed_dir() / "api-key").read_text().strip()
    # a "frontend" container on the Open-WebUI network talks to http://nemotron:8000/v1
    probe = (
        "import json, sys, urllib.request as u\n"
        "key = open('/key').read().strip()\n"
        "def call(path, data=None, auth=True):\n"
        "    h = {'Content-Type': 'application/json'}\n"
        "    if auth: h['Authorization'] = 'Bearer ' + key\n"
        "    try:\n"
        "        r = u.urlopen(u.Request('http://nemotron:8000' + path, data=data, headers=h), timeout=10)\n"
        "        return r.status, json.load(r)\n"
        "    except u.HTTPError as e:\n"
        "        return e.code, None\n"
        "body = json.dumps({'model': 'nemotron-3.5-lightning', 'max_tokens': 2048, 'messages': [{'role': 'user', 'content': 'What is 17*23?'}]}).encode()\n"
        "print(json.dumps({'chat': call('/v1/chat/completions', body), 'noauth': call('/v1/models', auth=False)[0]}))\n"
    )
    on("a100-1", f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF\ncp /etc/nemofleet/vllm.env /tmp/k.env && sed -n 's/^VLLM_API_KEY=//p' /tmp/k.env > /tmp/key && rm /tmp/k.env")
    r = on("a100-1", "docker run --rm --network open-webui_default --entrypoint python3 -v /tmp/probe.py:/probe.py:ro "
                     "-v /tmp/key:/key:ro vllm/vllm-openai:v0.27.1 /probe.py")
    on("a100-1", "rm -f /tmp/key")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    status, chat = out["chat"]
    assert status == 200
    msg = chat["choices"][0]["message"]
    assert msg["content"] and msg["reasoning"]
    assert out["noauth"] == 401
    assert key  # the key file of this testbed exists


def test_secrets_never_in_output_processes_units_or_logs(converged):
    import nemofleet_testbed as testbed

    secrets = [(testbed.testbed_dir() / n).read_text().strip() for n in ("api-key", "hf-token")]
    outputs = converged["first"].out + converged["second"].out
    for host in HOSTS:
        dump = on(host, "ps auxww; cat /etc/systemd/system/nemofleet-vllm-*.service; journalctl --no-pager -o cat; "
                        "cat /usr/local/bin/nemofleet-health /etc/cron.d/nemofleet-health; docker ps --no-trunc; "
                        "stat -c '%a %n' /etc/nemofleet /etc/nemofleet/*", check=False).stdout
        for s in secrets:
            assert s not in dump, f"a secret leaked on {host}"
        assert "600 /etc/nemofleet/vllm.env" in dump and "600 /etc/nemofleet/hf.env" in dump
        assert "700 /etc/nemofleet\n" in dump
    for s in secrets:
        assert s not in outputs


def test_units_verify_and_restart_keeps_networks(converged, changes):
    on("h200-1", "systemd-analyze verify /etc/systemd/system/nemofleet-vllm-nemotron-0.service")
    nets = on("h200-1", "docker inspect -f '{{json .NetworkSettings.Networks}}' nemotron-0").stdout
    assert "open-webui_default" in nets and "dify_default" in nets
    # kill the container: systemd brings it back, on both networks
    on("h200-1", "docker kill nemotron-0")
    changes.made("h200-1", "its vLLM container killed")
    deadline = time.time() + 90
    while time.time() < deadline:
        r = on("h200-1", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health", check=False)
        if r.stdout == "200":
            break
        time.sleep(2)
    assert r.stdout == "200"
    nets = json.loads(on("h200-1", "docker inspect -f '{{json .NetworkSettings.Networks}}' nemotron-0").stdout)
    assert set(nets) == {"open-webui_default", "dify_default"}
    assert "nemotron" in nets["open-webui_default"]["Aliases"]
    # restart Docker itself: Requires=docker.service brings the unit (and its networks) back
    on("h200-1", "systemctl restart docker")
    assert wait_health("h200-1", 8000) == "200"
    nets = json.loads(on("h200-1", "docker inspect -f '{{json .NetworkSettings.Networks}}' nemotron-0").stdout)
    assert set(nets) == {"open-webui_default", "dify_default"}


def wait_health(host, port, timeout=120):
    deadline = time.time() + timeout
    code = ""
    while time.time() < deadline:
        code = on(host, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health", check=False).stdout
        if code == "200":
            break
        time.sleep(2)
    return code


def test_changing_one_instance_flag_restarts_only_that_instance(converged, changes):
    def started():
        return {n: on("h100-1", f"docker inspect -f '{{{{.State.StartedAt}}}}' {n}").stdout.strip()
                for n in (f"nemotron-{i}" for i in range(8))}

    before = started()
    r = pyinfra(hosts=["h100-1"], data={"instance_extra_args": json.dumps({"nemotron-3": {"--enforce-eager": True}})})
    changes.made("h100-1", "nemotron-3 converged with --enforce-eager")
    assert r.rc == 0, r.out[-3000:]
    after = started()
    assert [n for n in before if before[n] != after[n]] == ["nemotron-3"]
    assert "--enforce-eager" in on("h100-1", "docker inspect -f '{{json .Args}}' nemotron-3").stdout
    back = pyinfra(hosts=["h100-1"])
    assert back.rc == 0
    again = pyinfra(hosts=["h100-1"])
    assert again.changed() == []


def test_self_heal_restarts_after_k_failures_and_webhook_fires(converged, changes):
    host = "a100-1"
    receiver = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        body = self.rfile.read(int(self.headers['Content-Length']))\n"
        "        open('/tmp/webhook.log', 'ab').write(body + b'\\n')\n"
        "        self.send_response(204); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', 9911), H).serve_forever()\n"
    )
    on(host, f"cat > /tmp/receiver.py <<'EOF'\n{receiver}EOF\nrm -f /tmp/webhook.log; "
             "(setsid python3 /tmp/receiver.py >/dev/null 2>&1 &)")
    wait_for(f"the webhook receiver on {host} to listen on 127.0.0.1:9911",  # not a fixed sleep
             lambda: (on(host, "(echo > /dev/tcp/127.0.0.1/9911) 2>&1", check=False).returncode == 0, "refused"), 30,
             every=0.2)
    started = on(host, "docker inspect -f '{{.State.StartedAt}}' nemotron-0").stdout.strip()
    env = "FAIL_RESTART=2 WEBHOOK_URL=http://127.0.0.1:9911/hook"
    try:
        on(host, f"{env} /usr/local/bin/nemofleet-health")  # healthy: state up
        bad = f"{env} MODEL_NAME=not-served flock /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health"
        first = on(host, bad, check=False)
        changes.made(host, "a failed health check counted")
        assert first.returncode == 1 and "failure 1" in first.stdout
        second = on(host, bad, check=False)
        assert "restarting nemofleet-vllm-nemotron-0.service after 2 consecutive failures" in second.stdout
        assert wait_health(host, 8000) == "200"
        assert on(host, "docker inspect -f '{{.State.StartedAt}}' nemotron-0").stdout.strip() != started
        hook = on(host, "cat /tmp/webhook.log").stdout
        assert '"instance":"nemotron-0","state":"down"' in hook
        assert on(host, f"{env} /usr/local/bin/nemofleet-health", check=False).returncode == 0
        assert '"state":"up"' in on(host, "cat /tmp/webhook.log").stdout
    finally:
        on(host, "pkill -f /tmp/receiver.py; rm -f /tmp/receiver.py /tmp/webhook.log", check=False)


def test_a_converged_host_is_checked_in_two_remote_commands(converged):
    """The no-op run reads HostFacts, then every fact its operations need in one batch
    (facts/prefetch.py): 2 commands per host (there were 13, one per operation)."""
    r = pyinfra(hosts=["a100-1", "h200-1"], extra=["-vv"])
    assert r.rc == 0 and r.changed() == [], r.out[-3000:]
    for h in ("a100-1", "h200-1"):
        sent = [ln for ln in r.out.splitlines() if ln.startswith(f"[{h}] >>> ")]
        assert len(sent) <= 2, "\n".join(s[:160] for s in sent)


DRIFT_HOST = "h200-1"
DRIFT_UNIT = "/etc/systemd/system/nemofleet-vllm-nemotron-0.service"
DRIFT_FILES = ["/usr/local/bin/nemofleet-health", "/etc/nemofleet/vllm.env", DRIFT_UNIT, "/etc/docker/daemon.json"]
# what the run after the drift below must change, and nothing else: the three owners of what
# drifted, plus what they trigger (a rewritten GPU key of daemon.json forces the GPU probe; a
# rewritten unit file: daemon-reload, that unit's restart, the wait for it to be ready, one health run)
DRIFT_REPAIRS = [
    "nemofleet host configuration | Docker daemon.json (merged; reload or restart only when needed)",
    "nemofleet host configuration | Secrets (0600, root only)",
    "nemofleet serving | GPU access survives systemctl daemon-reload (probe)",
    "nemofleet serving | vLLM units",
    "nemofleet serving | Reload systemd for changed units",
    "nemofleet serving | vLLM instances enabled and running",
    "nemofleet serving | Wait until the (re)started instances are ready",
    "nemofleet health | Health check script and cron",
    # a (re)started instance or a rewritten health script: one health run, so status is current
    "nemofleet health | First health check (metrics for nemofleet status)",
]


def docker_reloads(host: str) -> int:
    """How many times dockerd on `host` has re-read daemon.json (SIGHUP: `systemctl reload docker`)."""
    return int(on(host, "journalctl -u docker --no-pager -o cat | grep -c 'Got signal to reload configuration'",
                  check=False).stdout.strip() or 0)


def test_drift_behind_the_tools_back_is_repaired_exactly(converged, changes):
    """Changed on a converged host by hand: a managed file's content (the health script), a
    secret's mode (the API key file made world-readable), one vLLM unit file (loaded by
    daemon-reload, as an admin would) and one key nemofleet owns in daemon.json (the nvidia
    runtime removed, Docker reloaded). The next run repairs exactly those, and only those
    operations (and what they trigger) change; the run after that changes nothing."""
    host = DRIFT_HOST

    def snapshot():
        return on(host, "stat -c '%a %n' " + " ".join(DRIFT_FILES) + "; sha256sum " + " ".join(DRIFT_FILES)).stdout

    def started():
        return on(host, "docker inspect -f '{{.State.StartedAt}}' nemotron-0").stdout.strip()

    before, started_before = snapshot(), started()
    on(host, "python3 -c 'import json; p=\"/etc/docker/daemon.json\"; d=json.load(open(p)); d.pop(\"runtimes\"); "
             "json.dump(d, open(p, \"w\"), indent=2)' && systemctl reload docker")
    on(host, "chmod 644 /etc/nemofleet/vllm.env; echo '# local edit' >> /usr/local/bin/nemofleet-health; "
             f"sed -i 's/^RestartSec=10$/RestartSec=30/' {DRIFT_UNIT} && systemctl daemon-reload")
    changes.made(host, "drift of daemon.json, vllm.env, the health script and a vLLM unit")
    reloads, dockerd = docker_reloads(host), on(host, "systemctl show -p MainPID --value docker").stdout
    assert on(host, "systemctl show -p RestartUSec --value nemofleet-vllm-nemotron-0").stdout.strip() == "30s"
    assert snapshot() != before

    repair = pyinfra(hosts=[host])
    assert repair.rc == 0, repair.out[-4000:]
    assert sorted(repair.changed()) == sorted(DRIFT_REPAIRS), repair.changed()
    assert snapshot() == before  # every file back to its bytes and mode, daemon.json's other keys kept
    assert docker_reloads(host) > reloads  # dockerd re-read daemon.json (SIGHUP: runtimes is a reload key)
    assert on(host, "systemctl show -p MainPID --value docker").stdout == dockerd  # and was not restarted
    assert on(host, "systemctl show -p RestartUSec --value nemofleet-vllm-nemotron-0").stdout.strip() == "10s"
    assert started() != started_before  # the instance whose unit drifted was restarted, and serves
    assert wait_health(host, 8000) == "200"

    again = pyinfra(hosts=[host])
    assert again.rc == 0 and again.changed() == [], again.changed()


def test_status_right_after_the_converge_shows_every_host_in_sync_and_healthy(converged):
    """The deploy ran the health check once behind the (re)starts (no wait for cron's first run), and
    status's baseline is the deploy's own decision: every host in sync, every instance healthy, the
    weights complete at 100 % (tensor bytes against the index's total)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    assert "nemofleet health | First health check (metrics for nemofleet status)" in converged["first"].changed()
    nemofleet = str(Path(sys.executable).with_name("nemofleet"))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([nemofleet, "status", "inventories/testbed.py", *[a for h in HOSTS for a in ("--limit", h)]],
                       cwd=root, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.count("(in sync)") == len(HOSTS), out
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("nemotron-")]
    assert len(rows) == 10 and all(" healthy " in ln and "last healthy never" not in ln for ln in rows), out
    weights = [ln for ln in out.splitlines() if ln.strip().startswith("weights ") and "complete" in ln]
    assert weights and all("(100%)" in ln for ln in weights if ", complete" in ln), out


def test_cron_health_has_run_and_metrics_show_up(converged):
    """(Last in this module: by then cron has had its minute.)"""
    on("a100-1", "test -f /etc/cron.d/nemofleet-health && stat -c '%U %a' /etc/cron.d/nemofleet-health | grep -qx 'root 644'")
    # only cron's runs reach the journal under this tag (the tests' own runs print to docker exec); its
    # latest line on nemotron-0 says healthy. The first comes a minute or two after the converge
    # installed the file: last in the module, this waits only when the module runs alone.
    def probe():
        r = on("a100-1", "journalctl -t nemofleet-health --no-pager -o cat 2>/dev/null | grep 'instance nemotron-0'",
               check=False)
        last = (r.stdout.strip().splitlines() or ["no nemofleet-health line on nemotron-0 yet"])[-1]
        return last.startswith("instance nemotron-0 healthy"), last
    wait_for("cron's health check to log nemotron-0 healthy on a100-1", probe, 150, every=5)
    prom = on("a100-1", "cat /var/lib/prometheus/node-exporter/nemofleet.prom").stdout
    assert 'nemofleet_vllm_up{instance="nemotron-0",model="nemotron-3.5-lightning",port="8000"} 1' in prom


def test_dry_run_of_the_converged_fleet_lists_no_change(converged):
    """Issue 39: on converged hosts `pyinfra --dry` (and the prompt, which shows the same table)
    lists no operation as a change or a conditional change: every operation decides from the facts
    read ahead, and one that only follows another's change (a restart, a reload, the audit line,
    the ready wait, the first health check) is not added at all (tests/unit/test_dry_run.py)."""
    import os
    import subprocess

    from conftest import PYINFRA, ROOT

    r = subprocess.run([PYINFRA, "inventories/testbed.py", "deploys/nemotron.py", "--dry", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-4000:]
    plan = json.loads(r.stdout[r.stdout.index("{"):])["plan"]
    assert len(plan) > 10, r.stdout[-2000:]
    shown = [(op["name"], op["hosts_with_change"], op["hosts_with_conditional_change"]) for op in plan
             if op["hosts_with_change"] or op["hosts_with_conditional_change"]]
    assert shown == [], shown
