"""Facts with wrong types -- in a facts file (`nemofleet plan --facts`) or printed by a fact on the
host -- refuse that host in one sentence, never with a traceback (factmodel.py)."""
import copy
import json

import pytest

from nemofleet import desired
from nemofleet import factmodel as schema
from nemofleet.facts.host import HostFacts, facts_file_problem, read_part
from nemofleet.facts.weights import ModelsOnDisk
from test_desired import REV, SECRETS, facts
from test_preflight import _plan_cli, ready

DATA = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}
DIR = "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@0123456789ab"
WRONG = ["x", 5, 1.5, float("nan"), True, [], {}, None, [None], {"a": None}]


def _set(f: dict, path: tuple, value) -> dict:
    f = copy.deepcopy(f)
    node = f
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return f


# every part, and the nested places the plan reads
PATHS = [(k,) for k in HostFacts.PARTS] + [
    ("gpus", "gpus"), ("gpus", "driver"), ("gpus", "gpus", 0), ("gpus", "gpus", 0, "uuid"),
    ("gpus", "gpus", 0, "index"), ("gpus", "gpus", 0, "memory_mib"), ("gpus", "gpus", 0, "name"),
    ("gpus", "gpus", 0, "cc"), ("toolkit", "version"), ("toolkit", "cdi_specs"), ("docker", "server"),
    ("docker", "runtimes"), ("daemon_json", "data"), ("addresses", "eth0"),
    ("models", DIR), ("models", DIR, "config"), ("models", DIR, "total_size"),
    ("models", DIR, "config", "num_key_value_heads"), ("models", DIR, "config", "max_position_embeddings"),
    ("models", DIR, "config", "architectures"), ("models", DIR, "config", "hybrid_override_pattern"),
]


def base() -> dict:
    f = facts()
    f.update(release=None, gpu_access=None, lock=None, addresses={"eth0": ["10.0.0.5"]}, rdma=[],
             models={DIR: {"complete": True, "revision": REV, "total_size": 21_600_000_000,
                           "config": {"architectures": ["NemotronHForCausalLM"], "num_key_value_heads": 2,
                                      "max_position_embeddings": 1048576, "head_dim": 128,
                                      "hybrid_override_pattern": "M*M*"}}})
    return f


def test_the_base_facts_are_of_their_types_and_plan():
    assert facts_file_problem("h", base()) is None
    assert desired.build("h", DATA, base(), SECRETS).ok


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("value", WRONG, ids=repr)
def test_a_wrong_type_anywhere_is_one_sentence_or_harmless(path, value):
    f = _set(base(), path, value)
    why = facts_file_problem("h", f)
    if why:
        assert why.startswith("the facts file's entry for h is not what HostFacts writes: ") and "\n" not in why
        return
    # of its type after all (null where null is allowed...): the decision runs, without a traceback
    desired.build("h", DATA, f, SECRETS)


@pytest.mark.parametrize("f, words", [
    (_set(base(), ("gpus", "gpus"), "GPU-0"), "gpus.gpus is 'GPU-0', not a list"),
    (_set(base(), ("docker",), None), "docker is None, not a mapping"),
    (_set(base(), ("gpus", "gpus", 0), {"index": 0, "name": "H200", "memory_mib": 1}), "gpus.gpus[0] has no uuid"),
    (_set(base(), ("models", DIR, "config", "num_key_value_heads"), "8"), "num_key_value_heads is '8', not an integer"),
    (_set(base(), ("gpus", "gpus", 0, "memory_mib"), float("inf")), "memory_mib is inf"),
])
def test_the_sentence_names_the_place(f, words):
    assert words in facts_file_problem("h", f)


def test_a_checkpoint_config_with_a_string_where_a_number_is_refuses_the_host():
    """Live: ModelsOnDisk's output is read through the part's type, like a facts file."""
    out = {DIR: {"complete": True, "revision": REV, "config": {"num_key_value_heads": "eight"}}}
    value, why = read_part("models", ModelsOnDisk(), [json.dumps(out)])
    assert value == {} and "num_key_value_heads is 'eight'" in why
    f = dict(base(), errors={"models": why})
    d = desired.build("h", DATA, f, SECRETS)
    assert not d.ok and any("could not read models on this host" in r for r in d.refusals)


def test_every_part_has_a_declared_type():
    assert set(schema.PARTS) == set(HostFacts.PARTS)


@pytest.mark.parametrize("entry", [
    {"gpus": "x"}, {"docker": None}, {"models": {"d": {"config": {"head_dim": "128"}}}}, {"gpus": {"gpus": [{}]}},
    {"addresses": {"eth0": "10.0.0.1"}}, {"errors": "x"},
])
def test_plan_with_a_malformed_facts_file_refuses_that_host_only(tmp_path, capsys, entry):
    inv = ('model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "' + REV + '"}\n'
           'gpu_h200 = [("ok-1", {"vllm_api_key": "sk-nf-' + "a" * 32 + '"}), ("bad-1", {"vllm_api_key": "sk-nf-'
           + "a" * 32 + '"})]\n')
    rc, out = _plan_cli(tmp_path, capsys, inv, {"ok-1": ready(), "bad-1": {**ready(), **entry}})
    assert rc == 1 and "Traceback" not in out, out
    assert "REFUSED" not in out.split("== bad-1")[0], out
    assert "REFUSED: the facts file's entry for bad-1 is not what HostFacts writes" in out


GARBAGE = [["x"], ["{"], ["null"], ["[]"], ["\x00\x1b[0m"], ['{"a": "b"}'], ["1 2 3", "a=b=c"], ["RC=abc"],
           ["TIMEOUT"], ['{"d": {"config": {"head_dim": "x"}}}'], ["unit", "file"], ["-" * 5000]]


@pytest.mark.parametrize("key", sorted(HostFacts.PARTS))
@pytest.mark.parametrize("lines", GARBAGE, ids=lambda ls: repr(ls)[:20])
def test_every_fact_parser_turns_garbage_into_its_type_or_one_sentence(key, lines):
    cls, _ = HostFacts.PARTS[key]
    value, why = read_part(key, cls(), lines)
    assert schema.part_problem(key, value) is None, (value, why)
    assert why is None or ("\n" not in why and "Traceback" not in why)


def test_host_facts_with_garbage_in_every_part_refuses_without_a_traceback():
    out = []
    for key in HostFacts.PARTS:
        out += [f"{HostFacts.MARK}{key}", "garbage {", "null"]
    f = HostFacts().process(out)
    assert all(schema.part_problem(k, f[k]) is None for k in HostFacts.PARTS)
    d = desired.build("h", DATA, f, SECRETS)
    assert not d.ok and d.refusals
