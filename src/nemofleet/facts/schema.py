"""The type of every HostFacts part, declared once: what a fact parser returns and what a facts
file (`nemofleet plan --facts`) must hold.

`part_problem(key, value)` is None for a value of the part's type, or one sentence naming the
first place it is not (a string where a list is, null where a mapping is, a GPU without a uuid,
a checkpoint config.json with a string where a number is). HostFacts.process and the facts-file
reader call it, so a malformed part refuses that host in one sentence, never with a traceback
further up.

A spec is: a Python type (int and float exclude bool; numbers are finite; a `str` is one line of at
most MAX_TEXT printable characters: facts are echoed into sentences, units and files), `TEXT` (a
file's text or an error message: line breaks allowed, bounded), `Opt(spec)` (or null), `List(spec)`, `Map(value_spec)` (string keys), `Int(min, max)`, `Obj({key: spec})`
(`?key` optional; other keys are allowed and ignored), or ANY.
"""

from __future__ import annotations

from dataclasses import dataclass

import re

from ..valuetypes import (INT_MAX, bus_id_problem, fact_ip_problem, gpu_uuid_problem, interface_problem, is_number,
                          shown)

MAX_TEXT = 4096  # the longest one-line fact value (an os-release line, a version, an image env value)
MAX_FILE = 1 << 20  # the longest text a fact carries whole (daemon.json as read: docs/reference.md bounds it)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
TEXT = object()  # see the module docstring

_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", dict: "a mapping",
          list: "a list"}


def _problem(value, spec, where: str) -> str | None:
    if spec is ANY:
        return None
    if spec is TEXT:
        if not isinstance(value, str):
            return f"{where} is {_short(value)}, not a string"
        return f"{where} is {len(value)} characters long, more than {MAX_FILE}" if len(value) > MAX_FILE else None
    if isinstance(spec, Opt):
        return None if value is None else _problem(value, spec.spec, where)
    if isinstance(spec, Check):
        why = spec.problem(value)
        return f"{where} {why}" if why else None
    if isinstance(spec, Int):
        if isinstance(value, bool) or not isinstance(value, int) or not spec.minimum <= value <= spec.maximum:
            return f"{where} is {_short(value)}, not an integer from {spec.minimum} to {spec.maximum}"
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
                return f"{where} has a key {_short(k)} that is not a string"
            if spec.key is not None and spec.key.problem(k):
                return f"{where} has a key {spec.key.problem(k)}"
            if len(k) > MAX_TEXT or _CONTROL.search(k):
                return f"{where} has a key {_short(k)} with a control character or of more than {MAX_TEXT} characters"
            why = _problem(v, spec.spec, f"{where}[{_short(k)}]")
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
    if spec is str and (len(value) > MAX_TEXT or _CONTROL.search(value)):
        return (f"{where} is {_short(value)}, not one line of at most {MAX_TEXT} printable characters "
                "(a line break or another control character, or too long)")
    return None


def _short(value) -> str:
    return shown(value)


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

UNIX_MAX = 2**40  # a unix time (year 36812): beyond is no time a host can have
_XID_BUS = re.compile(r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(\.[0-7])?")


def _xid_bus_problem(value) -> str | None:
    """A bus id as a kernel Xid line gives it (0000:07:00, nvsmi.bus_key)."""
    return None if isinstance(value, str) and _XID_BUS.fullmatch(value) else f"{_short(value)} is not a PCI bus id"


PARTS = {
    "gpus": Obj({"?smi": bool, "?rc": Opt(int), "?error": Opt(TEXT), "driver": Opt(str), "gpus": List(GPU)}),
    "cuda": Opt(str),
    "toolkit": Obj({"?version": Opt(str), "?hook": bool, "?runtime": bool, "?cdi_specs": List(str),
                    "?cdi_refresh": bool}),
    "docker": Obj({"?installed": bool, "?running": bool, "?server": Opt(str), "?cgroup_driver": Opt(str),
                   "?cgroup_version": Opt(int), "?default_runtime": Opt(str), "?runtimes": List(str)}),
    "daemon_json": Obj({"?exists": bool, "?text": TEXT, "data": Opt(dict), "?error": Opt(TEXT)}),
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
                   "?xids": List(Obj({"code": Int(0, 10**6), "bus_id": Check(_xid_bus_problem), "?uptime": Opt(float),
                                      "?time": Opt(float), "?text": Opt(str)})),
                   "?resets": Map(Int(0, UNIX_MAX), key=Check(_xid_bus_problem)),
                   "?drained": Map(Obj({"since": Int(0, UNIX_MAX), "index": Int(0, 1023), "?reason": Opt(str)}),
                                   key=Check(gpu_uuid_problem)),
                   "?fabric_manager": Opt(Obj({"?version": Opt(str), "?active": Opt(str)})), "?error": Opt(TEXT),
                   "?boot_time": Opt(Int(0, UNIX_MAX))}),
}


# not a part: what HostFacts.process adds, {part: sentence} of the parts it could not read
ERRORS = Map(str)


def part_problem(key: str, value) -> str | None:
    """One sentence when `value` is not of HostFacts part `key`'s type (None when it is)."""
    spec = ERRORS if key == "errors" else PARTS.get(key)
    return None if spec is None else _problem(value, spec, key)
