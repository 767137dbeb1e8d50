"""Every fact a converge needs, read in one remote command.

pyinfra 3 keeps no fact cache: each `host.get_fact()` is one round trip, and each operation
reads its own fact, so a no-op run cost one SSH command per operation (13 per host). The
deploy knows, once the desired state is decided, exactly which facts its operations will ask
for (`deploy.fact_reads()`, with `files.reads()` and the like next to the operations). It reads
them all with one `Batch` fact, and the operations take their facts through `fact()`, which
answers from that read and falls back to `host.get_fact()` for anything not read (so an
operation is always right, only slower, if the list misses something).

The values are those pyinfra's own prepare phase would read: every fact is read before any
operation runs, in both cases. A part whose output cannot be read is left out, so that
operation reads it itself and fails with that fact's own message.
"""

from __future__ import annotations

import importlib
import json

from pyinfra import host as current_host
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from . import Fact

from . import engine
from ..valuetypes import host_number

MARK = "@@nemofleet-batch:"
RC = "@@nemofleet-rc:"
ENGINE = -1  # the section of the Docker parts' shared read (facts/engine.py)
_CACHE: dict[str, dict[str, object]] = {}  # host name -> {fact key: value}
_KNOWN: dict[str, dict[str, object]] = {}  # host name -> {fact key: value} read earlier in this run (HostFacts)


def key(cls: type[FactBase], kwargs: dict) -> str:
    return f"{cls.__module__}.{cls.__name__}" + json.dumps(kwargs, sort_keys=True, default=list)


def _cls(path: str) -> type[FactBase]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class Batch(Fact):
    """Several facts in one command: `parts` is a tuple of (fact class path, kwargs as JSON)."""

    def command(self, parts: tuple = ()) -> str:
        facts = [(_cls(path)(), json.loads(kw)) for path, kw in parts]
        # the Docker parts share one read of the engine (facts/engine.py), in a section of its own
        read, shared = engine.shared(facts)
        chunks = [f"echo '{MARK}{i}'; ( {cmd} ) 2>/dev/null; echo \"{RC}$?\""
                  for i, cmd in ([(ENGINE, read)] if read else []) + list(enumerate(shared))]
        return "; ".join(chunks) + "; true" if chunks else "true"

    def parse(self, output):
        """{part index: its output lines}, for the parts whose command exited 0 (as pyinfra
        itself would process them); parsed by load(), where the classes are known."""
        sections: dict[int, list[str]] = {}
        ok: set[int] = set()
        twice: set[int] = set()  # a part whose output holds a marker line: neither copy is read
        current = None
        for line in output:
            if line.startswith(MARK):
                current = host_number(line[len(MARK):], ENGINE, 10**6)
                if current is None:
                    continue
                if current in sections:
                    twice.add(current)
                sections[current] = []
            elif line.startswith(RC) and current is not None:
                if line[len(RC):].strip() == "0":
                    ok.add(current)
                current = None
            elif current is not None:
                sections[current].append(line)
        return {i: lines for i, lines in sections.items() if i in ok and i not in twice}


def load(wanted: list[tuple[type[FactBase], dict]]) -> int:
    """Read `wanted` facts of the current host in one command; returns how many parts were read."""
    cache = _CACHE.setdefault(current_host.name, {})
    cache.clear()
    cache.update(_KNOWN.pop(current_host.name, {}))  # read once already in this run: not again
    todo: dict[str, tuple[type[FactBase], dict]] = {}  # fact key -> (class, kwargs): the first asked of each key
    for cls, kwargs in wanted:
        if (k := key(cls, kwargs)) not in cache:
            todo.setdefault(k, (cls, kwargs))
    if not todo:
        return 0
    parts = tuple((f"{cls.__module__}.{cls.__name__}", json.dumps(kw, sort_keys=True, default=list))
                  for cls, kw in todo.values())
    sections = current_host.get_fact(Batch, parts=parts)
    read = sections.get(ENGINE) or []
    for i, (k, (cls, _)) in enumerate(todo.items()):
        lines = sections.get(i)
        if lines is None:
            continue
        fact_ = cls()
        lines = engine.lines_for(fact_, lines, read)
        try:
            cache[k] = fact_.process(lines)
        except FactProcessError:  # that operation reads the fact itself and fails the host with why
            continue
    return len(todo)


def known(reads) -> None:
    """Facts of the current host read earlier in this run (HostFacts, with facts.host.known_reads),
    as (class, kwargs, value): the next load() answers them without reading them again."""
    _KNOWN[current_host.name] = {key(cls, kw): value for cls, kw, value in reads}


def fact(cls: type[FactBase], args: dict | None = None, **kwargs):
    """The fact as read by load() for this host, or read now. Its arguments as keywords, or as the
    dict an operation module's `*_reads()` gives with the class (`fact(*units.running_reads(u))`)."""
    kwargs = {**(args or {}), **kwargs}
    cache = _CACHE.get(current_host.name) or {}
    k = key(cls, kwargs)
    if k in cache:
        return cache[k]
    return current_host.get_fact(cls, **kwargs)


def forget() -> None:
    """Drop what was read for the current host (a later converge reads afresh)."""
    _CACHE.pop(current_host.name, None)
    _KNOWN.pop(current_host.name, None)
