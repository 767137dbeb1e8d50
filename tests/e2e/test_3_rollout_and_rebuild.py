"""Rolling rollouts with a health gate, halt and rollback, the deploy lock, an unreachable host,
and a disaster-recovery rebuild of a destroyed host (runs last: it changes releases)."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, on, pyinfra

pytestmark = pytest.mark.e2e
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
BASE = "vllm/vllm-openai:v0.27.1"
NEW = "vllm/vllm-openai:v0.27.1-nf2"
HOSTS = ["a100-1", "h100-1", "h200-1"]


def nemofleet(*args, env=None, timeout=1200):
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([NEMOFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr


def release(host):
    return on(host, "sed -n 's/^id=//p' /var/lib/nemofleet/release").stdout.strip()


def image(host):
    return on(host, "docker inspect -f '{{.Config.Image}}' nemotron-0").stdout.strip()


def row(out, host):
    return next(line for line in out.splitlines() if line.startswith(host + " "))


def set_fail(host, release_label):
    on(host, "python3 - <<'EOF'\nimport json\np='/etc/nemofleet-sim/profile.json'\nd=json.load(open(p))\n"
             f"d['standin_fail_release']={release_label!r}\njson.dump(d, open(p, 'w'))\nEOF")


def test_rollout_new_tag_canary_then_batches(converged, changes):
    left = {h: image(h) for h in HOSTS if image(h) != BASE}
    assert not left, f"a test before this one left these hosts off the base release: {left}"
    before = {h: release(h) for h in HOSTS}
    rc, out = nemofleet("rollout", "inventories/testbed.py", "--bake", "0", "--canary", "1", "--batch", "1", "--wait", "120",
                        "--data", f"vllm_image={NEW}")
    for h in HOSTS:
        changes.made(h, f"a rollout to {NEW}")
    assert rc == 0, out
    assert out.index("canary: a100-1") < out.index("batch 1: h100-1") < out.index("batch 2: h200-1")
    for h in HOSTS:
        assert re.search(rf"^{h}\s+{before[h]} -> {release(h)}\s+ok\b", out, re.M), out
        assert release(h) != before[h] and image(h) == NEW
        assert "rollout" in on(h, "tail -1 /var/lib/nemofleet/audit.log").stdout


def test_failed_canary_halts_before_any_other_host(converged, changes):
    on_new = {h: release(h) for h in HOSTS}
    rc, out = nemofleet("rollout", "inventories/testbed.py", "--bake", "0", "--canary", "1", "--batch", "2", "--wait", "30",
                        "--data", f"vllm_image={BASE}-broken")  # this image's engine never starts
    changes.made("a100-1", "a failed canary rollout")
    assert rc == 1, out
    assert "HALTED" in out
    assert "rolled back" in row(out, "a100-1")
    assert release("a100-1") == on_new["a100-1"] and image("a100-1") == NEW
    assert on("a100-1", "/usr/local/bin/nemofleet-health", check=False).returncode == 0  # serving the old release
    for h in ("h100-1", "h200-1"):
        assert "not reached" in row(out, h) and release(h) == on_new[h] and image(h) == NEW


def test_failed_gate_on_second_host_halts_and_rolls_back(converged, changes):
    on_new = {h: release(h) for h in HOSTS}
    set_fail("h100-1", "base")  # the base release cannot start on h100-1's GPUs
    try:
        rc, out = nemofleet("rollout", "inventories/testbed.py", "--bake", "0", "--canary", "1", "--batch", "1", "--wait", "30",
                            "--data", f"vllm_image={BASE}")
    finally:
        set_fail("h100-1", None)
    for h in ("a100-1", "h100-1"):
        changes.made(h, f"a rollout to {BASE} halted on h100-1")
    assert rc == 1, out
    assert "HALTED" in out
    assert " ok " in row(out, "a100-1") and image("a100-1") == BASE
    assert "rolled back" in row(out, "h100-1")
    assert release("h100-1") == on_new["h100-1"] and image("h100-1") == NEW
    assert on("h100-1", "/usr/local/bin/nemofleet-health", check=False).returncode == 0  # serving the old release
    assert "not reached" in row(out, "h200-1") and release("h200-1") == on_new["h200-1"]  # never touched


def test_second_concurrent_rollout_refused_with_holder(converged):
    rc, out = nemofleet("lock", "acquire", "inventories/testbed.py", "--message", "maintenance",
                        env={"NEMOFLEET_OPERATOR": "alice"})
    assert rc == 0, out
    token = re.search(r"^export NEMOFLEET_LOCK_TOKEN=([0-9a-f]{32})$", out, re.M).group(1)  # shown once
    try:
        rc, out = nemofleet("rollout", "inventories/testbed.py", "--bake", "0", "--data", f"vllm_image={NEW}")
        assert rc == 2
        assert re.search(r"is locked by alice@\S+ since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(maintenance\)", out), out
        rc, status = nemofleet("lock", "status", "inventories/testbed.py")
        assert "locked by alice@" in status
        # a plain deploy (no token) is refused too, with the way to wait or force, and changes nothing
        plain = pyinfra(hosts=["a100-1"], env={"NEMOFLEET_OPERATOR": "bob"})
        assert plain.rc == 1 and plain.changed() == [], plain.out[-3000:]
        assert re.search(r"nemofleet refused a100-1: this host is locked by alice@\S+ since [^,]+ \(maintenance\), "
                         r".*wait for it \(`nemofleet lock status`\) or, if it is abandoned, "
                         r"`nemofleet lock release --force`", plain.out), plain.out[-3000:]
        rc, out = nemofleet("lock", "release", "inventories/testbed.py",
                            env={"NEMOFLEET_OPERATOR": "bob", "NEMOFLEET_LOCK_TOKEN": "0" * 32})
        assert rc == 2 and "held by someone else" in out  # only the holder's token (or --force) releases
    finally:
        nemofleet("lock", "release", "inventories/testbed.py", env={"NEMOFLEET_LOCK_TOKEN": token})
    assert "free" in nemofleet("lock", "status", "inventories/testbed.py")[1]


def test_unreachable_host_counts_against_budget_and_is_reported(converged, changes):
    import nemofleet_testbed as testbed

    subprocess.run(["docker", "stop", "-t", "2", testbed.container("h200-1")], check=True, capture_output=True)
    try:
        t0 = time.time()
        rc, out = nemofleet("rollout", "inventories/testbed.py", "--bake", "0", "--batch", "3", "--max-failures", "1", "--wait", "60",
                            "--data", f"vllm_image={NEW}", timeout=600)
        elapsed = time.time() - t0
    finally:
        subprocess.run(["docker", "start", testbed.container("h200-1")], check=True, capture_output=True)
        testbed.wait_ssh("h200-1", testbed.read_state()["hosts"]["h200-1"]["port"])
    for h in HOSTS:
        changes.made(h, f"a rollout to {NEW} with h200-1 stopped")
    assert rc == 1, out
    assert "unreachable" in row(out, "h200-1")
    assert " ok " in row(out, "a100-1")
    assert elapsed < 300  # reported, not hung on


def test_rollback_returns_to_previous_release(converged, changes):
    before = release("a100-1")
    rc, out = nemofleet("rollback", "inventories/testbed.py", "--limit", "a100-1", "--wait", "60")
    changes.made("a100-1", "a rollback")
    assert rc == 0, out
    assert release("a100-1") != before
    assert on("a100-1", "/usr/local/bin/nemofleet-health", check=False).returncode == 0


def test_disaster_recovery_rebuild_of_a_destroyed_host(converged, changes):
    import nemofleet_testbed as testbed

    t0 = time.time()
    testbed.recreate("h200-1")  # container and volumes destroyed, a bare reinstall with a new host key
    # should the rebuild not take, the re-converge of the finalizer meets the new host key: forget the old
    changes.undo(lambda: testbed.forget_host_key(testbed.read_state()["hosts"]["h200-1"]["port"]))
    changes.made("h200-1", "destroyed and recreated bare")
    assert on("h200-1", "test -e /etc/systemd/system/nemofleet-vllm-nemotron-0.service", check=False).returncode == 1
    rc, out = nemofleet("rebuild", "inventories/testbed.py", "h200-1")
    assert rc == 1 and "--accept-new-host-key" in out  # a changed host key is never silently accepted
    from conftest import clear_mirror_log, mirror_log

    clear_mirror_log()
    # the operator reads the new key's fingerprint on the host's console (here: docker exec)
    fingerprint = on("h200-1", "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
    rc, out = nemofleet("rebuild", "inventories/testbed.py", "h200-1", "--accept-new-host-key",
                        "--expect-host-key", fingerprint, "--wait", "120",
                        "--data", f"weights_seed_from={testbed.container('a100-1')}")
    assert rc == 0, out
    # the weights came from the peer, verified on this host: the mirror served no file
    assert [x for x in mirror_log() if "/resolve/" in x] == []
    rev = testbed.read_state()["model_revision"][:12]
    assert on("h200-1", f"test -f /srv/nemofleet/models/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@{rev}/"
                        ".nemofleet-complete", check=False).returncode == 0
    for stage in ("host key", "preflight", "converge", "health gate"):
        assert re.search(rf"^\s+{stage}\s+\d+\.\d+s$", out, re.M), out
    assert "h200-1 rebuilt and serving" in out
    print(f"\nDR drill: recreate + rebuild took {time.time() - t0:.1f}s\n{out}")
    assert pyinfra(hosts=["h200-1"]).changed() == []


def test_fleet_back_on_the_inventory_release(converged):
    r = pyinfra()
    assert r.rc == 0, r.out[-3000:]
    assert pyinfra().changed() == []
