"""Faults and hostile input on the testbed: each is refused or bounded with one sentence, and a
host that is refused gets nothing changed. (The "Faults and bad input" table of docs/security.md lists these.)"""
import json
import time

import pytest

from conftest import on, pyinfra

pytestmark = pytest.mark.e2e


def restarts(host):
    return on(host, "cat /var/lib/nemofleet/health/nemotron-0.restarts 2>/dev/null | wc -l").stdout.strip()


def test_self_heal_is_bounded_by_the_loading_grace_and_an_hourly_cap(converged, changes):
    host = "a100-1"
    changes.undo(lambda: on(host, "rm -f /var/lib/nemofleet/health/nemotron-0.restarts"))
    bad = "MODEL_NAME=not-served FAIL_RESTART=1 flock /run/lock/nemofleet-health.lock /usr/local/bin/nemofleet-health"
    on(host, "rm -f /var/lib/nemofleet/health/nemotron-0.restarts; /usr/local/bin/nemofleet-health")  # healthy
    first = on(host, bad, check=False).stdout
    changes.made(host, "a self-heal restart")
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


def _publish_commit(sha: str, ref: str) -> str:
    """A second commit of the testbed's model on the mirror: the first one with config.json changed."""
    import nemofleet_testbed as testbed
    state = testbed.read_state()
    repo = testbed.testbed_dir() / "hf" / "repos" / "nvidia" / "NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    src, dst = repo / state["model_revision"], repo / sha
    if not dst.exists():
        import shutil
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["nemofleet_test_commit"] = sha[:12]
        (dst / "config.json").write_text(json.dumps(cfg))
    refs = json.loads((repo / "refs.json").read_text())
    refs[ref] = sha
    (repo / "refs.json").write_text(json.dumps(refs))
    return state["model_revision"]


def _unpublish_commit(sha: str, ref: str) -> None:
    """The mirror as it was: the second commit and its ref gone."""
    import shutil

    import nemofleet_testbed as testbed
    repo = testbed.testbed_dir() / "hf" / "repos" / "nvidia" / "NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    refs = json.loads((repo / "refs.json").read_text())
    refs.pop(ref, None)
    (repo / "refs.json").write_text(json.dumps(refs))
    shutil.rmtree(repo / sha, ignore_errors=True)


def test_revision_change_downloads_the_new_commit_and_rollback_restores_the_old(converged, changes):
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT, clear_mirror_log, mirror_log

    new = "b" * 40
    old = _publish_commit(new, "nemofleet-test-v2")
    changes.undo(lambda: _unpublish_commit(new, "nemofleet-test-v2"))
    root = "/srv/nemofleet/models/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    before = on("h200-1", "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip()
    clear_mirror_log()
    model = json.dumps({"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "nemofleet-test-v2"})
    r = pyinfra(hosts=["h200-1"], data={"model": model})
    changes.made("h200-1", "a new model revision converged")
    assert r.rc == 0, r.out[-4000:]
    assert f"revision 'nemofleet-test-v2' of nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4 is {new[:12]}" in r.out
    # the new commit was fetched; only what changed between the commits crossed the wire
    got = [x for x in mirror_log() if "/resolve/" in x and x.startswith("GET ")]
    assert got and all(new in x for x in got) and any("config.json" in x for x in got), got
    # shards were hard-linked from the old commit and kept (model-00002 was truncated and re-fetched by an
    # earlier test, so huggingface_hub re-checks that one: its mtime is newer than its metadata)
    assert not any("model-00001-of-00002.safetensors" in x for x in got), got
    record = on("h200-1", "cat /var/lib/nemofleet/release").stdout
    assert f"model=nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@{new}" in record
    assert on("h200-1", f"grep -c nemofleet_test_commit {root}@{new[:12]}/config.json").stdout.strip() == "1"
    assert on("h200-1", f"test -f {root}@{old[:12]}/.nemofleet-complete", check=False).returncode == 0  # kept
    mounts = on("h200-1", "docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' nemotron-0").stdout
    assert f"{root}@{new[:12]}" in mounts
    # rollback: the units of the release before, which mount the old commit's weights
    nf = str(Path(sys.executable).with_name("nemofleet"))
    rb = subprocess.run([nf, "rollback", "inventories/testbed.py", "--limit", "h200-1", "--wait", "120"], cwd=ROOT,
                        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert rb.returncode == 0, rb.stdout + rb.stderr
    assert on("h200-1", "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip() == before
    mounts = on("h200-1", "docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' nemotron-0").stdout
    assert f"{root}@{old[:12]}" in mounts
    # back to the inventory's pinned commit: nothing to download, the unused commit is pruned
    clear_mirror_log()
    back = pyinfra(hosts=["h200-1"])
    assert back.rc == 0 and [x for x in mirror_log() if "/resolve/" in x] == []
    assert on("h200-1", f"test -e {root}@{new[:12]}", check=False).returncode == 1
    assert pyinfra(hosts=["h200-1"]).changed() == []


HOST_STATE = "md5sum /etc/systemd/system/nemofleet-vllm-*.service /etc/docker/daemon.json"


def refused_alone_within_bound(fault: str, undo: str, words: str) -> None:
    """With `fault` run on h200-1, a converge of h200-1 and a100-1 refuses h200-1 in one sentence
    (`words`), changes nothing anywhere, and ends well inside its bound (the facts' 20 s timeouts,
    not the stuck tool); `undo` runs whatever happens."""
    before = on("h200-1", HOST_STATE).stdout
    on("h200-1", fault)
    try:
        t0 = time.time()
        r = pyinfra(hosts=["h200-1", "a100-1"], timeout=300)
        elapsed = time.time() - t0
    finally:
        on("h200-1", undo)
    assert r.rc == 1, r.out[-3000:]
    assert f"nemofleet refused h200-1: {words}" in r.out, r.out[-3000:]
    assert "Traceback" not in r.out and "nemofleet refused a100-1" not in r.out
    assert r.changed() == [], r.changed()
    assert on("h200-1", HOST_STATE).stdout == before
    assert elapsed < 150, elapsed


@pytest.mark.parametrize("fault, words", [
    ("hang", "could not read gpus on this host: nvidia-smi did not answer within 20 s (hung driver?)"),
    ("garbage", "could not read gpus on this host: nvidia-smi printed '[Unknown Error]' for memory.total of GPU 0, "
                "which nemofleet cannot read"),
])
def test_hung_or_garbage_nvidia_smi_refuses_that_host_only_within_bounded_time(converged, fault, words):
    """A wedged driver or unreadable nvidia-smi output refuses that host in one sentence; the rest of
    the fleet converges as usual (here: zero changes) and the run does not hang."""
    refused_alone_within_bound(f"echo {fault} > /etc/nemofleet-sim/smi-fault", "rm -f /etc/nemofleet-sim/smi-fault",
                               words)


def test_a_frozen_dockerd_refuses_that_host_only_within_bounded_time(converged):
    """dockerd stopped in its tracks (SIGSTOP: its socket still accepts, nothing answers), as a
    hung storage driver leaves it: the Engine API read stops at its deadline and refuses that host
    in one sentence; the rest of the fleet converges as usual and the run does not hang."""
    pid = on("h200-1", "systemctl show -p MainPID --value docker").stdout.strip()
    assert pid.isdigit() and pid != "0", pid
    refused_alone_within_bound(f"kill -STOP {pid}", f"kill -CONT {pid}",
                               "could not read docker on this host: docker info did not answer within 20 s "
                               "(dockerd hung?)")
    assert on("h200-1", "timeout 20 docker info --format '{{.ServerVersion}}'").stdout.strip()  # answers again


def test_unit_words_reach_the_program_intact_through_the_hosts_systemd(converged):
    """systemd_word() quoting, judged by the real consumer: the host's systemd parses a unit whose
    ExecStart carries hostile words (as vLLM flag values do) and runs a program that records argv."""
    from nemofleet.render import systemd_word

    words = ["$(touch /tmp/pwned)", "`id`", "a b", "a'b", 'a"b', "50%", "%h", "${HOME}", "$HOME", "a\\b",
             '{"temperature": 0.6, "top_p": "0.95"}', "x;y", "--network=host", "-", ""]
    unit = ("[Service]\nType=oneshot\n"
            "ExecStart=/usr/bin/python3 -c 'import json,sys; open(\"/tmp/nf-argv.json\",\"w\").write(json.dumps(sys.argv[1:]))' "
            + " ".join(systemd_word(w) for w in words) + "\n")
    host = "a100-1"
    on(host, f"rm -f /tmp/pwned /tmp/nf-argv.json; cat > /etc/systemd/system/nf-argv-test.service <<'EOF'\n{unit}EOF\n"
             "systemctl daemon-reload && systemctl start nf-argv-test.service")
    try:
        got = json.loads(on(host, "cat /tmp/nf-argv.json").stdout)
        assert got == words, (got, unit)
        assert on(host, "test -e /tmp/pwned", check=False).returncode == 1
    finally:
        on(host, "rm -f /etc/systemd/system/nf-argv-test.service /tmp/nf-argv.json; systemctl daemon-reload")
