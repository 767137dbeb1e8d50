"""One input per host: everything a decision about a host may read, parsed once, at the edge.

`HostInputs` is built once per host and per run, and then only read:

    facts_args(data)    -> what to read the host's facts with (the image *after* the registry
                           rewrite, the models root), before any fact is read
    to_resolve(data)    -> the revisions that are not commits (asked from the host: HubCommit)
    make(...)           -> HostInputs: the settings parsed once, the revision pinned to the
                           commit the host resolved, the groups as the inventory lists them
                           (pyinfra's doubled @local groups folded), the lock, the peers of a
                           serving group, and the refusals found on the way (one sentence each)

`desired.decide(inputs)` is the one function that turns them into the whole desired state; the
deploy (deploy.py), `nemofleet plan` (cli.py), `nemofleet status` (fleet/status.py) and,
through the deploy, rollout, rollback and rebuild all build their HostInputs here, so the plan
shown, the plan applied and the status baseline cannot drift apart.

Layer: below `desired` and the planner, above settings/models/facts; no pyinfra import (the
deploy's constructor, `deploy.host_inputs()`, reads pyinfra's host and calls `make`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from . import factmodel
from . import models as catalog
from . import settings as settings_mod
from .lockinfo import lock_refusal
from .secret import Secret, parse_public_key

# Secrets the controller reads for the host (values, never paths).
SECRET_KEYS = ("vllm_api_key", "hf_token", "weights_seed_key", "weights_seed_public_key")

# Hosts of this inventory group are fleet gateways (deploys/gateway.py): they serve no model, so
# rollouts and status skip them, and the decision for them is the gateway's (desired._gateway).
GATEWAY_GROUP = "gateway"

# The GPU class groups of the inventory (group_data/gpu_<class>.py), as gpus.short_name() names them:
# from the GPU table (gpus.CLASS_GROUPS), not a fixed list here.
from .gpus import CLASS_GROUPS as GPU_CLASS_GROUPS  # noqa: E402


@dataclass(frozen=True)
class HostInputs:
    """What one host's decision reads; built by `make`, never changed after."""
    name: str
    data: Mapping  # host data, the model's revision pinned to the resolved commit
    settings: settings_mod.Settings | None  # None when the host data does not parse (see refusals)
    facts: factmodel.Facts  # typed at the edge (factmodel.parse): the decision reads attributes only
    secrets: Mapping = field(repr=False)
    groups: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()  # found at the edge: the host is refused before any decision
    warnings: tuple[str, ...] = ()
    operator: str = "root"
    now: float = 0.0
    # {member: Facts, or PeerMissing with its sentence} of the other members of its serving group
    peers: Mapping | None = None
    peer_data: Mapping | None = None  # {member: host data} of the same

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


def image_of(s) -> str:
    """The vLLM image after `image_registry_rewrite` (the name the host pulls)."""
    if s is None:
        return settings_mod.DEFAULT_IMAGE
    return settings_mod.rewrite_image(s.vllm_image, s.image_registry_rewrite)


def parse_or_none(data: dict) -> settings_mod.Settings | None:
    try:
        return settings_mod.parse(data)
    except settings_mod.SettingsError:
        return None


def facts_args(data: dict) -> dict:
    """The arguments HostFacts is read with: the models root and the image the host will really
    pull (after the registry rewrite), so the image check and the archive lookup see that name."""
    s = parse_or_none(data)
    root = s.models_root if s is not None else settings_mod.BY_NAME["models_root"].default
    return {"models_root": root, "image": image_of(s)}


def group_of(data) -> tuple[str | None, tuple[str, ...]]:
    """(serving group name, its members in rank order) as this host's data gives them, for the fleet
    layer's selection (which hosts deploy, lock and roll back together) before any decision: the
    name and the members only when both have their type (a string; a list of two or more host
    names), else (None, ()); the settings refuse a wrong value in one sentence, host by host."""
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


def with_seeds(data: Mapping, seeds) -> dict:
    """Host data with this run's fan-out sources as its `weights_seed_from` (docs/fanout.md); the
    data as it is when there are none."""
    return {**data, "weights_seed_from": seeds} if seeds else dict(data)


def to_resolve(data: dict) -> list[tuple[str, str, str]]:
    """(endpoint, repo, revision) of every revision this host's plan names that is not a 40-hex
    commit: the deploy and status ask the Hub (mirror) for each once, from the host (HubCommit),
    and the decision plans with the commit, so a release, its weights directory, a rollback and
    status's baseline name one snapshot."""
    s = parse_or_none(data)
    if s is None:
        return []
    try:
        model = catalog.resolve(s.model)
    except catalog.UnknownModel:
        return []
    endpoint = (s.hf_endpoint or "https://huggingface.co").rstrip("/")
    return [(endpoint, model.repo, model.revision)] if not catalog.is_commit(model.revision) else []


def unique_groups(name: str, groups) -> tuple[str, ...]:
    """The host's groups as the inventory lists them. pyinfra lists a connector host whose name
    is its own inventory name (`@local`) with every group twice (the connector's groups are
    extended with themselves): fold that back, so a repeat left over is a real double listing."""
    groups = [str(g) for g in (groups or ())]
    half = len(groups) // 2
    if name.startswith("@") and groups and len(groups) % 2 == 0 and groups[:half] == groups[half:]:
        groups = groups[:half]
    return tuple(groups)


def group_problems(groups, facts: factmodel.Facts) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the inventory groups a host is in. A misspelt class group
    (`gpu_h10`) would silently drop that class's group data; a host listed twice in one group,
    or in two class groups, has two definitions of which pyinfra keeps the last."""
    import difflib

    refusals, warnings = [], []
    groups = list(groups or ())
    for g in sorted({g for g in groups if groups.count(g) > 1}):
        refusals.append(f"this host is listed {groups.count(g)} times in group {g}: pyinfra keeps the last "
                        "definition's data; list it once")
    for g in sorted(set(groups)):
        if g.startswith("gpu_") and g not in GPU_CLASS_GROUPS:
            close = difflib.get_close_matches(g, GPU_CLASS_GROUPS, n=1, cutoff=0.8)
            if close:
                refusals.append(f"group {g} is not a GPU class (did you mean {close[0]}?): group_data/{close[0]}.py "
                                "does not apply to this host until the inventory names it right")
            else:
                warnings.append(f"group {g} is not a GPU class nemofleet knows ({', '.join(GPU_CLASS_GROUPS)}); "
                                f"only its own group_data/{g}.py applies")
    classes = sorted({g for g in groups if g in GPU_CLASS_GROUPS})
    if len(classes) > 1:
        refusals.append(f"this host is in {len(classes)} GPU class groups ({', '.join(classes)}): list it in one")
    gpus = facts.gpus.gpus
    if len(classes) == 1 and gpus:
        from .gpus import short_name

        have = sorted({short_name(g.name) for g in gpus})
        if f"gpu_{have[0].lower()}" != classes[0] or len(have) > 1:
            warnings.append(f"this host is in group {classes[0]} but its GPUs are {', '.join(have)}: "
                            f"group_data/{classes[0]}.py applies to it; move it to its class group")
    return refusals, warnings


class Secrets(dict):
    """{name: Secret | SshPublicKey | None} read for one host at the edge, and `problems`: one
    sentence per secret that is set but cannot be used (an unreadable or missing file, a value
    of the wrong form), naming the setting and never the value."""

    problems: tuple[str, ...] = ()

    def __getattr__(self, name: str):
        # secrets.vllm_api_key as well as secrets["vllm_api_key"]: a secret not set is None
        if name not in SECRET_KEYS:
            raise AttributeError(name)
        return self.get(name)


def _read_secret_file(name: str, path: str, explicit: bool) -> tuple[str | None, str | None]:
    """(text, problem) of a secret file on the controller. A default path that does not exist is
    no secret; a path the operator set that is missing, a directory, unreadable or not UTF-8 is
    named as such (never silently dropped, never misreported as "no key")."""
    full = os.path.expanduser(path)
    try:
        if not os.path.isfile(full):
            if not os.path.exists(full) and not explicit:
                return None, None
            what = "does not exist" if not os.path.exists(full) else "is not a regular file"
            return None, f"{name}_file {path} {what}; point it at the file that holds {name}"
        if os.path.getsize(full) > 65536:
            return None, f"{name}_file {path} is larger than 64 KiB; it must hold {name} alone"
        with open(full, "rb") as f:
            text = f.read().decode("utf-8").strip()
        return (text, None) if text else (None, f"{name}_file {path} is empty; it must hold {name}")
    except UnicodeDecodeError:
        return None, f"{name}_file {path} is not UTF-8 text"
    except OSError as exc:
        return None, (f"{name}_file {path} is unreadable ({exc.strerror or type(exc).__name__}); give the user "
                      "running nemofleet read access to it")


def read_secrets(data: dict) -> Secrets:
    """Secret values from host data or from their files on the controller, typed at the edge:
    each a `Secret` (never shown), the seed public key an `SshPublicKey` (one key of a known
    type), or None; `problems` names what is set and unusable."""
    out, problems = Secrets(), []
    data = data if isinstance(data, Mapping) else {}
    for name in SECRET_KEYS:
        value = data.get(name)
        key = settings_mod.BY_NAME.get(f"{name}_file")
        explicit = f"{name}_file" in data and data.get(f"{name}_file") is not None
        path = data.get(f"{name}_file", key.default if key is not None else None)
        origin = name
        if not (isinstance(value, str) and value) and isinstance(path, str) and path:
            # the path's own type first (one line, bounded): it is named in every sentence below
            why = settings_mod._check(key, path) if explicit and key is not None else None
            value, why = (None, why) if why else _read_secret_file(name, path, explicit)
            origin = f"{name}_file {path}"
            if why:
                problems.append(why)
                out[name] = None
                continue
        if not (isinstance(value, str) and value):
            out[name] = None
            continue
        if name == "weights_seed_public_key":
            parsed = parse_public_key(value)
            if isinstance(parsed, str):
                problems.append(f"{origin} {parsed}")
                parsed = None
            out[name] = parsed
            continue
        own = settings_mod.BY_NAME.get(name)
        why = settings_mod._check(own, value.strip() if name.endswith("_key") else value) if own else None
        if why:  # the sentence of a secret key never holds its value (settings._check)
            problems.append(why + (f" (read from {origin})" if origin != name else ""))
            out[name] = None
            continue
        out[name] = Secret(value.strip() if name.endswith("_key") else value)
    out.problems = tuple(problems)
    return out


def typed_secrets(secrets: Mapping | None) -> Secrets:
    """Secrets as the decision reads them: a mapping given by a caller (a test, a facts-file
    plan) is typed here like read_secrets' own values."""
    if isinstance(secrets, Secrets):
        return secrets
    out = Secrets()
    for name, value in (secrets or {}).items():
        if name == "weights_seed_public_key" and isinstance(value, str):
            parsed = parse_public_key(value)
            out[name] = parsed if not isinstance(parsed, str) else None
        else:
            out[name] = Secret(value) if isinstance(value, str) and value else value or None
    return out


def _pin_revision(data: dict, commits: Mapping, refusals: list, warnings: list) -> dict:
    """Host data with the model's revision replaced by the commit HubCommit resolved it to."""
    if not commits:
        return data
    spec = data.get("model") or settings_mod.BY_NAME["model"].default
    spec = {"catalog": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, Mapping) else spec
    if not isinstance(spec, dict):
        return data  # the settings parser refuses it with its sentence
    for (endpoint, repo, rev), answer in commits.items():
        if "sha" in answer:
            spec["revision"] = answer["sha"]
            warnings.append(f"revision {rev!r} of {repo} is {answer['sha'][:12]} on {endpoint} now; this run "
                            f"serves that commit (pin it in group data to skip the query)")
        else:
            refusals.append(f"could not resolve revision {rev!r} of {repo}: {answer['error']}; pin the model "
                            "revision to a 40-hex commit or fix hf_endpoint")
    return {**data, "model": spec}


def make(name: str, data: Mapping, facts: Mapping | factmodel.Facts, secrets: Mapping | None = None, *, groups=(),
         lock_token: str | None = None, now: float = 0.0, operator: str = "root",
         peers: Mapping | None = None, peer_data: Mapping | None = None, command_line=(),
         commits: Mapping | None = None) -> HostInputs:
    """The one constructor. `facts` is the host's HostFacts (parsed here into factmodel.Facts: a
    part not of its type refuses this host in one sentence); `commits` ({(endpoint, repo,
    revision): {"sha"} | {"error"}}) where a revision was resolved (HubCommit, asked from the
    host: a field of its own, never a key inside the facts); `lock_token`/`now`: the deploy
    lock this run may hold and the time (a lock in `facts` refuses a run without its token; pass
    facts without `lock` for a read-only plan); `groups`: the host's groups as pyinfra lists them;
    `peers`: {member: HostFacts} of the other members of its serving group, typed like this
    host's (a member whose facts do not parse refuses the group, naming it); `command_line`: the
    keys pyinfra's --data gave (a secret among them refuses the host)."""
    data = dict(data or {})
    commits = dict(commits) if isinstance(commits, Mapping) else {}
    typed, unreadable = factmodel.parse(facts)
    secrets = typed_secrets(secrets)
    groups = unique_groups(name, groups)
    refusals, warnings = group_problems(groups, typed)
    if not isinstance(name, str) or settings_mod.vt.text_problem(name) or not name.strip():
        # the name reaches unit comments, HAProxy configs and messages: one line, printable
        refusals.append(f"the inventory host name {name!r} has a control character (a newline...); rename it")
    refusals += secrets.problems
    # keys given with pyinfra's --data: a secret there is on a command line (ps, shell history)
    refusals += [why for why in map(settings_mod.command_line_secret, command_line) if why]
    refusals += [f"this host's facts hold a value nemofleet cannot use: {why}" for why in unreadable]
    locked = lock_refusal(typed.lock.info() if typed.lock is not None else None, lock_token, now)
    if locked:
        refusals.append(locked)
    for part, why in sorted(typed.errors.items()):
        refusals.append(f"could not read {part} on this host: {why}")
    data = _pin_revision(data, commits, refusals, warnings)
    try:
        s = settings_mod.parse(data)
    except settings_mod.SettingsError as exc:
        s = None
        refusals += exc.problems
    if s is not None and s.serving_group and commits:
        # the revision was a branch or tag, resolved by this member alone
        refusals.append(f"serving_group {s.serving_group}: pin the model revision to a 40-hex commit; "
                        "every member must load the same snapshot, and a branch is resolved by each member "
                        "on its own")
    peer_data = {m: v for m, v in (peer_data or {}).items() if m != name} if peer_data is not None else None
    typed_peers = ({m: factmodel.parse_peer(m, f) for m, f in peers.items() if m != name}
                   if peers is not None else None)
    return HostInputs(name=name, data=MappingProxyType(data), settings=s, facts=typed,
                      secrets=MappingProxyType(secrets), groups=groups, refusals=tuple(refusals),
                      warnings=tuple(warnings), operator=operator, now=now,
                      peers=MappingProxyType(typed_peers) if typed_peers is not None else None,
                      peer_data=MappingProxyType(peer_data) if peer_data is not None else None)
