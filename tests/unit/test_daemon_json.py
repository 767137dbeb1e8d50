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


def test_exec_opts_merged_by_name_operator_options_kept_in_order():
    cur = {"exec-opts": ["native.umask=normal", "native.cgroupdriver=systemd", "isolation=process"]}
    out = merge(cur, {"exec-opts": ["native.cgroupdriver=cgroupfs"]})
    assert out["exec-opts"] == ["native.umask=normal", "native.cgroupdriver=cgroupfs", "isolation=process"]
    # not listed: only nemofleet's own option goes; the key goes only when nothing is left
    assert merge(cur, {"exec-opts": []})["exec-opts"] == ["native.umask=normal", "isolation=process"]
    assert merge(cur, {"exec-opts": None})["exec-opts"] == ["native.umask=normal", "isolation=process"]
    assert "exec-opts" not in merge({"exec-opts": ["native.cgroupdriver=systemd"]}, {"exec-opts": None})
    assert merge({}, {"exec-opts": ["native.cgroupdriver=cgroupfs"]}) == {"exec-opts": ["native.cgroupdriver=cgroupfs"]}
    assert merge({"exec-opts": ["native.umask=normal"]}, {"exec-opts": ["native.cgroupdriver=cgroupfs"]})["exec-opts"] == [
        "native.umask=normal", "native.cgroupdriver=cgroupfs"]


def test_operator_nvidia_runtime_kept_and_missing_one_added():
    own = {"runtimes": {"nvidia": {"path": "/opt/nvidia/bin/nvidia-container-runtime"}}}
    assert merge(own, NVIDIA) == own
    assert merge({"runtimes": {"crun": {"path": "crun"}}}, NVIDIA)["runtimes"]["nvidia"] == NVIDIA["runtimes"]["nvidia"]
    assert merge(own, {}, defaults=NVIDIA) == own


def test_defaults_only_fill_absent_keys_owned_keys_are_set():
    logs = {"log-driver": "json-file", "log-opts": {"max-size": "100m", "max-file": "3"}}
    cur = {"log-driver": "journald"}
    out = merge(cur, {}, defaults=logs)
    assert out == {"log-driver": "journald", "log-opts": {"max-size": "100m", "max-file": "3"}}
    assert merge({}, {}, defaults=logs) == logs
    assert merge(cur, {"log-driver": "json-file"}, defaults=logs)["log-driver"] == "json-file"  # a setting asked
    assert needs_restart(cur, merge(cur, {}, defaults={"log-driver": "json-file"})) == []


def test_features_entries_are_owned():
    assert merge({"features": {"cdi": False, "x": True}}, {"features": {"cdi": True}}) == {"features": {"cdi": True, "x": True}}
    assert merge({"features": {"cdi": True}}, {"features": {"cdi": None}}) == {}


def test_exec_opts_entries_need_a_name():
    with pytest.raises(DaemonJsonError) as e:
        validate_settings({"exec-opts": ["cgroupfs"]})
    assert "must be name=value" in str(e.value)
