"""Weights through the mirror (real hf CLI in the image) and the daemon.json owner."""
import json
import shlex

import pytest

from conftest import clear_mirror_log, mirror_log, on, pyinfra

pytestmark = pytest.mark.e2e
REPO_DIR = "/srv/nemofleet/models/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"


class _ModelDir:
    """The weights directory of the testbed's pinned commit (one directory per repo and commit)."""

    def __str__(self):
        import nemofleet_testbed as testbed
        return f"{REPO_DIR}@{testbed.read_state()['model_revision'][:12]}"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


MODEL_DIR = _ModelDir()
SHARD = "model-00002-of-00002.safetensors"


def file_requests(lines):
    return [line for line in lines if "/resolve/" in line and line.startswith("GET ")]


def test_first_converge_fetched_each_file_from_the_mirror_once(converged):
    """The testbed's hosts serve one model: the converge fetched it from the mirror once and the
    other hosts copied it from a host of the run (the weights fan-out, docs/fanout.md), each copy
    verified on arrival (its completion marker). On a kept testbed nothing is fetched at all."""
    import nemofleet_testbed as testbed

    paths = [line.split()[1] for line in file_requests(converged["first_requests"])]
    assert len(paths) == len(set(paths)), paths  # no file twice
    hosts = [h for h in ("a100-1", "h100-1", "h200-1") if h in testbed.read_state()["hosts"]]
    for h in hosts:
        assert on(h, f"test -f {MODEL_DIR}/.nemofleet-complete", check=False).returncode == 0, h


def test_rerun_sends_no_file_requests(converged):
    clear_mirror_log()
    r = pyinfra()
    assert r.rc == 0 and r.changed() == []
    assert file_requests(mirror_log()) == []
    assert mirror_log() == []  # pinned commit + completion marker: not even a metadata call


def test_truncated_shard_is_fetched_again_alone(converged, changes):
    on("a100-1", f"truncate -s 1000 {MODEL_DIR}/{SHARD}")
    changes.made("a100-1", "a weights shard truncated")
    clear_mirror_log()
    r = pyinfra(hosts=["a100-1"])
    assert r.rc == 0, r.out[-3000:]
    got = file_requests(mirror_log())
    assert len(got) == 1 and SHARD in got[0], got
    assert "Weights" in " ".join(r.changed())
    size = on("a100-1", f"stat -c %s {MODEL_DIR}/{SHARD}").stdout.strip()
    assert int(size) > 1000
    assert pyinfra(hosts=["a100-1"]).changed() == []


def test_mirror_down_one_sentence_weights_left_intact(converged, changes):
    import nemofleet_testbed as testbed

    on("h200-1", f"truncate -s 1000 {MODEL_DIR}/{SHARD}")
    changes.made("h200-1", "a weights shard truncated")
    before = on("h200-1", f"ls -l {MODEL_DIR} | sort").stdout
    testbed.stop_mirror()
    try:
        r = pyinfra(hosts=["h200-1"])
    finally:
        testbed.start_mirror(testbed.read_state())
    assert r.rc == 1
    assert "Hugging Face mirror http://hf-mirror:8090 is unreachable" in r.out
    assert on("h200-1", f"ls -l {MODEL_DIR} | sort").stdout == before
    fixed = pyinfra(hosts=["h200-1"])
    assert fixed.rc == 0, fixed.out[-3000:]


def test_unknown_revision_refused_before_any_download(converged, changes):
    changes.undo(lambda: on("h200-1", "rm -rf /srv/other-models"))
    clear_mirror_log()
    bogus = "0" * 40
    model = json.dumps({"catalog": "nemotron-3.5-lightning-nvfp4", "revision": bogus})
    r = pyinfra(hosts=["h200-1"], data={"model": model, "models_root": "/srv/other-models"})
    assert r.rc == 1
    assert f"at revision {bogus} is not on http://hf-mirror:8090 (HTTP 404 RevisionNotFound)" in r.out
    assert file_requests(mirror_log()) == []


def daemon(host):
    return json.loads(on(host, "cat /etc/docker/daemon.json").stdout)


def started(host, name="nemotron-0"):
    return on(host, f"docker inspect -f '{{{{.State.StartedAt}}}}' {name}").stdout.strip()


def test_daemon_json_keeps_foreign_keys_reloads_for_mirrors_restarts_for_exec_opts(converged, changes):
    host = "h200-1"
    cur = daemon(host)
    original = on(host, "cat /etc/docker/daemon.json").stdout

    def put_back():  # the foreign keys go again (their values are Docker's defaults: no restart needed)
        on(host, f"cat > /etc/docker/daemon.json <<'EOF'\n{original}EOF")
    changes.undo(put_back)
    cur.update({"data-root": "/var/lib/docker", "bip": "172.17.0.1/16"})
    on(host, f"cat > /etc/docker/daemon.json <<'EOF'\n{json.dumps(cur)}\nEOF")
    changes.made(host, "foreign keys added to daemon.json")
    pid = on(host, "systemctl show -p MainPID --value docker").stdout.strip()
    t0 = started(host)
    r = pyinfra(hosts=[host], data={"docker_registry_mirrors": json.dumps(["https://mirror.invalid"])},
                extra=["--diff"])
    assert r.rc == 0, r.out[-3000:]
    d = daemon(host)
    assert d["data-root"] == "/var/lib/docker" and d["bip"] == "172.17.0.1/16"
    assert d["registry-mirrors"] == ["https://mirror.invalid"]
    assert on(host, "systemctl show -p MainPID --value docker").stdout.strip() == pid  # reloaded, not restarted
    assert started(host) == t0  # the vLLM container kept running
    assert "then reload docker" in r.out
    # the same again: zero changes
    again = pyinfra(hosts=[host], data={"docker_registry_mirrors": json.dumps(["https://mirror.invalid"])})
    assert again.changed() == []
    # exec-opts (the cgroup driver) needs a restart
    r = pyinfra(hosts=[host], data={"docker_registry_mirrors": json.dumps(["https://mirror.invalid"]),
                                     "docker_exec_opts": json.dumps(["native.cgroupdriver=cgroupfs"])})
    assert r.rc == 0, r.out[-3000:]
    assert on(host, "systemctl show -p MainPID --value docker").stdout.strip() != pid
    assert daemon(host)["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    # back to the inventory's settings (removes the mirror and exec-opts nemofleet owns)
    r = pyinfra(hosts=[host], data={"docker_registry_mirrors": "[]", "docker_exec_opts": "[]"})
    assert r.rc == 0, r.out[-3000:]
    d = daemon(host)
    assert "registry-mirrors" not in d and "exec-opts" not in d and d["bip"] == "172.17.0.1/16"


def test_dry_diff_shows_daemon_json_change_before_making_it(converged):
    host = "h200-1"
    before = on(host, "cat /etc/docker/daemon.json").stdout
    r = pyinfra(hosts=[host], data={"docker_registry_mirrors": json.dumps(["https://dry.invalid"])},
                extra=["--dry", "--diff"], yes=False)  # change detection runs only without -y
    assert r.rc == 0, r.out[-3000:]
    assert "Will modify /etc/docker/daemon.json" in r.out and "https://dry.invalid" in r.out
    assert on(host, "cat /etc/docker/daemon.json").stdout == before


@pytest.mark.parametrize("data,sentence", [
    ({"docker_registry_mirrors": json.dumps(["mirror.example:5000"])}, "needs a scheme, e.g. https://mirror.example:5000"),
    ({"docker_log_opts": json.dumps({"max-size": "100m", "max-file": 3})}, "docker log-opts values must be strings"),
    ({"nvml_remedy": "magic"}, "nvml_remedy 'magic' is unknown; use cdi, cgroupfs or none"),
])
def test_bad_docker_inputs_refused_with_one_sentence_and_no_change(converged, data, sentence):
    host = "h200-1"
    before = on(host, "cat /etc/docker/daemon.json; ls -l --time-style=+%s /etc/systemd/system/nemofleet-*").stdout
    r = pyinfra(hosts=[host], data=data)
    assert r.rc == 1
    assert sentence in r.out
    assert r.changed() == []
    assert on(host, "cat /etc/docker/daemon.json; ls -l --time-style=+%s /etc/systemd/system/nemofleet-*").stdout == before


@pytest.mark.parametrize("text, sentence", [
    ('{"log-driver": "json-file",', "/etc/docker/daemon.json is not valid JSON"),
    # valid JSON, a key nemofleet merges into of another type (dockerd refuses it too): typed where it
    # is read (facts.docker.DaemonJson: `data` none, so neither the decision nor the merge reads it),
    # this host refused in one sentence, never a TypeError in the deploy
    ('{"runtimes": 5}', "/etc/docker/daemon.json is a file that has 'runtimes' 5, not an object (dockerd "
                        "refuses the file too)"),
], ids=["not-json", "runtimes-a-number"])
def test_malformed_daemon_json_reported_and_left_untouched(converged, changes, text, sentence):
    host = "h200-1"
    good = on(host, "cat /etc/docker/daemon.json").stdout
    on(host, f"printf '%s' {shlex.quote(text)} > /etc/docker/daemon.json")
    try:
        changes.made(host, "daemon.json made malformed")
        r = pyinfra(hosts=[host])
        assert r.rc == 1
        assert sentence in r.out and "Traceback" not in r.out, r.out[-2000:]
        assert on(host, "cat /etc/docker/daemon.json").stdout == text
    finally:
        on(host, f"cat > /etc/docker/daemon.json <<'EOF'\n{good}EOF")
