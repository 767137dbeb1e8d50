"""One input per host, built by one gatherer from the hosts' specs and facts.

    spec.read_all(datas, groups)                -> {host: HostSpec}   the edge: data and secrets, once
    gather(specs, facts, commits=..., seeds=...) -> {host: HostInputs} every command's inputs

`desired.decide(inputs)` is the one function that turns a HostInputs into the whole desired state;
the deploy (deploy.py), `nemofleet plan` (cli.py), `nemofleet status` (fleet/status.py) and, through
the deploy, rollout, rollback and rebuild all build their HostInputs with `gather`, so the plan
shown, the plan applied and the status baseline cannot drift apart. Nothing here parses host
data: the settings come typed in the spec; the revision a host resolved (HubCommit) and the
weights fan-out's sources of this run are pinned on them with `model_copy`, never written into
host data; a serving group's members' settings come from their own specs.

Layer: below `desired` and the planner, above spec/settings/facts; no pyinfra import.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from . import factmodel
from . import settings as settings_mod
from . import valuetypes as vt
from .gpus import CLASS_GROUPS as GPU_CLASS_GROUPS
from .lock.info import lock_refusal
from .spec import (GATEWAY_GROUP, SECRET_KEYS, HostSpec, Secrets, facts_args, image_of, read, read_secrets,  # noqa: F401
                   to_resolve, typed_secrets, unique_groups)


@dataclass(frozen=True)
class HostInputs:
    """What one host's decision reads; built by `make`, never changed after."""
    name: str
    # None when the host data does not parse (see refusals); the model's revision pinned to the
    # resolved commit and this run's fan-out sources set as weights_seed_from
    settings: settings_mod.Settings | None
    facts: factmodel.Facts  # typed at the edge (factmodel.parse): the decision reads attributes only
    secrets: Mapping = field(repr=False)
    groups: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()  # found at the edge: the host is refused before any decision
    warnings: tuple[str, ...] = ()
    operator: str = "root"
    now: float = 0.0
    # {member: Facts, or PeerMissing with its sentence} of the other members of its serving group
    peers: Mapping | None = None
    # {member: Settings, or the sentence why it has none} of the same, from their specs
    peer_settings: Mapping | None = None

    @property
    def image(self) -> str:
        """The image the host pulls and runs: the registry rewrite applied."""
        return image_of(self.settings)

    @property
    def group_facts(self) -> dict | None:
        """{member: Facts | PeerMissing} of the whole serving group, this host included (None outside one)."""
        if self.settings is None or not self.settings.serving_group:
            return None
        return {**(self.peers or {}), self.name: self.facts}


def group_of(data) -> tuple[str | None, tuple[str, ...]]:
    """(serving group name, its members in rank order) as this host's raw data gives them, for the
    fleet layer's selection (which hosts deploy, lock and roll back together) before any spec is
    read: the name and the members only when both have their type, else (None, ())."""
    if not isinstance(data, Mapping):
        return None, ()
    name, members = data.get("serving_group"), data.get("serving_group_members")
    if not (isinstance(name, str) and name and isinstance(members, (list, tuple)) and len(members) > 1
            and all(isinstance(m, str) and m and not settings_mod.vt.text_problem(m) for m in members)):
        return None, ()
    return name, tuple(members)


def ssh_target(data, host: str) -> tuple[str, int, str]:
    """(address, port, known_hosts file) pyinfra's SSH connector uses for this host, with the
    connector's own defaults (the name, 22, ~/.ssh/known_hosts) where the data gives none or a value
    of the wrong type (the connection itself then names what is wrong)."""
    data = data if isinstance(data, Mapping) else {}
    name = data.get("ssh_hostname")
    port = data.get("ssh_port")
    known = data.get("ssh_known_hosts_file")
    return (name if isinstance(name, str) and name and not settings_mod.vt.text_problem(name) else host,
            port if settings_mod.vt.is_int(port) and 1 <= port <= 65535 else 22,
            os.path.expanduser(known if isinstance(known, str) and known else "~/.ssh/known_hosts"))


def class_warning(groups, facts: factmodel.Facts) -> list[str]:
    """A host in one GPU class group whose GPUs are of another class: that group's data applies."""
    classes = sorted({g for g in groups if g in GPU_CLASS_GROUPS})
    gpus = facts.gpus.gpus
    if len(classes) != 1 or not gpus:
        return []
    from .gpus import short_name

    have = sorted({short_name(g.name) for g in gpus})
    if f"gpu_{have[0].lower()}" != classes[0] or len(have) > 1:
        return [f"this host is in group {classes[0]} but its GPUs are {', '.join(have)}: "
                f"group_data/{classes[0]}.py applies to it; move it to its class group"]
    return []


def _pinned(s: settings_mod.Settings, commits: Mapping, refusals: list, warnings: list) -> settings_mod.Settings:
    """The settings with the model's revision replaced by the commit HubCommit resolved it to."""
    model = s.model
    for (endpoint, repo, rev), answer in commits.items():
        if isinstance(answer, Mapping) and "sha" in answer:
            model = dataclasses.replace(model, revision=answer["sha"])
            warnings.append(f"revision {rev!r} of {repo} is {answer['sha'][:12]} on {endpoint} now; this run "
                            f"serves that commit (pin it in group data to skip the query)")
        else:
            why = answer.get("error") if isinstance(answer, Mapping) else None
            refusals.append(vt.Refusal(f"could not resolve revision {rev!r} of {repo}: {why or 'no answer'}; pin the model "
                            "revision to a 40-hex commit or fix hf_endpoint", "revision"))
    return s.model_copy(update={"model": model})


def gather(specs: Mapping[str, HostSpec], facts: Mapping, *, hosts=None, commits: Mapping | None = None,
           seeds: Mapping | None = None, lock_token: str | None = None, now: float = 0.0,
           operator: str = "root") -> dict[str, HostInputs]:
    """The one gatherer: {host: HostInputs} of `hosts` (default: every spec with facts).

    `specs`: {host: HostSpec} of the run (serving group members' settings come from theirs);
    `facts`: {host: HostFacts, factmodel.Facts or factmodel.PeerMissing} (a member without an entry
    is outside this run, which refuses its group: "deploy every member together"); `commits`: {host: {(endpoint, repo, revision): {"sha"} | {"error"}}} where a
    revision was resolved (asked from the host, HubCommit: never a key inside the facts);
    `seeds`: {host: weights_seed_from} of this run's fan-out; `lock_token`/`now`: the deploy lock
    this run may hold and the time (a lock in the facts refuses a run without its token)."""
    out = {}
    for name in (hosts if hosts is not None else [h for h in specs if h in facts]):
        sp = specs[name]
        s = sp.settings
        members = [m for m in sp.members if m != name]
        # a member without an entry is outside this run (the plan says so: deploy the group together)
        peers = {m: factmodel.parse_peer(m, facts[m]) for m in members if m in facts} if sp.members else None
        peer_settings = ({m: (specs[m].settings or "has bad settings ("
                              + "; ".join(specs[m].refusals)[:200] + ")") if m in specs else None
                          for m in members if m in specs} if sp.members else None)
        out[name] = of(sp, facts.get(name) or {}, lock_token=lock_token, now=now, operator=operator, peers=peers,
                       peer_settings=peer_settings, commits=(commits or {}).get(name),
                       seeds=(seeds or {}).get(name) if s is not None else None)
    return out


def of(sp: HostSpec, facts, *, lock_token: str | None = None, now: float = 0.0, operator: str = "root",
       peers: Mapping | None = None, peer_settings: Mapping | None = None, commits: Mapping | None = None,
       seeds=None) -> HostInputs:
    """One host's HostInputs from its spec and its facts (typed here: a part not of its type refuses
    this host in one sentence); `gather` calls it for every host of a command."""
    commits = dict(commits) if isinstance(commits, Mapping) else {}
    typed, unreadable = factmodel.parse(facts)
    refusals, warnings = list(sp.refusals), list(sp.warnings) + class_warning(sp.groups, typed)
    refusals += vt.coded("facts", [f"this host's facts hold a value nemofleet cannot use: {why}" for why in unreadable])
    locked = lock_refusal(typed.lock.info() if typed.lock is not None else None, lock_token, now)
    if locked:
        refusals.append(vt.Refusal(locked, "locked"))
    for part, why in sorted(typed.errors.items()):
        refusals.append(vt.Refusal(f"could not read {part} on this host: {why}", "facts"))
    s = sp.settings
    if s is not None and commits:
        s = _pinned(s, commits, refusals, warnings)
        if s.serving_group:  # the revision was a branch or tag, resolved by this member alone
            refusals.append(f"serving_group {s.serving_group}: pin the model revision to a 40-hex commit; "
                            "every member must load the same snapshot, and a branch is resolved by each member "
                            "on its own")
    if s is not None and seeds:  # this run's fan-out sources (fanout.Run.seed_from) as weights_seed_from
        s = s.model_copy(update={"weights_seed_from": tuple(settings_mod.SeedPeer(**p) for p in seeds)})
    return HostInputs(name=sp.name, settings=s, facts=typed, secrets=MappingProxyType(sp.secrets), groups=sp.groups,
                      refusals=tuple(refusals), warnings=tuple(warnings), operator=operator, now=now,
                      peers=MappingProxyType(dict(peers)) if peers is not None else None,
                      peer_settings=MappingProxyType(dict(peer_settings)) if peer_settings is not None else None)


def make(name: str, data: Mapping, facts, secrets: Mapping | None = None, *, groups=(),
         lock_token: str | None = None, now: float = 0.0, operator: str = "root",
         peers: Mapping | None = None, peer_data: Mapping | None = None, command_line=(),
         commits: Mapping | None = None) -> HostInputs:
    """A host's HostInputs from raw values in one call (tests and one-host callers): its spec read
    (`spec.read`; `secrets`, when given, in place of those the data names), its peers' specs from
    `peer_data`, then `gather`."""
    sp = read(name, data, groups, command_line)
    if secrets is not None:  # the caller's secrets (a Secrets read from the data keeps its problems)
        given = secrets if isinstance(secrets, Secrets) else typed_secrets(secrets)
        own = [r for r in sp.refusals if r not in sp.secrets.problems]
        sp = replace(sp, secrets=given, refusals=tuple(dict.fromkeys((*given.problems, *own))))
    specs = {name: sp, **{m: read(m, d) for m, d in (peer_data or {}).items() if m != name}}
    facts_of = {name: facts, **{m: f for m, f in (peers or {}).items() if m != name}}
    return gather(specs, facts_of, hosts=[name], commits={name: commits or {}}, lock_token=lock_token, now=now,
                  operator=operator)[name]
