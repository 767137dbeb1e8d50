"""Weights fan-out: who fetches a model from the origin and who copies it from whom.

A fleet decision, pure (no I/O): from the hosts of a run (in batch order), the (repo, revision)
each wants and the hosts that already hold a verified copy, one host per (repo, revision)
fetches from the origin (the Hub or its mirror) and every other copies from a host that already
holds it, in steps: in each step every holder seeds at most one host, so the holders double and
N hosts are served in about log2(N) steps. A copy names a few sources, tried in order, then the
origin; the receiving host verifies the copy itself (the weights check, commit included) before
it is marked complete, so a failed or slow source costs time, never a bad copy (docs/fanout.md).

The result reaches each host as its `weights_seed_from` (a list of peers), through the deploy's
host data; a host deployed alone decides nothing here and works as before.

Layer: decision (settings, models); imports nothing from fleet/.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Mapping

from . import models as catalog
from . import settings as settings_mod

Key = tuple  # (repo, revision)
SPARE_SOURCES = 2  # holders named after the first, tried in order before the origin
# A source of the same run may still be fetching: the copy waits for its verified marker while
# its directory grows, and moves on after this many seconds without progress (a failed source).
SOURCE_STALL = 600


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
        n = max([self.copies[h].step for h in hosts if h in self.copies] or [0])
        return [s for s in ([h for h in hosts if (self.copies[h].step if h in self.copies else 0) == k]
                            for k in range(n + 1)) if s]

    def lines(self) -> list[str]:
        return [c.line() for c in self.copies.values()]

    def seed_from(self, host: str, address: Mapping, wait: int = SOURCE_STALL) -> list | None:
        """The host's `weights_seed_from`: its sources as peers reach them (None: from the origin),
        each waited for while it is still fetching (at most `wait` s without progress)."""
        c = self.copies.get(host)
        if c is None or not c.sources:
            return None
        return [{"host": address.get(s) or s, "wait": wait} for s in c.sources]


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


def wanted(data: Mapping, secrets: Mapping) -> Key | None:
    """The (repo, revision) a host takes part in the fan-out with, or None when it does not: its
    settings do not parse, it names its own peers (`weights_seed_from`), turned it off
    (`weights_fanout: false`), or the fleet seed key (private and public) is not configured."""
    try:
        s = settings_mod.parse(dict(data))
        model = catalog.resolve(s["model"])
    except (settings_mod.SettingsError, catalog.UnknownModel):
        return None
    if not s["weights_fanout"] or s["weights_seed_from"] is not None:
        return None
    if not (secrets.get("weights_seed_key") and secrets.get("weights_seed_public_key")):
        return None
    return (model.repo, model.revision)


def weights_dir(data: Mapping, key: Key) -> str | None:
    """Where a host keeps `key`'s weights (the plan's directory of the model)."""
    try:
        root = settings_mod.parse(dict(data))["models_root"]
    except settings_mod.SettingsError:
        return None
    return f"{root}/{catalog.host_dir_name(*key)}"


HELD_MARK = "nemofleet-holds "


def holders_script(dirs: Mapping) -> str:
    """A shell snippet printing `HELD_MARK <dir>` for each {dir: revision} whose completion marker
    names that revision (the weights check wrote it after verifying the files). No python start."""
    q = shlex.quote
    return "".join(f"grep -qs {q(chr(34) + 'revision' + chr(34) + ': ' + chr(34) + rev + chr(34))} "
                   f"{q(d + '/.nemofleet-complete')} && echo {q(HELD_MARK + d)}\n"
                   for d, rev in sorted(dirs.items())) + "true\n"


def parse_holders(lines, dirs: Mapping) -> set:
    """The keys held, from holders_script's output; `dirs`: {dir: key}."""
    return {dirs[ln[len(HELD_MARK):]] for ln in lines if ln.startswith(HELD_MARK) and ln[len(HELD_MARK):] in dirs}
