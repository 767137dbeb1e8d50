"""Weights fan-out: who fetches a model from the origin and who copies it from whom.

A fleet decision, pure (no I/O): from the hosts of a run (in batch order), the (repo, revision)
each wants and the hosts that already hold a verified copy, one host per (repo, revision)
fetches from the origin (the Hub or its mirror) and every other copies from a host that already
holds it, in steps: in each step every holder seeds at most one host, so the holders double and
N hosts are served in about log2(N) steps. A copy names a few sources, tried in order, then the
origin; the receiving host verifies the copy itself (the weights check, commit included) before
it is marked complete, so a failed or slow source costs time, never a bad copy (docs/fanout.md).

The result reaches each host as its `weights_seed_from` (a list of peers), as part of its
HostInputs: a rollout hands it over per host (deciding before each batch from the holders its
probe found), and a plain converge of several hosts (`pyinfra INVENTORY deploys/nemotron.py`)
decides it once per run from the hosts' data alone (`for_run`: no fact of another host is
read); a host deployed alone decides nothing here and works as before.

Layer: decision (settings, models); imports nothing from fleet/.
"""

from __future__ import annotations

from . import shell  # the one quoting boundary
from dataclasses import dataclass, field
from typing import Mapping

from . import models as catalog

Key = tuple  # (repo, revision)
SPARE_SOURCES = 2  # holders named after the first, tried in order before the origin
# A source of the same run may still be fetching: the copy waits for its verified marker while
# its directory grows, and moves on after this many seconds without progress (a failed source).
SOURCE_STALL = 600
# In a plain converge every host runs the weights operation at the same moment (pyinfra runs an
# operation on all hosts before the next): a source that has not even created its directory this
# long after (refused by preflight, failed before the weights, unreachable) is not fetching, and
# its receivers move on at once instead of after SOURCE_STALL. A rollout deploys each host in a
# run of its own (a source may still be pulling the image), so it hands no `start` over.
SOURCE_START = 60


@dataclass(frozen=True)
class Copy:
    host: str
    key: Key
    step: int  # 0: the first step of its batch
    sources: tuple[str, ...] = ()  # empty: from the origin

    def line(self) -> str:
        what = f"{self.key[0]}@{self.key[1][:12]}"
        if not self.sources:
            return f"{self.host}: fetches {what} from the origin (step {self.step})"
        rest = "".join(f", then {s}" for s in self.sources[1:])
        return f"{self.host}: copies {what} from {self.sources[0]}{rest}, then the origin (step {self.step})"


@dataclass
class FanOut:
    copies: dict = field(default_factory=dict)  # {host: Copy}, for hosts that need weights

    def steps(self, hosts: list[str]) -> list[list[str]]:
        """`hosts` (one batch) in the order they may be deployed: step by step, a host without a
        copy to make in the first step."""
        step = {h: self.copies[h].step if h in self.copies else 0 for h in hosts}
        return [s for s in ([h for h in hosts if step[h] == k] for k in range(max(step.values(), default=0) + 1)) if s]

    def lines(self) -> list[str]:
        return [c.line() for c in self.copies.values()]

    def seed_from(self, host: str, address: Mapping, wait: int = SOURCE_STALL, start: int | None = None) -> list | None:
        """The host's `weights_seed_from`: its sources as peers reach them (None: from the origin),
        each waited for while it is still fetching (at most `wait` s without progress; with
        `start`, at most that long for its directory to appear at all)."""
        c = self.copies.get(host)
        if c is None or not c.sources:
            return None
        extra = {"start": start} if start is not None else {}
        return [{"host": address.get(s) or s, "wait": wait, **extra} for s in c.sources]


def decide(batches: list[list[str]], wants: Mapping, holders: Mapping, spare: int = SPARE_SOURCES) -> FanOut:
    """Who copies from whom. `batches`: the hosts of this run in deploy order (a batch is deployed
    after the one before it); `wants`: {host: key} for the hosts that take part (a host absent or
    None fetches as it would alone); `holders`: {host: set of keys} verified complete now (hosts
    outside the run may hold and seed too). Assumes every copy succeeds: the rollout decides again
    before each step with the holders it really has."""
    have: dict = {}  # key -> holders, in order: first the run's hosts, then the others
    run_order = [h for b in batches for h in b]
    for h in run_order + sorted(set(holders) - set(run_order)):
        for k in sorted(holders.get(h) or ()):
            have.setdefault(k, []).append(h)
    out = FanOut()
    for batch in batches:
        needy: dict = {}
        for h in batch:
            k = wants.get(h)
            if k is not None and h not in have.get(k, []):
                needy.setdefault(k, []).append(h)
        for k, hosts in needy.items():
            sources = have.setdefault(k, [])
            step = 0
            if not sources:  # nobody holds it: the first host (the canary, in a rollout) fetches it
                first = hosts.pop(0)
                out.copies[first] = Copy(first, k, 0)
                sources.append(first)
                step = 1
            while hosts:
                now = list(sources)  # holders at the start of this step (all verified by then)
                for i, src in enumerate(now):
                    if not hosts:
                        break
                    h = hosts.pop(0)
                    others = [s for s in now[i + 1:] + now[:i]][:spare]
                    out.copies[h] = Copy(h, k, step, (src, *others))
                    sources.append(h)
                step += 1
    return out


def wanted(sp) -> Key | None:
    """The (repo, revision) a host (its spec.HostSpec) takes part in the fan-out with, or None when
    it does not: its settings do not parse, it is a member of a multi-node serving group (its
    members fetch as they would alone), names its own peers (`weights_seed_from`), turned it off
    (`weights_fanout: false`), or the fleet seed key (private and public) is not configured."""
    s = sp.settings
    if s is None or not s.weights_fanout or s.weights_seed_from is not None or s.serving_group:
        return None
    if not (sp.secrets.get("weights_seed_key") and sp.secrets.get("weights_seed_public_key")):
        return None
    return (s.model.repo, s.model.revision)


# The host of a converge that would fetch a model from the origin first asks this many other hosts
# of the run that want it whether they already hold a verified copy (their completion marker, one
# listing each, no waiting), and copies from the first that does: a host added to a serving fleet
# ahead of the others in the inventory copies instead of fetching.
HELD_PROBES = 3


@dataclass(frozen=True)
class Run:
    """The fan-out of a plain converge of several hosts: the tree, how peers reach each host,
    and the hosts each origin fetcher asks first (`HELD_PROBES`)."""
    fan: FanOut
    address: Mapping
    probes: Mapping = field(default_factory=dict)  # {origin fetcher: hosts it asks first}

    def seed_from(self, host: str) -> list | None:
        c = self.fan.copies.get(host)
        if c is not None and not c.sources and self.probes.get(host):
            return [{"host": self.address.get(h) or h, "held": True} for h in self.probes[host]]
        return self.fan.seed_from(host, self.address, start=SOURCE_START)

    def lines(self, holders: Mapping) -> list[str]:
        """What each host that does not hold its model yet will do (`holders`: {host: set of keys}
        verified complete, from the facts), for `nemofleet plan`."""
        out = []
        for h, c in self.fan.copies.items():
            if c.key in (holders.get(h) or ()):
                continue
            held = [p for p in self.probes.get(h, ()) if c.key in (holders.get(p) or ())]
            out.append(Copy(h, c.key, c.step, (held[0],)).line() + " (it holds it now)"
                       if held else c.line())
        return out


def for_run(specs: Mapping) -> Run:
    """Who copies from whom in one converge of the hosts of `specs` ({host: HostSpec}, in the
    inventory's order), decided from their specs alone, so every host of the run decides the same
    tree without reading another host's facts (no extra remote command). The first host of the
    run that wants a (repo, revision) fetches it from the origin unless one of the next
    HELD_PROBES hosts holds it already; a host that holds it changes nothing and, named as a
    source, is copied from at once. Gateways serve no model. Each host's sources reach it as its
    `seed_from(host)`, which the gatherer sets as its weights_seed_from (never host data)."""
    wants, address = participants(specs)
    fan = decide([list(wants)], wants, {}) if len(wants) > 1 else FanOut()
    probes = {h: tuple(o for o in wants if o != h and wants[o] == c.key)[:HELD_PROBES]
              for h, c in fan.copies.items() if not c.sources}
    return Run(fan, address, probes)


def participants(specs: Mapping) -> tuple[dict, dict]:
    """({host: (repo, revision)} of the hosts of `specs` that take part (`wanted`), in its order;
    {host: where the other hosts reach it} for every host of `specs`), for a converge (for_run)
    and a rollout (fleet/rollout.py) alike."""
    return ({h: k for h, sp in specs.items() if not sp.gateway and (k := wanted(sp)) is not None},
            {h: sp.peer_address for h, sp in specs.items()})


def weights_dir(sp, key: Key) -> str | None:
    """Where a host (its HostSpec) keeps `key`'s weights (the plan's directory of the model)."""
    if sp.settings is None:
        return None
    return f"{sp.settings.models_root}/{catalog.host_dir_name(*key)}"


HELD_MARK = "nemofleet-holds "


def holders_script(dirs: Mapping) -> str:
    """A shell snippet printing `HELD_MARK <dir>` for each {dir: revision} whose completion marker
    names that revision (the weights check wrote it after verifying the files). No python start."""
    q = shell.quote
    return "".join(f"grep -qs {q(chr(34) + 'revision' + chr(34) + ': ' + chr(34) + rev + chr(34))} "
                   f"{q(d + '/.nemofleet-complete')} && echo {q(HELD_MARK + d)}\n"
                   for d, rev in sorted(dirs.items())) + "true\n"


def parse_holders(lines, dirs: Mapping) -> set:
    """The keys held, from holders_script's output; `dirs`: {dir: key}."""
    return {dirs[ln[len(HELD_MARK):]] for ln in lines if ln.startswith(HELD_MARK) and ln[len(HELD_MARK):] in dirs}
