"""daemon.json merge: own only nemofleet's keys, reload vs restart per reference §4."""
import pytest

from nemofleet.operations.daemon_json import DaemonJsonError, merge, needs_restart, render, validate_settings

NVIDIA = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}}


def test_merge_keeps_foreign_keys_and_other_runtimes():
    cur = {"data-root": "/data/docker", "bip": "10.10.0.1/24", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}
    out = merge(cur, {**NVIDIA, "registry-mirrors": ["https://m.example"]})
    assert out["data-root"] == "/data/docker" and out["bip"] == "10.10.0.1/24"
    assert set(out["runtimes"]) == {"crun", "nvidia"}
    assert merge(out, {**NVIDIA, "registry-mirrors": ["https://m.example"]}) == out  # idempotent


def test_none_removes_an_owned_key():
    assert "registry-mirrors" not in merge({"registry-mirrors": ["https://a"]}, {"registry-mirrors": None})


def test_reload_or_restart():
    assert needs_restart({}, {"registry-mirrors": ["https://a"]}) == []
    assert needs_restart({}, NVIDIA) == []
    assert needs_restart({}, {"exec-opts": ["native.cgroupdriver=cgroupfs"]}) == ["exec-opts"]
    assert needs_restart({"log-opts": {"max-size": "10m"}}, {"log-opts": {"max-size": "100m"}}) == ["log-opts"]
    assert needs_restart({}, {"features": {"cdi": True}}) == ["features.cdi (enabling CDI)"]


@pytest.mark.parametrize("desired,sentence", [
    ({"registry-mirrors": ["mirror:5000"]}, "registry mirror 'mirror:5000' needs a scheme"),
    ({"log-opts": {"max-file": 3}}, "docker log-opts values must be strings"),
    ({"hosts": ["tcp://0.0.0.0:2375"]}, "must not be set"),
    ({"insecure-registries": ["http://r:5000"]}, "without a scheme"),
    ({"exec-opts": "native.cgroupdriver=cgroupfs"}, "exec-opts must be a list of strings"),
])
def test_bad_settings_refused(desired, sentence):
    with pytest.raises(DaemonJsonError) as e:
        validate_settings(desired)
    assert sentence in str(e.value)


def test_render_is_stable_sorted_4_space():
    assert render({"b": 1, "a": {"y": 1, "x": 2}}) == '{\n    "a": {\n        "x": 2,\n        "y": 1\n    },\n    "b": 1\n}\n'
