"""The typed facts (factmodel.py): a host's facts are parsed once, at the edge (inputs.make), into
frozen models; a part not of its type refuses that host alone, in one sentence; after the edge the
decision reads attributes, never a fact by key."""
from __future__ import annotations

import ast
import copy
from pathlib import Path

import pydantic
import pytest

from nemofleet import desired, factmodel, inputs
from test_multinode import group, member, peers, refusal
from test_preflight import DATA, ready

SRC = Path(__file__).resolve().parents[2] / "src" / "nemofleet"


def make(name, f):
    """HostInputs as the deploy builds them (inputs.make, the one constructor)."""
    return inputs.make(name, DATA, f, inputs.read_secrets(DATA))


def test_a_hosts_facts_are_typed_once_and_frozen():
    i = make("h200", ready())
    assert isinstance(i.facts, factmodel.Facts) and not i.refusals
    assert i.facts.gpus.gpus[0].name == "NVIDIA H200" and i.facts.gpus.gpus[0].memory_mib == 143771
    assert i.facts.docker.server == "29.1.3" and i.facts.cgroup == 2
    with pytest.raises(pydantic.ValidationError):
        i.facts.cgroup = 1  # read, never changed
    with pytest.raises(pydantic.ValidationError):
        i.facts.gpus.gpus[0].uuid = "GPU-x"
    # a part the host did not print has its default (a facts file written before the part existed)
    f = ready()
    assert "health" not in f and "rdma" not in f  # the capture predates both parts
    assert make("h200", f).facts.health == factmodel.Health() and make("h200", f).facts.rdma == ()


HOSTILE_PARTS = [
    ("docker", lambda f: f["docker"].update(server=["29.1.3"]), "docker.server"),
    ("cgroup", lambda f: f.update(cgroup=7), "cgroup is 7"),
    ("disk_free", lambda f: f.update(disk_free=10**5000), "disk_free"),
    ("addresses", lambda f: f.update(addresses={"eth0": ["10.0.0.1; reboot"]}), "addresses"),
    ("interface", lambda f: f.update(addresses={"eth0\nx": ["10.0.0.1"]}), "addresses"),
    ("gpu uuid", lambda f: f["gpus"]["gpus"][0].update(uuid="$(reboot)"), "gpus.gpus[0].uuid"),
    ("gpu bus id", lambda f: f["gpus"]["gpus"][0].update(bus_id="0:0:6,x"), "gpus.gpus[0].bus_id"),
    ("gpu memory", lambda f: f["gpus"]["gpus"][0].update(memory_mib=True), "gpus.gpus[0].memory_mib"),
    ("version line", lambda f: f["toolkit"].update(version="1.18\nExecStartPre=/bin/sh"), "toolkit.version"),
    ("weights", lambda f: f.update(models={"x": {"total_size": -1}}), "models['x'].total_size"),
    ("weights config", lambda f: f.update(models={"x": {"config": {"head_dim": "128"}}}), "head_dim"),
    ("image env", lambda f: f.update(image={"id": "sha256:a", "env": {"A": "b\nc"}}), "image.env"),
    ("drained marker", lambda f: f.update(health={"drained": {"GPU-nope": {"since": 1, "index": 0}}}), "health.drained"),
    ("health value", lambda f: f.update(health={"gpus": [{"uuid": f["gpus"]["gpus"][0]["uuid"],
                                                          "remapped_rows.pending": "maybe"}]}), "remapped_rows.pending"),
    ("xid", lambda f: f.update(health={"xids": [{"code": 79, "bus_id": "$(id)"}]}), "health.xids[0].bus_id"),
    ("errors", lambda f: f.update(errors={"gpus": 5}), "errors"),
    # issue 35's first example: one host's absurd lock expiry aborted the deploy for every host
    ("lock expiry", lambda f: f.update(lock={"holder": "a@b", "since": "s", "expires": 10**400}), "lock.expires"),
    ("lock holder", lambda f: f.update(lock={"holder": "a\nExecStart=/bin/sh", "expires": 5}), "lock.holder"),
    ("daemon.json runtimes", lambda f: f["daemon_json"].update(data={"runtimes": 5}), "daemon_json.data has 'runtimes' 5"),
    ("daemon.json exec-opts", lambda f: f["daemon_json"].update(data={"exec-opts": "x"}), "'exec-opts' 'x', not a list"),
    ("head reach", lambda f: f.update(head_reach={"target": 5, "state": "open"}), "head_reach.target"),
    ("facts", lambda f: None, None),
]


@pytest.mark.parametrize("what,edit,words", HOSTILE_PARTS, ids=[h[0] for h in HOSTILE_PARTS])
def test_a_part_not_of_its_type_refuses_that_host_alone_in_one_sentence(what, edit, words):
    f = ready()
    if words is None:
        f = ["not", "facts"]
    else:
        edit(f)
    bad = desired.decide(make("bad", f))
    why = bad.refusals[0]
    assert why.startswith("this host's facts hold a value nemofleet cannot use: "), bad.refusals
    assert "\n" not in why and len(why) < 600 and (words is None or words in why), why
    assert bad.plan is None and not bad.units and not bad.daemon_json  # nothing to apply
    # the same fleet's other host, decided in the same process, is planned as before
    good = desired.decide(make("good", ready()))
    assert not good.refusals and good.plan is not None


def test_a_bad_part_is_named_and_the_good_ones_are_still_read():
    f = ready()
    f["disk_free"] = "lots"
    typed, problems = factmodel.parse(f)
    assert problems == ["disk_free is 'lots', not an integer from 0 to 4611686018427387904"]
    assert typed.disk_free is None and typed.gpus.gpus[0].name == "NVIDIA H200"


def test_a_serving_group_member_with_unreadable_facts_refuses_the_group_naming_it():
    ps = peers()
    ps["a100-2"] = dict(member("10.0.0.2"), addresses=[1])
    why = refusal("a100-1", group(), ps)
    assert "a100-2 has facts nemofleet cannot read (addresses is [1], not a mapping)" in why, why
    assert isinstance(factmodel.parse_peer("a100-2", ps["a100-2"]), factmodel.PeerMissing)
    assert factmodel.parse_peer("a100-3", None).why.startswith("has no facts")
    missing = factmodel.PeerMissing(why="did not answer (Connection refused)")  # as deploy.group_peers says it
    assert factmodel.parse_peer("a100-3", missing) is missing


def test_the_parts_a_facts_file_must_hold_are_the_models_own():
    from nemofleet.facts.host import HostFacts

    assert set(factmodel.PARTS) == set(HostFacts.PARTS) == set(factmodel.Facts.model_fields) - {"errors", "head_reach"}
    # the facts as the real H200 printed them parse whole
    assert factmodel.parse(ready())[1] == []


# the decision layer: after the edge it reads typed facts by attribute
DECISION = ("desired", "preflight", "multinode", "gpuhealth", "layout", "plan", "models", "plan_types",
            "inputs", "memory", "gpus", "gpuaccess", "recipes", "render")


def test_after_the_edge_no_decision_module_reads_a_fact_by_key():
    """No `x["gpus"]` or `x.get("toolkit")` of a HostFacts part name in the decision modules: a
    fact read by key is a raw value the edge did not type."""
    parts = set(factmodel.PARTS) | {"errors", "head_reach"}
    found = []
    for name in DECISION:
        tree = ast.parse((SRC / f"{name}.py").read_text())
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                key = node.args[0].value
            if key in parts:
                found.append(f"{name}.py:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, found


def test_facts_given_to_the_decision_twice_are_parsed_once():
    typed = make("h", ready()).facts
    again = make("h", typed)
    assert again.facts is typed  # already typed: taken as it is
    f = copy.deepcopy(ready())
    f["gpus"]["gpus"][0]["name"] = "NVIDIA H200"
    assert make("h", f).facts == typed


@pytest.mark.parametrize("line", [
    '{"exists": true, "missing": 5}', '{"exists": true, "missing": ["../../etc/passwd"]}',
    '{"exists": true, "truncated": ["/etc/shadow"]}', '{"complete": "yes", "marker": true}',
    '{"present_bytes": 1e999}', '{"exists": true', "{" * 100000, '{"missing": ["a\\nb"]}',
    # names from a hostile safetensors index: never an option, a path out or a line break of `hf download`
    '{"missing": ["--local-dir=/"]}', '{"missing": ["-x.safetensors"]}', '{"truncated": ["a/../../x"]}',
    '{"missing": ["a//b"]}', '{"missing": [".."]}', '{"missing": ["a/-r"]}', '{"missing": ["a\\u2028b"]}',
    '{"missing": ["a\\u0085b"]}', '{"missing": ["a\\u001b[31m"]}', '{"missing": [""]}',
])
def test_a_weights_check_answer_not_of_its_type_is_no_answer(line):
    """The weights operation's own fact (WeightsStatus) is typed where it is read: an answer that
    is not the check's (a host printing garbage, a file name outside the directory) is None, and
    the operation fetches and verifies, as for a directory it knows nothing of."""
    from nemofleet.facts.weights import WeightsStatus

    assert WeightsStatus().process(["some log line", line]) is None


def test_a_weights_check_answer_is_typed():
    from nemofleet.facts.weights import WeightsStatus

    out = WeightsStatus().process(['{"dir": "/m/x", "exists": true, "complete": false, "marker": false, '
                                   '"missing": ["model-00002-of-00002.safetensors"], "truncated": [], '
                                   '"incomplete_files": 0, "present_bytes": 10, "total_size": 20}'])
    assert out["missing"] == ("model-00002-of-00002.safetensors",) and out["present_bytes"] == 10
    assert out["commit_ok"] is False and out["other_commits"] == ()


def test_a_unit_listing_line_without_a_name_is_skipped():
    from nemofleet.facts.units import UnitStates

    out = UnitStates().process(["unit", "file", "unit a.service enabled active", "file /etc/x"])
    assert out == {"units": {"a.service": {"enabled": True, "active": True}}, "files": ["/etc/x"]}
