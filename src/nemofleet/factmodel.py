"""The typed facts of a host: every HostFacts part the decision reads, declared once as a model.

A host's facts arrive as JSON-shaped data (HostFacts' output, a facts file, a serving group
member's facts). They are parsed here, once, at the edge (inputs.make, the one gatherer) into a
frozen `Facts`; after that the decision (desired, preflight, gpuhealth, multinode, plan) reads
attributes of typed objects and never a raw value. A part that is not of its type refuses that
host alone, in one sentence naming the place (`part_problem`): never a traceback, never another
host.

Each model's fields say their range with metadata the sentence walker reads (`Int(min, max)`,
`Check(problem)`, `TEXT`, `Keys(problem)`); a plain `str` is one line of at most MAX_TEXT printable
characters, since facts are echoed into sentences, units and files; numbers are finite; int and
float never take a bool. `PARTS` (what a facts file must hold) are
Facts' own fields, and the walker reads the models' annotations themselves (no spec of its own),
so the type a part is checked against and the type the decision reads are the same declaration.

Layer: pure (no pyinfra, nothing from facts/, operations/ or fleet/): facts/host.py below it uses it to check what a fact printed; inputs.py builds `Facts` with it.
"""

from __future__ import annotations

import types
import typing
from collections import abc
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, Union, cast

import pydantic

from .dockerconf import host_file_problem
from .nvsmi import HEALTH_FIELDS, MIG_MODES, UNIFIED, XID_BUS, Unreadable, bus_key, typed
from .valuetypes import (INT_MAX, UNIX_MAX, bus_id_problem, fact_ip_problem, gpu_uuid_problem, interface_problem,  # noqa: F401
                         CONTROL, is_number, shown)

MAX_TEXT = 4096  # the longest one-line fact value (an os-release line, a version, an image env value)
MAX_FILE = 1 << 20  # the longest text a fact carries whole (daemon.json as read: docs/reference.md bounds it)


# ---------------------------------------------------------------------------- the range markers
# What a value must be beyond its type, as the sentence walker (_problem) reads a model's fields:
# Annotated metadata on the field.

@dataclass(frozen=True)
class Int:
    minimum: int = 0
    maximum: int = INT_MAX


@dataclass(frozen=True)
class Check:
    """A string of a constrained type: `problem(value)` is None or the sentence's tail
    (valuetypes' *_problem functions: a GPU UUID, a PCI bus id, an address)."""
    problem: Callable[[Any], str | None]


@dataclass(frozen=True)
class Keys:
    """Annotated metadata on a Mapping field: the keys' own type (a Check's problem)."""
    problem: Callable[[Any], str | None]


TEXT = object()  # a file's text or an error message: line breaks allowed, bounded by MAX_FILE

_NAMES = {str: "a string", bool: "true or false"}  # the types reaching _problem's last check (int and float have their own)


_FORMS: dict[int, tuple] = {}  # id(type) -> (type, its form): a typing alias hashes slowly


def _form(tp) -> tuple:
    """(origin, args, a model's fields) of a field's type, read once per type (the walk runs per
    host). A health row's values are typed by Health's validator from the row's own nvidia-smi
    fields, so a HealthGpu is walked for its uuid alone."""
    known = _FORMS.get(id(tp))
    if known is None or known[0] is not tp:
        fields = isinstance(tp, type) and issubclass(tp, _Fact) and tuple(
            (name, f) for name, f in tp.model_fields.items() if tp is not HealthGpu or name == "uuid")
        known = _FORMS[id(tp)] = (tp, (typing.get_origin(tp), typing.get_args(tp), fields))
    return known[1]


def _problem(value, tp, where: str, metadata=()) -> str | None:
    """One sentence naming the first place `value` is not of type `tp` (a model field's annotation,
    with its Annotated metadata), None when it is of it; a model is walked field by field."""
    for m in metadata:
        if m is TEXT:
            if not isinstance(value, str):
                return f"{where} is {shown(value)}, not a string"
            return f"{where} is {len(value)} characters long, more than {MAX_FILE}" if len(value) > MAX_FILE else None
        if isinstance(m, Check):
            why = m.problem(value)
            return f"{where} {why}" if why else None
        if isinstance(m, Int):
            if isinstance(value, bool) or not isinstance(value, int) or not m.minimum <= value <= m.maximum:
                return f"{where} is {shown(value)}, not an integer from {m.minimum} to {m.maximum}"
            return None
    origin, args, fields = _form(tp)
    if origin is Annotated:
        return _problem(value, args[0], where, tp.__metadata__)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return None if value is None or len(rest) > 1 else _problem(value, rest[0], where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return f"{where} is {shown(value)}, not a list"
        return next(filter(None, (_problem(item, args[0], f"{where}[{n}]") for n, item in enumerate(value))), None)
    if origin in (dict, abc.Mapping) or fields:
        if not isinstance(value, Mapping):
            return f"{where} is {shown(value)}, not a mapping"
        if fields:  # a model: its fields (other keys are allowed and ignored)
            return next(filter(None, (_field_problem(value, name, f, where) for name, f in fields)), None)
        keys = next((m.problem for m in metadata if isinstance(m, Keys)), None)
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where} has a key {shown(k)} that is not a string"
            if keys is not None and keys(k):
                return f"{where} has a key {keys(k)}"
            if len(k) > MAX_TEXT or CONTROL.search(k):
                return f"{where} has a key {shown(k)} with a control character or of more than {MAX_TEXT} characters"
            why = _problem(v, args[1], f"{where}[{shown(k)}]")
            if why:
                return why
        return None
    if tp is float:
        return None if is_number(value) else f"{where} is {shown(value)}, not a finite number"
    if tp is int:
        return _problem(value, int, where, (Int(-INT_MAX, INT_MAX),))
    if isinstance(value, bool) and tp is not bool or not isinstance(value, tp):
        return f"{where} is {shown(value)}, not {_NAMES.get(tp, getattr(tp, '__name__', tp))}"
    if tp is str and (len(value) > MAX_TEXT or CONTROL.search(value)):
        return (f"{where} is {shown(value)}, not one line of at most {MAX_TEXT} printable characters "
                "(a line break or another control character, or too long)")
    return None


def _field_problem(value: Mapping, name: str, f, where: str) -> str | None:
    """_problem of a model's field `name` in `value` (absent: its default, when it has one)."""
    if name not in value:
        return None if not f.is_required() else f"{where} has no {name}"
    return _problem(value[name], f.annotation, f"{where}.{name}", f.metadata)


# ---------------------------------------------------------------------------- the models


class _Fact(pydantic.BaseModel):
    # frozen: read, never changed; other keys a fact prints are ignored (a newer nemofleet's facts
    # file plans with an older one); built only from values _problem passed (Facts.parse)
    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")


Uuid = Annotated[str, Check(gpu_uuid_problem)]
BusId = Annotated[str, Check(bus_id_problem)]
Address = Annotated[str, Check(fact_ip_problem)]


def _xid_bus_problem(value) -> str | None:
    """A bus id as a kernel Xid line gives it (0000:07:00, nvsmi.bus_key)."""
    return None if isinstance(value, str) and XID_BUS.fullmatch(value) else f"{shown(value)} is not a PCI bus id"


XidBus = Annotated[str, Check(_xid_bus_problem)]
UnixTime = Annotated[int, Int(0, UNIX_MAX - 1)]


def _mig_problem(value) -> str | None:
    """A MIG mode as nvidia-smi prints it ("N/A": a GPU without MIG); anything else is no mode."""
    return None if value in (*MIG_MODES, "N/A") else f"{shown(value)} is not a MIG mode (Enabled, Disabled or N/A)"


class Gpu(_Fact):
    """One GPU as nvidia-smi lists it; the uuid and bus id reach `docker run --gpus device=...`,
    unit files and commands."""
    index: Annotated[int, Int(0, 1023)]
    uuid: Uuid
    name: str
    memory_mib: Annotated[int, Int(1, 2**31)]
    cc: str | None = None
    bus_id: BusId | None = None
    mig: Annotated[str, Check(_mig_problem)] | None = None
    persistence: str | None = None
    driver: str | None = None
    # the GPU shares the system memory (GB10, Jetson Thor): memory_mib is MemTotal (facts/gpu.py)
    unified: bool = False

    @pydantic.model_validator(mode="after")
    def _unified_board(self):
        if self.unified and not UNIFIED.search(self.name):
            raise Unreadable(f"gpus marks GPU {self.index} ({shown(self.name)}) as unified memory, which only GB10 and "
                             "Jetson Thor boards have: a discrete GPU is never sized from the host's memory")
        return self


class Gpus(_Fact):
    """nvidia-smi's answer: whether it is installed, its exit code and error, the driver, the GPUs."""
    smi: bool = False
    rc: int | None = None
    error: Annotated[str, TEXT] | None = None
    driver: str | None
    gpus: tuple[Gpu, ...]

    @pydantic.model_validator(mode="after")
    def _one_row_per_gpu(self):
        # two rows of one GPU would plan two instances on it
        for key in ("uuid", "index"):
            seen: dict = {}
            for g in self.gpus:
                value = getattr(g, key)
                if value is not None and value in seen:
                    raise Unreadable(f"gpus lists {key} {value} twice (GPU {seen[value]} and GPU {g.index}): two rows "
                                     "of one GPU would plan two instances on it; run nvidia-smi -L on the host")
                seen[value] = g.index
        return self


class Toolkit(_Fact):
    version: str | None = None
    hook: bool = False
    runtime: bool = False
    cdi_specs: tuple[str, ...] = ()
    cdi_refresh: bool = False


class Docker(_Fact):
    installed: bool = False
    running: bool = False
    server: str | None = None
    cgroup_driver: str | None = None
    cgroup_version: int | None = None
    default_runtime: str | None = None
    runtimes: tuple[str, ...] = ()


class DaemonJson(_Fact):
    """/etc/docker/daemon.json as read: `data` is its JSON object, None when it is not one (`error` says why)."""
    exists: bool = False
    text: Annotated[str, TEXT] = ""
    # the keys nemofleet reads or merges are of their JSON type (dockerconf.host_file_problem)
    data: Annotated[dict | None, Check(host_file_problem)]
    error: Annotated[str, TEXT] | None = None


class CheckpointConfig(_Fact):
    """The config.json fields the plan reads (ModelsOnDisk keeps only these): numbers are numbers."""
    architectures: tuple[str, ...] = ()
    max_position_embeddings: Annotated[int, Int(1, 2**31)] | None = None
    num_key_value_heads: Annotated[int, Int(1, 65536)] | None = None
    head_dim: Annotated[int, Int(1, 65536)] | None = None
    hybrid_override_pattern: str | None = None
    num_hidden_layers: Annotated[int, Int(1, 65536)] | None = None
    num_nextn_predict_layers: Annotated[int, Int(0, 65536)] | None = None
    nemofleet_tiny: str | None = None  # the testbed's tiny stand-in checkpoint's label (tinymodel)


class MarkerOk(_Fact):
    """The weights check's marker fast path, done by ModelsOnDisk (facts/weights.py)."""
    present_bytes: Annotated[int, Int(0, 10**15)]
    total_size: Annotated[int, Int(0, 10**15)] | None
    incomplete_files: Annotated[int, Int(0, 10**9)]


class ModelDir(_Fact):
    """One weights directory under models_root."""
    total_size: Annotated[int, Int(0, 10**15)] | None = None
    config: CheckpointConfig | None = None
    complete: bool = False
    revision: str | None = None
    marker_ok: MarkerOk | None = None


def _file_name_problem(value) -> str | None:
    """A file of a weights directory as the weights check names it (its safetensors index's
    weight_map, its required files): a relative name inside the repository whose every part is
    plain, the rule of remote/weights_check.is_shard_name: no empty part, none starting with '-'
    (`--local-dir=/` would be an option of `hf download`) or '.' ('..', '.', hidden), nothing
    str.isprintable() refuses (controls, U+2028, bidi)."""
    if (not isinstance(value, str) or not 0 < len(value) <= 1024 or not value.isprintable()
            or any(not part or part[0] in "-." for part in value.split("/"))):
        return f"{shown(value)} is not a file name inside the weights directory"
    return None


FileName = Annotated[str, Check(_file_name_problem)]


class WeightsState(_Fact):
    """The weights check's answer for one directory (remote/weights_check.py; WeightsStatus):
    what the weights operation decides from (marked complete, verify and mark, fetch these files)."""
    dir: str | None = None
    exists: bool = False
    complete: bool = False
    marker: bool = False
    missing: tuple[FileName, ...] = ()
    truncated: tuple[FileName, ...] = ()
    incomplete_files: Annotated[int, Int(0, 10**9)] = 0
    present_bytes: Annotated[int, Int(0, 10**15)] = 0
    total_size: Annotated[int, Int(0, 10**15)] | None = None
    commit_ok: bool = False
    other_commits: tuple[str, ...] = ()


def weights_state(value) -> dict | None:
    """The weights check's answer typed (WeightsState, as a dict of its fields), or None when it
    is not one: the operation then fetches and verifies as if nothing were there."""
    if not isinstance(value, Mapping) or _problem(value, WeightsState, "weights"):
        return None
    return WeightsState.model_validate(value).model_dump()


class Image(_Fact):
    id: str | None = None
    env: Mapping[str, str] = {}


class Xid(_Fact):
    code: Annotated[int, Int(0, 10**6)]
    bus_id: XidBus
    uptime: float | None = None
    time: float | None = None
    text: str | None = None


class Drained(_Fact):
    """A GPU the health script drained (its marker under /var/lib/nemofleet/health)."""
    since: UnixTime
    index: Annotated[int, Int(0, 1023)]
    reason: str | None = None


class FabricManager(_Fact):
    version: str | None = None
    active: str | None = None


class HealthGpu(_Fact):
    """One GPU's health row: nvidia-smi's query fields (nvsmi.HEALTH_FIELDS), each typed by
    nvsmi.typed when the facts are parsed (a facts file may hold nvidia-smi's own "Yes", "[N/A]")."""
    uuid: Uuid
    lost: bool = False
    values: Mapping[str, Any] = {}  # {query field: typed value}


class Health(_Fact):
    """The GPU health fact (facts/gpuhealth.py; docs/gpu-health.md)."""
    gpus: tuple[HealthGpu, ...] = ()
    refused_fields: tuple[str, ...] = ()
    xids: tuple[Xid, ...] = ()
    boot_time: UnixTime | None = None
    resets: Annotated[Mapping[str, UnixTime], Keys(_xid_bus_problem)] = {}
    fabric_manager: FabricManager | None = FabricManager()
    drained: Annotated[Mapping[str, Drained], Keys(gpu_uuid_problem)] = {}
    error: Annotated[str, TEXT] | None = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _typed_rows(cls, value):
        # each row's nvidia-smi values typed once, here (nvsmi.typed raises Unreadable: one sentence)
        if isinstance(value, Mapping) and isinstance(value.get("gpus"), (list, tuple)):
            rows = []
            for i, row in enumerate(value["gpus"]):
                if isinstance(row, HealthGpu) or not isinstance(row, Mapping):
                    rows.append(row)
                    continue
                index = row.get("index")  # nvidia-smi's index when it is one, else the row's place
                index = index if type(index) is int and 0 <= index < 1024 else i
                where = f" of GPU {index} in the health facts"
                values = {n: typed(n, v, where) for n, v in row.items() if n in HEALTH_FIELDS}
                rows.append({"uuid": row.get("uuid"), "lost": bool(row.get("lost")), "values": values})
            value = {**value, "gpus": rows}
        return value


class Lock(_Fact):
    """The deploy lock's info file as the lock program prints it (lock/fact.py, lockinfo.parse):
    times are unix seconds below UNIX_MAX (valuetypes.host_time), so gmtime() and arithmetic stay bounded."""
    holder: str | None = None
    token_sha256: str | None = None
    token: str | None = None  # a lock built by hand (a test's) may carry the token itself
    since: str | None = None
    expires: UnixTime | None = None
    message: str | None = None
    now: UnixTime | None = None

    def info(self) -> dict:
        """The fields the lock file had, as lockinfo reads them."""
        return self.model_dump(exclude_none=True)


class HeadReach(_Fact):
    """A serving group worker's probe of its head's rendezvous port (deploy.host_inputs)."""
    target: str  # "address:port", one line
    state: str | None = None  # TcpReach: open, refused, silent; None when its answer was not one of them


# the HostFacts parts, by the key HostFacts writes them under, with the model or type of each
# and the value a part has when it is absent (a facts file written before the part existed)
class Facts(_Fact):
    """A host's whole facts: what every decision about the host reads."""
    gpus: Gpus = Gpus(smi=False, error="nvidia-smi not found", driver=None, gpus=())
    cuda: str | None = None
    toolkit: Toolkit = Toolkit()
    docker: Docker = Docker()
    daemon_json: DaemonJson = DaemonJson(exists=True, data=None, error="daemon.json is empty")
    cgroup: Annotated[int, Int(1, 2)] | None = None
    os: Mapping[str, str] = {}
    disk_free: Annotated[int, Int(0, 2**62)] | None = None
    models: Mapping[str, ModelDir] = {}
    image: Image | None = None
    release: Mapping[str, str] | None = None
    gpu_access: str | None = None
    lock: Lock | None = None
    # a serving group's head address reaches every worker's unit: typed here, before any decision
    addresses: Annotated[Mapping[str, tuple[Address, ...]], Keys(interface_problem)] = {}
    rdma: tuple[str, ...] = ()
    health: Health = Health()
    # not parts of the host's output: {part: sentence} of the parts HostFacts could not read, and
    # a worker's probe of its head
    errors: Mapping[str, str] = {}
    head_reach: HeadReach | None = None


class PeerMissing(_Fact):
    """A serving group member whose facts cannot be planned with: `why` ends the sentence
    "<member> ..." (has no facts, did not answer, has facts nemofleet cannot read)."""
    why: str


# ---------------------------------------------------------------------------- parsing a part


# the HostFacts parts: the host's own output (errors and head_reach are added beside it)
PARTS = {name: f for name, f in Facts.model_fields.items() if name not in ("errors", "head_reach")}


def _first_error(exc: pydantic.ValidationError, key: str) -> str:
    err = exc.errors()[0]
    inner = err.get("ctx", {}).get("error")
    if isinstance(inner, Unreadable):
        return str(inner)
    return f"{key}.{'.'.join(map(str, err['loc']))} {err['msg'].lower()}"


# each field's own validator, so a part is validated alone, without building a whole Facts per part
_ADAPTERS = {name: pydantic.TypeAdapter(cast(Any, Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation))
             for name, f in Facts.model_fields.items()}


def _typed_part(key: str, value) -> tuple[object, str | None]:
    """(the part typed, None), or (None, one sentence naming the first place it is not of its
    type): walked for the sentence, then validated once by its field's adapter (health's rows
    typed by nvsmi there). A key that is no field of Facts is (None, None)."""
    f = Facts.model_fields.get(key)
    if f is None:
        return None, None
    why = _problem(value, f.annotation, key, f.metadata)
    if why:
        return None, why
    try:
        return _ADAPTERS[key].validate_python(value), None
    except Unreadable as exc:
        return None, str(exc)
    except pydantic.ValidationError as exc:
        return None, _first_error(exc, key)
    except (ValueError, TypeError) as exc:  # a validator's own error, not wrapped by pydantic
        return None, f"{key}: {str(exc)[:300]}"


def part_problem(key: str, value) -> str | None:
    """One sentence when `value` is not of HostFacts part `key`'s type (None when it is)."""
    return _typed_part(key, value)[1]


def parse(facts: Mapping | Facts | None) -> tuple[Facts, list[str]]:
    """(the typed facts, one sentence per part that is not of its type). A bad part is replaced
    by its default and named, so the host is refused in that sentence and nothing else reads it;
    a missing part has its default. Each part is walked (the sentence) and validated once."""
    if isinstance(facts, Facts):
        return facts, []
    if not isinstance(facts, Mapping):
        return Facts(), [f"the host's facts are {shown(facts)}, not an object of HostFacts parts"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key in Facts.model_fields:
        if key in facts:
            value, why = _typed_part(key, facts[key])
            if why:
                problems.append(why)
            else:
                values[key] = value
    # every value is of its field's type already: the whole is assembled without a second pass
    return Facts.model_construct(**values), problems


def parse_peer(member: str, facts) -> Facts | PeerMissing:
    """A serving group member's facts, typed like a host's own; a member whose facts do not parse
    is PeerMissing with the sentence (it refuses the group, naming the member)."""
    if isinstance(facts, (Facts, PeerMissing)):
        return facts
    if facts is None:
        return PeerMissing(why="has no facts (unreachable, or not in the facts file)")
    typed_facts, problems = parse(facts)
    if problems:
        return PeerMissing(why=f"has facts nemofleet cannot read ({problems[0][:200]})")
    return typed_facts
