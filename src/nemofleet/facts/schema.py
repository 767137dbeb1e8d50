"""The type of every HostFacts part, declared once: what a fact parser returns and what a facts
file (`nemofleet plan --facts`) must hold.

`part_problem(key, value)` is None for a value of the part's type, or one sentence naming the
first place it is not (a string where a list is, null where a mapping is, a GPU without a uuid,
a checkpoint config.json with a string where a number is). HostFacts.process and the facts-file
reader call it, so a malformed part refuses that host in one sentence, never with a traceback
further up.

A spec is: a Python type (int and float exclude bool; numbers are finite), `Opt(spec)` (or
null), `List(spec)`, `Map(value_spec)` (string keys), `Int(min, max)`, `Obj({key: spec})`
(`?key` optional; other keys are allowed and ignored), or ANY.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..valuetypes import INT_MAX, bus_id_problem, fact_ip_problem, gpu_uuid_problem, interface_problem, is_number


@dataclass(frozen=True)
class Opt:
    spec: object


@dataclass(frozen=True)
class List:
    spec: object


@dataclass(frozen=True)
class Map:
    spec: object
    key: object = None  # a Check for the keys (None: any string)


@dataclass(frozen=True)
class Int:
    minimum: int = 0
    maximum: int = INT_MAX


@dataclass(frozen=True)
class Obj:
    fields: dict


@dataclass(frozen=True)
class Check:
    """A string of a constrained type: `problem(value)` is None or the sentence's tail
    (valuetypes' *_problem functions: a GPU UUID, a PCI bus id, an address)."""
    problem: object


ANY = object()

_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", dict: "a mapping",
          list: "a list"}


def _problem(value, spec, where: str) -> str | None:
    if spec is ANY:
        return None
    if isinstance(spec, Opt):
        return None if value is None else _problem(value, spec.spec, where)
    if isinstance(spec, Check):
        why = spec.problem(value)
        return f"{where} {why}" if why else None
    if isinstance(spec, Int):
        if isinstance(value, bool) or not isinstance(value, int) or not spec.minimum <= value <= spec.maximum:
            return f"{where} is {value!r}, not an integer from {spec.minimum} to {spec.maximum}"
        return None
    if isinstance(spec, List):
        if not isinstance(value, list):
            return f"{where} is {_short(value)}, not a list"
        for n, item in enumerate(value):
            why = _problem(item, spec.spec, f"{where}[{n}]")
            if why:
                return why
        return None
    if isinstance(spec, Map):
        if not isinstance(value, dict):
            return f"{where} is {_short(value)}, not a mapping"
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where} has a key {k!r} that is not a string"
            if spec.key is not None and spec.key.problem(k):
                return f"{where} has a key {spec.key.problem(k)}"
            why = _problem(v, spec.spec, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(spec, Obj):
        if not isinstance(value, dict):
            return f"{where} is {_short(value)}, not a mapping"
        for key, sub in spec.fields.items():
            optional = key.startswith("?")
            key = key.lstrip("?")
            if key not in value:
                if optional:
                    continue
                return f"{where} has no {key}"
            why = _problem(value[key], sub, f"{where}.{key}")
            if why:
                return why
        return None
    if spec is float:
        return None if is_number(value) else f"{where} is {_short(value)}, not a finite number"
    if spec is int:
        return _problem(value, Int(-INT_MAX, INT_MAX), where)
    if isinstance(value, bool) and spec is not bool or not isinstance(value, spec):
        return f"{where} is {_short(value)}, not {_NAMES.get(spec, spec.__name__)}"
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# the uuid and bus id reach `docker run --gpus device=...`, unit files and commands: typed here
GPU = Obj({"index": Int(0, 1023), "uuid": Check(gpu_uuid_problem), "name": str, "memory_mib": Int(1, 2**31),
           "?cc": Opt(str), "?bus_id": Opt(Check(bus_id_problem)), "?mig": Opt(str), "?persistence": Opt(str), "?driver": Opt(str)})

# config.json fields the plan reads (ModelsOnDisk keeps only these): numbers are numbers
CHECKPOINT_CONFIG = Obj({"?architectures": List(str), "?max_position_embeddings": Int(1, 2**31),
                         "?num_key_value_heads": Int(1, 65536), "?head_dim": Int(1, 65536),
                         "?hybrid_override_pattern": str, "?num_hidden_layers": Int(1, 65536),
                         "?num_nextn_predict_layers": Int(0, 65536)})
MODEL_DIR = Obj({"?total_size": Opt(Int(0, 10**15)), "?config": CHECKPOINT_CONFIG, "?complete": bool,
                 "?revision": Opt(str),
                 # the weights check's marker fast path, done by ModelsOnDisk (facts/weights.py)
                 "?marker_ok": Obj({"present_bytes": Int(0, 10**15), "total_size": Opt(Int(0, 10**15)),
                                    "incomplete_files": Int(0, 10**9)})})

PARTS = {
    "gpus": Obj({"?smi": bool, "?rc": Opt(int), "?error": Opt(str), "driver": Opt(str), "gpus": List(GPU)}),
    "cuda": Opt(str),
    "toolkit": Obj({"?version": Opt(str), "?hook": bool, "?runtime": bool, "?cdi_specs": List(str),
                    "?cdi_refresh": bool}),
    "docker": Obj({"?installed": bool, "?running": bool, "?server": Opt(str), "?cgroup_driver": Opt(str),
                   "?cgroup_version": Opt(int), "?default_runtime": Opt(str), "?runtimes": List(str)}),
    "daemon_json": Obj({"?exists": bool, "?text": str, "data": Opt(dict), "?error": Opt(str)}),
    "cgroup": Opt(Int(1, 2)),
    "os": Map(str),
    "disk_free": Opt(Int(0, 2**62)),
    "models": Map(MODEL_DIR),
    "image": Opt(Obj({"?id": str, "?env": Map(str)})),
    "release": Opt(Map(str)),
    "gpu_access": Opt(str),
    "lock": Opt(dict),
    # a serving group's head address reaches every worker's unit: typed here, before any decision
    "addresses": Map(List(Check(fact_ip_problem)), key=Check(interface_problem)),
    "rdma": List(str),
    # facts/gpuhealth.py: per-GPU values keep nvidia-smi's query names and may be its own text in a
    # facts file ("Yes", "[N/A]"); gpuhealth.admit types each value where it reads it
    "health": Obj({"?gpus": List(Obj({"uuid": Check(gpu_uuid_problem)})), "?refused_fields": List(str),
                   "?xids": List(Obj({"code": int})), "?resets": Map(ANY), "?drained": Map(ANY),
                   "?fabric_manager": Opt(dict), "?error": Opt(str), "?boot_time": ANY}),
}


# not a part: what HostFacts.process adds, {part: sentence} of the parts it could not read
ERRORS = Map(str)


def part_problem(key: str, value) -> str | None:
    """One sentence when `value` is not of HostFacts part `key`'s type (None when it is)."""
    spec = ERRORS if key == "errors" else PARTS.get(key)
    return None if spec is None else _problem(value, spec, key)
