"""One input, one decision (issue 24): `nemofleet plan`, the deploy's desired state and `nemofleet
status`'s expected release come from one object (desired.decide over inputs.make), for every golden
shape: single GPU, 8 GPUs, a two-host serving group, `@local`, a registry rewrite, revision "main"
with a mocked Hub answer. The plan and status paths are driven through their real code (cli.main,
fleet.status.status), only pyinfra's reads of the hosts are replaced by the facts below."""
import json
import os

import pytest

from nemofleet import cli, desired, inputs, spec
from nemofleet.facts.weights import HUB_COMMIT_MARK
from nemofleet import hostcmd as commands
from nemofleet.fleet import driver
from nemofleet.fleet import status as status_mod
from test_desired import REV, facts
from test_multinode import SVL, member

KEY = "sk-nf-" + "a" * 32
LIGHTNING = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}
SHA = "fedcba9876543210fedcba9876543210fedcba98"
H100 = dict(name="NVIDIA H100 80GB HBM3", mib=81559, docker="24.0.7")

# shape: (inventory groups {group: [(host, data)]}, {host: HostFacts}, {host: commit answers})
SHAPES = {
    "single-gpu": ({"gpu_h200": [("h200-1", {"model": LIGHTNING})]}, {"h200-1": facts()}, {}),
    "8-gpu": ({"gpu_h100": [("h100-1", {"model": LIGHTNING, "tensor_parallel_size": 2})]},
              {"h100-1": facts(gpus=8, **H100)}, {}),
    "two-host-group": ({"gpu_a100": [("a100-1", {"model": SVL}), ("a100-2", {"model": SVL})]},
                       {"a100-1": member("10.0.0.1"), "a100-2": member("10.0.0.2")}, {}),
    "@local": ({"gpu_h200": [("@local", {"model": LIGHTNING})]}, {"@local": facts()}, {}),
    "registry-rewrite": ({"gpu_h200": [("h200-1", {"model": LIGHTNING,
                                                   "image_registry_rewrite": {"vllm/": "registry.internal/dockerhub/vllm/"}})]},
                         {"h200-1": facts()}, {}),
    "revision-main": ({"gpu_h200": [("h200-1", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "main"}})]},
                      {"h200-1": facts()}, {"h200-1": {"sha": SHA}}),
}


def _inventory(tmp_path, shape: str) -> str:
    groups, _, _ = SHAPES[shape]
    lines = [f"{g} = {[(h, dict(d, vllm_api_key=KEY)) for h, d in hosts]!r}" for g, hosts in groups.items()]
    if shape == "two-host-group":
        lines += ["serving_groups = {'svl': ['a100-1', 'a100-2']}", "from nemofleet.inventory import checked",
                  "checked(globals())"]
    path = tmp_path / f"inv_{shape.replace('-', '_').replace('@', 'at_')}_{tmp_path.name.replace('-', '_')}.py"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def fleet(monkeypatch):
    """The shape's hosts as pyinfra would read them: facts, and the answers of the one remote command."""
    current = {}

    def gather_facts(inventory, limit=None):
        return json.loads(json.dumps(current["facts"]))

    def exec_all(inventory, hosts, script, timeout=120, env=None):
        out = {}
        for h in hosts:
            lines = ["release id=" + (current.get("release") or {}).get(h, "none")]
            if HUB_COMMIT_MARK in script and h in current["commits"]:
                lines += [f"{HUB_COMMIT_MARK}0", json.dumps(current["commits"][h])]
            out[h] = driver.Exec(h, 0, "\n".join(lines))
        return out

    monkeypatch.setattr(driver, "gather_facts", gather_facts)
    monkeypatch.setattr(driver, "exec_all", exec_all)
    return current


def _deploy_decision(inventory: str, host: str, f: dict, commits: dict) -> desired.Desired:
    """What the deploy decides for `host`: deploy.host_inputs() builds the same HostInputs from
    pyinfra with the one gatherer (specs, HostFacts with the HubCommit answers, the group's peers)."""
    specs = driver.host_specs(inventory)
    return desired.decide(inputs.gather(specs, f, hosts=[host], commits={host: dict(commits)},
                                        operator=driver.operator())[host])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_plan_deploy_and_status_come_from_one_decision(shape, tmp_path, capsys, fleet):
    inventory = _inventory(tmp_path, shape)
    _, f, answers = SHAPES[shape]
    fleet.update(facts=f, commits=answers)
    # nemofleet plan (live: facts read from the hosts, unpinned revisions asked from them)
    assert cli.main(["plan", inventory, "--json"]) == 0, capsys.readouterr()
    shown = json.loads(capsys.readouterr().out)
    for host in f:
        unpinned = spec.to_resolve(driver.host_specs(inventory)[host])
        want = _deploy_decision(inventory, host, f, {u: answers[host] for u in unpinned} if unpinned else {})
        assert want.ok, want.refusals
        assert shown[host]["refused"] == [] and shown[host]["plan"] == json.loads(json.dumps(want.plan.to_dict()))
        assert shown[host]["warnings"] == want.warnings
        # the deploy applies that plan: the units, the release id and the image come from the same object
        assert want.release_id == desired.render.release_id(want.plan)
        # nemofleet status: a host that holds this release reads in sync
        fleet["release"] = {h: _deploy_decision(inventory, h, f, {u: answers[h] for u in spec.to_resolve(
            driver.host_specs(inventory)[h])} if h in answers else {}).release_id for h in f}
        rows = {r.host: r for r in status_mod.status(inventory)}
        assert rows[host].planned == want.release_id and rows[host].in_sync, (rows[host].planned, want.release_id)
    if shape == "revision-main":
        assert SHA in json.dumps(shown) and '"revision": "main"' not in json.dumps(shown["h200-1"]["plan"])
    if shape == "registry-rewrite":
        assert shown["h200-1"]["plan"]["image"] == "registry.internal/dockerhub/vllm/vllm-openai:v0.27.1"


def test_status_reads_drift_when_the_host_holds_another_release(tmp_path, fleet):
    inventory = _inventory(tmp_path, "single-gpu")
    fleet.update(facts=SHAPES["single-gpu"][1], commits={}, release={"h200-1": "0123456789ab"})
    row = status_mod.status(inventory)[0]
    assert row.planned and not row.in_sync


def test_local_connector_groups_are_folded_and_a_real_double_listing_still_refused():
    # pyinfra lists @local's groups twice (its connector groups are extended with themselves)
    assert inputs.unique_groups("@local", ["gpu_h200", "inv", "@local", "gpu_h200", "inv", "@local"]) == (
        "gpu_h200", "inv", "@local")
    assert inputs.unique_groups("h1", ["gpu_h200", "gpu_h200", "inv"]) == ("gpu_h200", "gpu_h200", "inv")
    i = inputs.make("h1", {}, facts(), groups=["gpu_h200", "gpu_h200", "inv"])
    assert i.refusals == ("this host is listed 2 times in group gpu_h200: pyinfra keeps the last definition's data; "
                          "list it once",)


def test_local_host_plans_from_a_facts_file(tmp_path, capsys):
    (tmp_path / "facts.json").write_text(json.dumps({"@local": facts(name="NVIDIA A100-SXM4-80GB", mib=81920, cc="8.0",
                                                                     driver="570.195.03")}))
    inv = tmp_path / f"inv_local_{tmp_path.name.replace('-', '_')}.py"
    inv.write_text(f'gpu_a100 = [("@local", {{"vllm_api_key": "{KEY}", "model": {LIGHTNING!r}}})]\n')
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = cli.main(["plan", str(inv), "--facts", "facts.json"])
    finally:
        os.chdir(here)
    out = capsys.readouterr().out
    assert rc == 0 and "REFUSED" not in out and "nemotron-0" in out, out


def test_a_serving_group_is_planned_and_shown_for_both_members_from_a_facts_file(tmp_path, capsys):
    f = {"a100-1": member("10.0.0.1"), "a100-2": member("10.0.0.2")}
    (tmp_path / "facts.json").write_text(json.dumps(f))
    inventory = _inventory(tmp_path, "two-host-group")
    assert cli.main(["plan", inventory, "--facts", str(tmp_path / "facts.json"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    head, worker = shown["a100-1"]["plan"], shown["a100-2"]["plan"]
    assert head["instances"][0]["group"]["rank"] == 0 and worker["instances"][0]["group"]["rank"] == 1


@pytest.mark.parametrize("extra, words", [
    ({"tensor_parallel_size": 2}, "runs one instance of TP4 x PP2 (serving_group_parallel pp), so "
                                  "tensor_parallel_size 2 cannot apply: remove it"),
    ({"instances": 3}, "runs one instance of TP4 x PP2 across its hosts (serving_group_parallel pp), so instances 3 "
                       "cannot apply: remove it"),
])
def test_a_group_refuses_settings_it_cannot_apply_in_one_sentence(extra, words):
    from test_multinode import group, peers

    ps = peers()
    d = desired.build("a100-1", group(**extra), ps["a100-1"], {"vllm_api_key": KEY}, peers=ps,
                      peer_data={"a100-2": group(**extra)})
    assert len(d.refusals) == 1 and words in d.refusals[0], d.refusals
    # the values the group itself plans are accepted
    ok = desired.build("a100-1", group(tensor_parallel_size=4, instances=1), ps["a100-1"], {"vllm_api_key": KEY},
                       peers=ps, peer_data={"a100-2": group(tensor_parallel_size=4, instances=1)})
    assert ok.ok, ok.refusals


def test_facts_are_read_for_the_image_the_host_pulls():
    data = {"image_registry_rewrite": {"vllm/": "registry.internal/dockerhub/vllm/"}}
    assert spec.facts_args(spec.read("h", data))["image"] == "registry.internal/dockerhub/vllm/vllm-openai:v0.27.1"
    assert spec.facts_args(spec.read("h", {"vllm_image": 5}))["image"] == inputs.settings_mod.DEFAULT_IMAGE  # refused elsewhere


def test_status_weights_line_counts_tensor_bytes_like_the_index(tmp_path):
    import struct
    import subprocess

    d = tmp_path / "models" / "org--m@x"
    d.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F16", "shape": [8], "data_offsets": [0, 16]}}).encode()
    (d / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16}, "weight_map": {}}))
    (d / ".nemofleet-complete").write_text("")
    out = subprocess.run(["bash", "-c", commands.status(str(tmp_path / "models"), str(tmp_path / "prom"))],
                         capture_output=True, text=True, timeout=60).stdout
    assert "weights org--m@x 16 of 16 (100%) tensor bytes" in out, out


def test_fact_reads_are_derived_from_the_stages():
    """deploy.fact_reads walks the stages converge() runs with a recorder in place of the operations:
    every operation's declared read is there (the front door's per-unit files, HAProxy, the stale
    HF token's absence check), and nothing no operation asks for."""
    from nemofleet import deploy, paths
    from nemofleet.facts import prefetch
    from nemofleet.facts.files import FilesDigest
    from test_desired import CASES, SECRETS

    f, data = CASES["h100-8x-front-door-frontends"]
    want = desired.build("h", data, f, SECRETS)
    keys = {prefetch.key(c, k) for c, k in deploy.fact_reads(want)}
    for path, _, _ in want.drain_restarts:
        assert prefetch.key(FilesDigest, {"paths": (path,)}) in keys
    assert prefetch.key(FilesDigest, {"paths": (paths.HF_ENV,)}) in keys  # files.absent's read
    assert prefetch.key(FilesDigest, {"paths": tuple(sorted(want.units))}) not in keys  # no operation asks it
    assert any("AptPackages" in k for k in keys) and any("UnitStates" in k and "haproxy" in k for k in keys)
    gw = desired.build("gw", {"gateway_backends": [{"host": "10.0.0.5", "port": 8800}]}, {},
                       {"vllm_api_key": KEY}, groups=["gateway"])
    assert len(deploy.gateway_reads(gw)) == 4  # packages, keys file, HAProxy config, unit state


def test_a_group_member_may_name_its_own_peer_address():
    """weights_peer_address is where other hosts reach this host's sshd: its own, like the interface."""
    from test_multinode import group, peers

    ps = peers()
    d = desired.build("a100-1", group(weights_peer_address="a100-1.lan"), ps["a100-1"], {"vllm_api_key": KEY},
                      peers=ps, peer_data={"a100-2": group(weights_peer_address="a100-2.lan")})
    assert d.ok, d.refusals


def test_the_fleet_layer_reads_a_serving_group_and_ssh_target_through_inputs():
    """group_of and ssh_target: the only readers of those host-data keys before the decision; a
    value of the wrong type is no group (the settings refuse it, that host alone), never a string
    split into characters (rebuild once locked hosts 'a', '1', '0' for members "a100-1")."""
    from nemofleet import inputs

    assert inputs.group_of({"serving_group": "svl", "serving_group_members": ["a", "b"]}) == ("svl", ("a", "b"))
    for bad in ({"serving_group": "svl", "serving_group_members": "a100-1"},
                {"serving_group": "svl", "serving_group_members": ["a"]},
                {"serving_group": "svl", "serving_group_members": ["a", 1]},
                {"serving_group": "svl", "serving_group_members": ["a", "b\nc"]},
                {"serving_group": None, "serving_group_members": ["a", "b"]}, None, "x"):
        assert inputs.group_of(bad) == (None, ()), bad
    assert inputs.ssh_target({}, "h1")[:2] == ("h1", 22)
    assert inputs.ssh_target({"ssh_hostname": "10.0.0.9", "ssh_port": 2222}, "h1")[:2] == ("10.0.0.9", 2222)
    for port in ("22; id", 0, 70000, True, float("nan"), 10**5000):
        assert inputs.ssh_target({"ssh_port": port}, "h1")[1] == 22
    assert inputs.ssh_target({"ssh_hostname": "a\nb"}, "h1")[0] == "h1"


def test_the_gatherer_tells_a_member_outside_the_run_from_one_without_facts():
    """The deploy of one member (--limit a100-2) hands the gatherer no entry for the other: the group
    is refused as "not part of this run"; `nemofleet plan` names a member it has no facts for as such."""
    from test_multinode import group

    specs = {h: spec.read(h, dict(group(), vllm_api_key=KEY), ("gpu_a100",)) for h in ("a100-1", "a100-2")}
    alone = desired.decide(inputs.gather(specs, {"a100-2": member("10.0.0.2")}, hosts=["a100-2"])["a100-2"])
    assert any("a100-1 is not part of this run (deploy every member of svl together" in r for r in alone.refusals), \
        alone.refusals
    from nemofleet.factmodel import PeerMissing

    missing = PeerMissing(why="has no facts (unreachable, or not in the facts file)")
    planned = desired.decide(inputs.gather(specs, {"a100-2": member("10.0.0.2"), "a100-1": missing},
                                           hosts=["a100-2"])["a100-2"])
    assert any("a100-1 has no facts" in r for r in planned.refusals), planned.refusals
