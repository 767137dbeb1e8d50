"""Run a nemofleet operation without a host, the way pyinfra tests its own operations.

An operation's body (`op._inner`) only asks `host` for facts and yields commands, so it runs
under a fake state and host whose facts come from a fixture dict; the commands it yields are
collected in a readable form and compared with the fixture. No SSH, no Docker.

Facts are keyed by the fact class name, then (for facts that take arguments) by the arguments
as `k=v` pairs sorted by name and joined with ", " (str values as they are, others as JSON):

    "facts": {"DockerInfo": {...}, "DaemonJson": {"path=/etc/docker/daemon.json": {...}}}

A fact the operation asks for that the fixture lacks raises KeyError naming the exact key, so a
test never silently answers None. Commands read back as: a StringCommand's raw shell text (`sh -c SCRIPT` as ["sh -c", SCRIPT],
unquoted, with the weights check programs shown as <CHECK_SCRIPT>/<HUB>); a
FileUploadCommand as ["upload", dest, content]; a FunctionCommand as ["function", name, args,
kwargs]. In fixture kwargs and facts, ["set:", a, b] is the set {a, b} (as in pyinfra's tests),
["tuple:", a, b] a tuple and "bytes:TEXT" bytes.
"""

from __future__ import annotations

import inspect
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import Config, FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state


class FakeState:
    """The few State attributes an operation body reads."""

    def __init__(self, diff: bool = False):
        self.config = Config()
        self.config.DIFF = diff
        self.cwd = "/"
        self.is_executing = False

    def get_temp_filename(self, *args) -> str:
        return "_tempfile_"


def fact_key(kwargs: dict) -> str:
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(list(v) if isinstance(v, tuple) else v)}"
                     for k, v in sorted(kwargs.items()))


class FakeConnector:
    pass


class FakeHost:
    """name, data, get_fact from the fixture, noop, log, get_temp_filename."""

    current_op_global_arguments: dict = {}
    in_op = True

    def __init__(self, name: str, facts: dict, data: dict | None = None, connector: str = "ssh"):
        self.name = name
        self.data = data or {}
        self.facts = facts
        self.noop_description: str | None = None
        self.logs: list[str] = []
        self.connector_cls = type(f"{connector.capitalize()}Connector", (FakeConnector,), {})
        self.asked: list[str] = []

    def get_fact(self, cls, **kwargs):
        name = cls.__name__
        if name not in self.facts:
            raise KeyError(f"missing test fact {name}")
        value = self.facts[name]
        if not kwargs:
            return value
        real = inspect.signature(cls.command).parameters  # as pyinfra's tests: a fixture must not
        bad = sorted(set(kwargs) - set(real))               # hide an argument the fact does not take
        assert not bad, f"{name}.command() takes no argument {', '.join(bad)}"
        key = fact_key(kwargs)
        self.asked.append(f"{name}({key})")
        if key not in value:
            raise KeyError(f"missing test fact {name} for {key!r} (fixture has {sorted(value)})")
        return value[key]

    def noop(self, description: str) -> None:
        self.noop_description = description

    def log(self, message: str, log_func=None) -> None:
        self.logs.append(message)

    def get_temp_filename(self, *args) -> str:
        return "_tempfile_"


def abbreviations() -> dict[str, str]:
    """Long embedded programs shown by name, so a fixture reads as what the op decided."""
    from nemofleet import remote, shell

    # the programs of nemofleet/remote that the operations send (weights check; Hub precheck)
    return {shell.quote(remote.source("weights_check")): "<CHECK_SCRIPT>", shell.quote(remote.source("hub")): "<HUB>"}


def shell_text(raw: str) -> Any:
    """`sh -c '<script>'` reads back as ["sh -c", script] (unquoted); other commands as text."""
    for long, name in abbreviations().items():
        raw = raw.replace(long, name)
    if raw.startswith("sh -c "):
        words = shlex.split(raw)
        if len(words) == 3:
            script = words[2]
            for long, name in abbreviations().items():
                script = script.replace(long, name)
            return ["sh -c", script]
    return raw


def readable(cmd) -> Any:
    if isinstance(cmd, str):  # pyinfra turns a yielded str into a StringCommand
        return shell_text(cmd.strip())
    if isinstance(cmd, StringCommand):
        return shell_text(cmd.get_raw_value())
    if isinstance(cmd, FileUploadCommand):
        src = cmd.src
        if hasattr(src, "read"):
            src.seek(0)
            data = src.read()
            src.seek(0)
            content = data.decode() if isinstance(data, bytes) else data
        else:
            content = f"local:{src}"
        return ["upload", str(cmd.dest), content]
    if isinstance(cmd, FunctionCommand):
        return ["function", cmd.function.__name__, list(cmd.args), dict(cmd.kwargs)]
    raise TypeError(f"{cmd!r} is not a command this harness knows")


def parse_value(value):
    """JSON -> Python: ["set:", ...] is a set, ["tuple:", ...] a tuple, "bytes:TEXT" bytes."""
    if isinstance(value, str) and value.startswith("bytes:"):
        return value[len("bytes:"):].encode()
    if isinstance(value, list):
        if value[:1] == ["set:"]:
            return {parse_value(v) for v in value[1:]}
        if value[:1] == ["tuple:"]:
            return tuple(parse_value(v) for v in value[1:])
        return [parse_value(v) for v in value]
    if isinstance(value, dict):
        return {k: parse_value(v) for k, v in value.items()}
    return value


@dataclass
class Result:
    commands: list = field(default_factory=list)
    noop_description: str | None = None
    logs: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)  # after the run: sets the op filled in


def run(op, kwargs: dict, facts: dict, host_name: str = "testhost", data: dict | None = None,
        connector: str = "ssh", diff: bool = False) -> Result:
    """Run `op`'s body with fixture facts; returns what it yielded and its no-op description."""
    host = FakeHost(host_name, parse_value(facts), data, connector)
    state = FakeState(diff)
    kwargs = parse_value(kwargs)
    with ctx_state.use(state), ctx_host.use(host):
        commands = [readable(c) for c in op._inner(**kwargs)]
    return Result(commands, host.noop_description, host.logs, kwargs)


def call(fn, kwargs: dict, facts: dict, host_name: str = "testhost", data: dict | None = None,
         connector: str = "ssh"):
    """Call a plain function of an operation module (a decision helper such as files.will_change)
    under the same fake host and fixture facts as run(); returns what it returns."""
    host = FakeHost(host_name, parse_value(facts), data, connector)
    with ctx_state.use(FakeState()), ctx_host.use(host):
        return fn(**parse_value(kwargs))


def as_json(value):
    """Sets back to sorted lists, for comparing with a fixture."""
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    return value


def verdict(host, facts, data, peers=None):
    """The preflight's verdict for one host as the deploy reaches it (desired.build: spec, gatherer,
    decision), with the members of its serving group sharing its host data: plan (as far as it was
    made), refusals, warnings, ok."""
    from types import SimpleNamespace

    from nemofleet import desired

    data = {"vllm_api_key": "sk-test-0123456789", **data}  # the preflight's question, not the API key's
    d = desired.build(host, data, facts, None, peers=peers, peer_data={m: data for m in peers or {}})
    return SimpleNamespace(plan=d.preview, refusals=d.refusals, warnings=d.warnings, ok=d.ok, codes=[
        getattr(r, "code", "refused") for r in d.refusals])


def typed_settings(data):
    """Host data typed as the host spec types it (settings.parse), a bad key raised as the PlanError
    the planner's tests expect (the deploy refuses such a host with the same sentence)."""
    from nemofleet import plan, settings

    if isinstance(data, settings.Settings):
        return data
    try:
        return settings.parse(data)
    except settings.SettingsError as exc:
        raise plan.PlanError("; ".join(exc.problems)) from None


def make_plan(host, gpus, data, **kw):
    """plan.make_plan (which takes Settings only) over host data."""
    from nemofleet import plan

    return plan.make_plan(host, gpus, typed_settings(data), **kw)
