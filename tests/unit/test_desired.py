"""desired.build(): the whole desired state of a host from (settings, facts, secrets), golden-tested
with exact strings (Kamal-style), pure (no file, process or network access), and refusing bad
input with one sentence and nothing to apply.

Regenerate the golden files deliberately with NEMOFLEET_UPDATE_GOLDEN=1 and review the diff.
"""
import builtins
import copy
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from nemofleet import desired, inputs, paths, render

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_desired"
H200 = json.loads((HERE.parent / "fixtures" / "gpu" / "h200" / "hostfacts.json").read_text())
SECRETS = {"vllm_api_key": "sk-test-0123456789", "hf_token": None, "weights_seed_key": None,
           "weights_seed_public_key": None}
REV = "0123456789abcdef0123456789abcdef01234567"


def facts(gpus=1, name="NVIDIA H200", mib=143771, cc="9.0", docker="29.1.3", driver="580.159.04", cgroup=2,
          cgroup_driver="systemd"):
    f = copy.deepcopy(H200)
    f["toolkit"].update(version="1.18.0", hook=True, runtime=True)
    f["docker"].update(installed=True, running=True, server=docker, cgroup_driver=cgroup_driver, cgroup_version=cgroup)
    f["cgroup"] = cgroup
    first = f["gpus"]["gpus"][0]
    f["gpus"]["gpus"] = [dict(first, index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", name=name,
                              memory_mib=mib, cc=cc, driver=driver) for i in range(gpus)]
    f["gpus"]["driver"] = driver
    return f


CASES = {
    # host shape, host data
    "h200-1x-cdi": (facts(), {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}),
    "a100-1x-docker20-frontends": (
        facts(name="NVIDIA A100-SXM4-80GB", mib=81920, cc="8.0", docker="20.10.24", driver="570.195.03", cgroup=1,
              cgroup_driver="cgroupfs"),
        {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV},
         "frontends": [{"name": "open-webui", "network": "open-webui_default", "alias": "nemotron", "create": True},
                       {"name": "dify", "network": "dify_default", "alias": "nemotron"}],
         "health_webhook_url": "https://hooks.example.internal/T0/abc", "http_proxy": "http://proxy.internal:3128"}),
    "h100-8x-trap": (facts(gpus=8, name="NVIDIA H100 80GB HBM3", mib=81559, docker="24.0.7"),
                     {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}),
    # the front door (on by default with 8 instances) on the Docker bridge, frontends reach it
    "h100-8x-front-door-frontends": (
        dict(facts(gpus=8, name="NVIDIA H100 80GB HBM3", mib=81559, docker="24.0.7"),
             addresses={"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.5"], "docker0": ["172.17.0.1"]}),
        {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}, "tensor_parallel_size": 2,
         "frontends": [{"name": "open-webui", "network": "open-webui_default", "create": True}]}),
}


def dump(d: desired.Desired) -> str:
    """Everything a run would make true, as one reviewable text."""
    out = [f"# host {d.host}", f"refusals: {d.refusals}", f"warnings: {d.warnings}",
           f"daemon.json: {json.dumps(d.daemon_json, sort_keys=True)}",
           f"daemon.json if absent: {json.dumps(d.daemon_json_defaults, sort_keys=True)}", f"release: {d.release_id}",
           f"image: {d.image} archive: {d.image_archive}", f"cdi: {d.cdi_command}", f"networks: {d.networks}",
           f"attached: {json.dumps(d.attached, sort_keys=True)}", f"absent: {d.absent}",
           f"probe: {d.gpu_probe.gpu_args if d.gpu_probe else None} {d.gpu_probe.signature if d.gpu_probe else ''}"]
    out += [f"download: {x.repo}@{x.revision} -> {x.directory} via {x.endpoint}" for x in d.downloads]
    out += [f"front door: {d.front_door}", f"drain restarts: {d.drain_restarts}"]
    if d.front_door_config:
        out.append(f"--- front_door_config\n{d.front_door_config}")
    for group in ("host_files", "secret_files", "units", "health_files", "release_files", "front_door_files",
                  "front_door_secrets"):
        for path, (content, mode) in sorted(getattr(d, group).items()):
            shown = "(secret)" if group in ("secret_files", "front_door_secrets") else content
            if content == render.health_program():  # the same program on every host (test_gpu_watch runs it)
                shown = "<remote/health.py>\n"
            out.append(f"--- {group} {path} {mode}\n{shown}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_desired_state(case):
    f, data = CASES[case]
    text = dump(desired.build(case, data, f, SECRETS, operator="ops@ctl"))
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("NEMOFLEET_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_build_is_pure(monkeypatch):
    """No file, process or socket is touched while deciding."""
    def boom(*a, **k):
        raise AssertionError("desired.build did I/O")
    f, data = CASES["a100-1x-docker20-frontends"]
    desired.build("warm", data, f, SECRETS)  # import-time work (templates, connector list) first
    monkeypatch.setattr(builtins, "open", boom)
    monkeypatch.setattr(subprocess, "run", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)
    monkeypatch.setattr(socket, "socket", boom)
    d = desired.build("pure", data, f, SECRETS)
    assert d.ok and d.units


def test_same_inputs_same_state():
    f, data = CASES["h100-8x-trap"]
    assert dump(desired.build("x", data, f, SECRETS)) == dump(desired.build("x", data, f, SECRETS))


@pytest.mark.parametrize("data, words", [
    ({"gpu_memory_utilisation": 0.8}, "did you mean gpu_memory_utilization"),
    ({"health_schedule": "* * * *"}, "health_schedule"),
    ({"frontends": [{"network": "n", "alias": "a,b"}]}, "would inject docker options"),
    ({"model": "nemotron-9"}, "unknown model"),
])
def test_bad_input_refused_with_nothing_to_apply(data, words):
    d = desired.build("bad", data, facts(), SECRETS)
    assert any(words in r for r in d.refusals), d.refusals
    assert not d.ok and not d.units and not d.secret_files and not d.health_files


def test_missing_api_key_and_fact_errors_refuse():
    d = desired.build("h", {}, facts(), dict(SECRETS, vllm_api_key=None))
    assert any("no API key" in r for r in d.refusals)
    f = facts()
    f["errors"] = {"gpus": "nvidia-smi did not answer within 20 s (hung driver?)"}
    assert "could not read gpus on this host: nvidia-smi did not answer" in desired.build("h", {}, f, SECRETS).refusals[0]


def test_secrets_only_in_0600_files_never_in_units_or_scripts():
    f, data = CASES["a100-1x-docker20-frontends"]
    d = desired.build("h", data, f, SECRETS)
    public = "".join(c for group in (d.units, d.health_files, d.host_files, d.release_files)
                     for c, _ in group.values()) + (d.audit_command or "")
    for secret in (SECRETS["vllm_api_key"], "hooks.example.internal"):
        assert secret not in public
    assert all(mode == "0600" for _, mode in d.secret_files.values())
    assert d.host_files[paths.DOCKER_PROXY][1] == "0600"
    assert "hooks.example.internal" in d.secret_files[paths.HEALTH_CONF][0]


SEED_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFy02I2mbKJF+J/uLS5Tm25gylWlotT5MStmUt3NAvDu fleet"
SEED_LINE = SEED_PUB.rsplit(" ", 1)[0]


def test_seed_key_is_restricted_to_a_read_only_rsync():
    d = desired.build("h", {}, facts(), dict(SECRETS, weights_seed_key="-----BEGIN OPENSSH X-----\nabc\n-----END",
                                              weights_seed_public_key=SEED_PUB))
    # nemofleet's own line: restrict, from= the private ranges (weights_seed_networks), the forced
    # read-only rsync, the key's type and blob (never the file's comment or options)
    assert d.authorized_key == ('restrict,from="10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fd00::/8",'
                                'command="/usr/bin/rrsync -ro /srv/nemofleet/models" ' + SEED_LINE + ' nemofleet-fleet-seed')
    assert d.seed_public_key == SEED_LINE  # the applier finds our line by this key
    d = desired.build("h", {"weights_seed_networks": ["10.1.0.0/16"]}, facts(),
                      dict(SECRETS, weights_seed_key="-----BEGIN OPENSSH X-----\nabc\n-----END",
                           weights_seed_public_key=SEED_PUB))
    assert d.authorized_key.startswith('restrict,from="10.1.0.0/16",command=')


@pytest.mark.parametrize("text", [
    SEED_PUB + "\n" + SEED_PUB.replace("fleet", "second"),  # a second line: it would be an unrestricted root key
    'command="/bin/sh" ' + SEED_PUB,  # options of its own
    "ssh-ed25519 AAAAC3 fleet",  # not a key
    "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIFy02I2mbKJF+J/uLS5Tm25gylWlotT5MStmUt3NAvDu x",  # type and blob disagree
    "", "\n\n# only a comment\n",
])
def test_a_seed_public_key_file_must_hold_exactly_one_key(tmp_path, text):
    pub = tmp_path / "seed.pub"
    pub.write_text(text)
    key = tmp_path / "seed"
    key.write_text("-----BEGIN OPENSSH TEST KEY-----\nabc\n-----END OPENSSH TEST KEY-----\n")
    data = {"weights_seed_key_file": str(key), "weights_seed_public_key_file": str(pub)}
    s = inputs.read_secrets(data)
    assert s["weights_seed_public_key"] is None
    assert len(s.problems) == 1 and s.problems[0].startswith(f"weights_seed_public_key_file {pub} ")
    d = desired.build("h", data, facts(), dict(SECRETS, **{k: v for k, v in s.items() if k != "vllm_api_key"}))
    assert d.authorized_key is None


@pytest.mark.parametrize("root", ["/", "/etc", "/root", "/etc/nemofleet", "/usr", "/var/lib/docker/x", "/srv/../etc",
                                  "/srv/m/", "/srv//m", "/proc/1"])
def test_models_root_is_a_directory_of_its_own(root):
    d = desired.build("h", {"models_root": root}, facts(), SECRETS)
    assert not d.ok and d.refusals[0].startswith(f"models_root {root!r}"), d.refusals


def test_an_unreadable_or_missing_secret_file_is_named(tmp_path):
    missing = tmp_path / "nope"
    s = inputs.read_secrets({"vllm_api_key_file": str(missing)})
    assert s.vllm_api_key is None and s.problems == (f"vllm_api_key_file {missing} does not exist; point it at "
                                                         "the file that holds vllm_api_key",)
    s = inputs.read_secrets({"hf_token_file": str(tmp_path)})
    assert "is not a regular file" in s.problems[0]
    bad = tmp_path / "latin1"
    bad.write_bytes(b"\xff\xfe token")
    assert "is not UTF-8" in inputs.read_secrets({"hf_token_file": str(bad)}).problems[0]
    if os.geteuid() != 0:  # root reads a 0000 file
        locked = tmp_path / "locked"
        locked.write_text("sk-0123456789")
        locked.chmod(0)
        assert "is unreadable" in inputs.read_secrets({"vllm_api_key_file": str(locked)}).problems[0]
    # the default path that does not exist is no secret, not a problem
    assert inputs.read_secrets({}).problems == () or all("~/.config" not in p for p in inputs.read_secrets({}).problems)


def test_secrets_are_a_type_that_never_shows_its_value(tmp_path):
    from nemofleet.secret import Secret

    f = tmp_path / "key"
    f.write_text("sk-very-secret-value-42\n")
    s = inputs.read_secrets({"vllm_api_key_file": str(f)})
    v = s.vllm_api_key
    assert isinstance(v, Secret) and v.reveal() == "sk-very-secret-value-42"
    for shown in (repr(v), str(v), f"{v}", f"{v!r}", repr(s), json.dumps({"k": str(v)})):
        assert "very-secret" not in shown
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(v)
    # a value of the wrong form is refused without being echoed
    f.write_text("sk with spaces and 'quotes'")
    s = inputs.read_secrets({"vllm_api_key_file": str(f)})
    assert s.vllm_api_key is None and "quotes" not in s.problems[0] and "vllm_api_key" in s.problems[0]


def test_a_branch_is_resolved_to_a_commit_once_and_planned_as_that_commit():
    data = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "main"}, "hf_endpoint": "http://m:8090"}
    key = ("http://m:8090", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4", "main")
    from nemofleet.spec import read, to_resolve

    assert to_resolve(read("h", data)) == [key]
    assert to_resolve(read("h", CASES["h200-1x-cdi"][1])) == []  # pinned: no query
    f = facts()
    d = desired.build("h", data, f, SECRETS, commits={key: {"sha": REV}})
    assert d.ok and d.plan.model.revision == REV and all(x.revision == REV for x in d.downloads)
    assert any("is 0123456789ab on http://m:8090 now" in w for w in d.warnings)
    other = desired.build("h", data, f, SECRETS, commits={key: {"sha": "f" * 40}})
    assert other.release_id != d.release_id  # a new commit is a new release
    bad = desired.build("h", data, f, SECRETS, commits={key: {"error": "http://m:8090 is unreachable from the host (refused)"}})
    # a `commits` key inside the facts (a facts file's, a host's) is not an answer of the Hub
    inband = desired.build("h", data, dict(f, commits={key: {"sha": REV}}), SECRETS)
    assert not any(x.revision == REV for x in inband.downloads) and not any(REV[:12] in w for w in inband.warnings)
    assert not bad.ok and "could not resolve revision 'main'" in bad.refusals[0] and not bad.units


def test_a_plain_deploy_refuses_a_host_locked_by_someone_else():
    info = {"holder": "alice@ctl", "since": "2026-12-03T10:00:00Z", "token": "t1", "expires": 2000, "message": "drain"}
    f = dict(facts(), lock=info)
    d = desired.build("h", {}, f, SECRETS, now=1000)
    assert not d.ok and "locked by alice@ctl since 2026-12-03T10:00:00Z (drain)" in d.refusals[0]
    assert "nemofleet lock release --force" in d.refusals[0]
    assert desired.build("h", {}, f, SECRETS, lock_token="t1", now=1000).ok  # the rollout's own run
    assert desired.build("h", {}, f, SECRETS, now=3000).ok  # expired


@pytest.mark.parametrize("groups, refused, warned", [
    (["gpu_h200"], None, None),
    (["gpu_h200", "canary", "rack3"], None, None),  # other groups are the operator's own
    (["gpu_h2000"], "group gpu_h2000 is not a GPU class (did you mean gpu_h200?)", None),
    # real GPU classes from the GPU table (issue 37 point 3), with or without a group_data file: taken as
    # classes (this host's H200s are not in them, which is said), not refused as typos
    (["gpu_h20"], None, "in group gpu_h20 but its GPUs are H200"),
    (["gpu_b300"], None, "in group gpu_b300 but its GPUs are H200"),
    (["gpu_gb10"], None, "in group gpu_gb10 but its GPUs are H200"),
    (["gpu_h200", "gpu_h200"], "listed 2 times in group gpu_h200", None),
    (["gpu_h100", "gpu_h200"], "in 2 GPU class groups (gpu_h100, gpu_h200)", None),
    (["gpu_h100"], None, "in group gpu_h100 but its GPUs are H200"),
    (["gpu_mi300x"], None, "group gpu_mi300x is not a GPU class nemofleet knows"),
])
def test_inventory_groups_misspelt_or_doubled_are_refused(groups, refused, warned):
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}, facts(),
                      SECRETS, groups=groups)
    if refused:
        assert any(refused in r for r in d.refusals), d.refusals
        assert not d.units and not d.secret_files
    else:
        assert d.ok, d.refusals
    if warned:
        assert any(warned in w for w in d.warnings), d.warnings
    else:
        assert not any("group" in w for w in d.warnings), d.warnings


def test_desired_is_frozen_and_its_refusals_carry_codes():
    import dataclasses

    from opharness import verdict

    f, data = CASES["h200-1x-cdi"]
    d = desired.build("h", data, f, SECRETS)
    assert d.ok
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.units = {}  # type: ignore[misc]
    # tests match the code, not the prose (the sentence may be reworded)
    stopped = copy.deepcopy(f)
    stopped["docker"].update(installed=False, running=False, server=None)
    v = verdict("h", stopped, dict(data))
    assert "container-runtime" in v.codes, (v.codes, v.refusals)
    none = desired.build("h", dict(data), f, {})
    assert [getattr(r, "code", None) for r in none.refusals] == ["api-key"]


def test_settings_are_a_declared_class_with_immutable_containers():
    from nemofleet import settings

    # each key is an annotated attribute of the class body (what a type checker sees), not a
    # create_model() call
    declared = settings.Settings.__annotations__
    assert [k.name for k in settings.KEYS] == list(declared) and len(declared) > 80
    s = settings.parse({"vllm_extra_args": {"max-loras": 2}, "instance_extra_args": {"a": {"x": 1}}})
    for change in (lambda: s.vllm_extra_args.__setitem__("y", 1), lambda: s.instance_extra_args["a"].update(x=2),
                   lambda: s.docker_log_opts.pop("max-size")):
        with pytest.raises(TypeError):
            change()
    with pytest.raises(Exception):
        s.port_base = 1  # type: ignore[misc]
    assert isinstance(s.frontends, tuple) and isinstance(s.weights_seed_networks, tuple)


def test_an_api_key_file_that_is_a_directory_is_named_not_no_api_key(tmp_path, monkeypatch):
    """The default vllm_api_key_file (~/.config/nemofleet/api-key) or a set one that is a directory:
    the host is refused naming the file, never with "no API key"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config" / "nemofleet" / "api-key").mkdir(parents=True)
    for data in ({}, {"vllm_api_key_file": str(tmp_path)}):
        d = desired.build("h", dict(data), facts(), None)
        said = " ".join(d.refusals)
        assert "vllm_api_key_file" in said and "is not a regular file" in said and "no API key" not in said, said
