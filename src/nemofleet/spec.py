"""The edge: each host's data and secrets, read once per run into a frozen `HostSpec`.

    read(name, data, groups, command_line) -> HostSpec   one host
    read_all(datas, groups, command_line)  -> {host: HostSpec}

This is the only module that parses host data (`settings.parse` has no other caller). It runs
after pyinfra has built the inventory (merged group data and `--data` exist only then): the
deploy reads every host of the run once per pyinfra state (deploy.run_specs), the fleet commands
right after loading the inventory (fleet.driver.host_specs). Everything after it reads the typed
spec: the fan-out (`fanout.for_run(specs)`), the facts' arguments, the revisions to resolve, and
the one gatherer (`inputs.gather`) that builds every command's HostInputs.

Secrets are typed first: the secret-bearing keys (the API key, the HF token, the seed keys) and
their files are read into `Secret` values before any check of the other settings runs, and a
sentence about a secret names its key and type, never its value (settings._check; every value
shown in a sentence goes through valuetypes.shown, which hides URL credentials).

Layer: edge (settings, secret, gpus); no pyinfra import.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Mapping

from . import models as catalog
from . import settings as settings_mod
from . import valuetypes as vt
from .gpus import CLASS_GROUPS as GPU_CLASS_GROUPS
from .secret import Secret, parse_public_key

# Secrets the controller reads for the host (values, never paths).
SECRET_KEYS = ("vllm_api_key", "hf_token", "weights_seed_key", "weights_seed_public_key")

# Hosts of this inventory group are fleet gateways (deploys/gateway.py): they serve no model, so
# rollouts and status skip them, and the decision for them is the gateway's (gateway.py).
GATEWAY_GROUP = "gateway"


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


@dataclass(frozen=True)
class HostSpec:
    """One host as its data says, typed once: `settings` is None when the data does not parse
    (its sentences are in `refusals`)."""
    name: str
    settings: settings_mod.Settings | None
    secrets: Secrets = field(default_factory=Secrets, repr=False)
    groups: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()  # from the data alone; the facts add theirs in inputs.gather
    warnings: tuple[str, ...] = ()
    peer_address: str = ""  # where the other hosts reach its sshd for a weights copy

    @property
    def gateway(self) -> bool:
        return GATEWAY_GROUP in self.groups

    @property
    def members(self) -> tuple[str, ...]:
        """Its serving group's members in rank order (the head first); () outside one."""
        s = self.settings
        return tuple(s.serving_group_members or ()) if s is not None and s.serving_group else ()


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


def read_secrets(data: Mapping) -> Secrets:
    """Secret values from host data or from their files on the controller, typed at the edge:
    each a `Secret` (never shown), the seed public key an `SshPublicKey` (one key of a known
    type), or None; `problems` names what is set and unusable, by key and type, never by value."""
    out, problems = Secrets(), []
    data = data if isinstance(data, Mapping) else {}
    for name in SECRET_KEYS:
        out[name] = None  # until a usable value is read
        value = data.get(name)
        key = settings_mod.BY_NAME.get(f"{name}_file")
        explicit = f"{name}_file" in data and data.get(f"{name}_file") is not None
        path = data.get(f"{name}_file", key.default if key is not None else None)
        origin = name
        if value is not None and not isinstance(value, str):  # named by its type alone
            problems.append(f"{name} must be a string, not {settings_mod.vt.kind(value)}")
            continue
        if not value and isinstance(path, str) and path:
            # the path's own type first (one line, bounded): it is named in every sentence below
            why = settings_mod._check(key, path) if explicit and key is not None else None
            value, why = (None, why) if why else _read_secret_file(name, path, explicit)
            origin = f"{name}_file {path}"
            if why:
                problems.append(why)
                continue
        if not value:
            continue
        if name == "weights_seed_public_key":
            parsed = parse_public_key(value)
            if isinstance(parsed, str):
                problems.append(f"{origin} {parsed}")
            else:
                out[name] = parsed
            continue
        own = settings_mod.BY_NAME.get(name)
        why = settings_mod._check(own, value.strip() if name.endswith("_key") else value) if own else None
        if why:  # the sentence of a secret key never holds its value (settings._check)
            problems.append(why + (f" (read from {origin})" if origin != name else ""))
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


def unique_groups(name: str, groups) -> tuple[str, ...]:
    """The host's groups as the inventory lists them. pyinfra lists a connector host whose name
    is its own inventory name (`@local`) with every group twice (the connector's groups are
    extended with themselves): fold that back, so a repeat left over is a real double listing."""
    groups = [str(g) for g in (groups or ())]
    half = len(groups) // 2
    if name.startswith("@") and groups and len(groups) % 2 == 0 and groups[:half] == groups[half:]:
        groups = groups[:half]
    return tuple(groups)


def group_problems(groups) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the inventory groups a host is in. A misspelt class group
    (`gpu_h10`) would silently drop that class's group data; a host listed twice in one group,
    or in two class groups, has two definitions of which pyinfra keeps the last."""
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
    return refusals, warnings


def gateway_loops(name: str, data: Mapping, s: settings_mod.Settings) -> list[str]:
    """A gateway backend that is the gateway's own endpoint (its inventory name or ssh_hostname, a
    loopback or any-address, at gateway_port): HAProxy would send each request back to itself."""
    own = {name, data.get("ssh_hostname"), s.gateway_address, "localhost", "0.0.0.0", "::", "::1"}
    return [f"gateway_backends entry {n} ({b.host}:{b.port}) is this gateway's own endpoint: every request would "
            "loop back to it; list the GPU hosts' front doors" for n, b in enumerate(s.gateway_backends, 1)
            if b.port == s.gateway_port and (b.host in own or b.host.startswith("127."))]


def peer_address(name: str, data: Mapping) -> str:
    """Where the other hosts reach `name`'s sshd for a copy: `weights_peer_address`, else the
    address the controller reaches it at (pyinfra's `ssh_hostname`, when it is a host name or
    address and not a loopback one), else the inventory name."""
    import re

    given = data.get("weights_peer_address")
    if isinstance(given, str) and given:
        return given
    ssh = data.get("ssh_hostname")
    if isinstance(ssh, str) and re.fullmatch(settings_mod.HOSTNAME, ssh) and not (
            ssh == "localhost" or ssh.startswith("127.") or ssh == "::1"):
        return ssh
    return name


def read(name: str, data: Mapping | None, groups=(), command_line=()) -> HostSpec:
    """One host's spec: secrets typed first, then the settings parsed once; `groups` as pyinfra
    lists them; `command_line`: what pyinfra's --data gave ({key: value}, or the keys): a secret
    among them, or a value holding URL credentials, refuses the host."""
    data = dict(data) if isinstance(data, Mapping) else {}
    secrets = read_secrets(data)
    groups = unique_groups(name, groups)
    refusals, warnings = group_problems(groups)
    refusals = vt.coded("inventory-group", refusals)
    if not isinstance(name, str) or settings_mod.vt.text_problem(name) or not name.strip():
        # the name reaches unit comments, HAProxy configs and messages: one line, printable
        refusals.append(f"the inventory host name {settings_mod.vt.shown(name)} has a control character "
                        "(a newline...); rename it")
    refusals += vt.coded("secret", secrets.problems)
    # keys given with pyinfra's --data: a secret there is on a command line (ps, shell history)
    given = command_line.items() if isinstance(command_line, Mapping) else ((k, None) for k in command_line)
    refusals += vt.coded("secret-on-command-line", [why for why in (settings_mod.command_line_secret(k, v) for k, v in given) if why])
    try:
        s = settings_mod.parse(data)  # the one caller of the settings parser
    except settings_mod.SettingsError as exc:
        s = None
        refusals += vt.coded("settings", [p for p in exc.problems if p not in secrets.problems])
    if s is not None and GATEWAY_GROUP in groups:
        refusals += vt.coded("settings", gateway_loops(name, data, s))
    return HostSpec(name=name, settings=s, secrets=secrets, groups=groups, refusals=tuple(refusals),
                    warnings=tuple(warnings), peer_address=peer_address(name, data))


def read_all(datas: Mapping, groups: Mapping | None = None, command_line=()) -> dict[str, HostSpec]:
    """{host: HostSpec} of every host of `datas` ({host: host data}, in inventory order)."""
    return {h: read(h, d, (groups or {}).get(h, ()), command_line) for h, d in datas.items()}


# ---------------------------------------------------------------- what a spec asks of the host


def image_of(s: settings_mod.Settings | None) -> str:
    """The vLLM image after `image_registry_rewrite` (the name the host pulls)."""
    if s is None:
        return settings_mod.DEFAULT_IMAGE
    return settings_mod.rewrite_image(s.vllm_image, s.image_registry_rewrite)


def facts_args(sp: HostSpec) -> dict:
    """The arguments HostFacts is read with: the models root and the image the host will really
    pull (after the registry rewrite), so the image check and the archive lookup see that name."""
    s = sp.settings
    root = s.models_root if s is not None else settings_mod.BY_NAME["models_root"].default
    return {"models_root": root, "image": image_of(s)}


def to_resolve(sp: HostSpec) -> list[tuple[str, str, str]]:
    """(endpoint, repo, revision) of every revision this host's plan names that is not a 40-hex
    commit: the deploy and status ask the Hub (mirror) for each once, from the host (HubCommit),
    and the decision plans with the commit, so a release, its weights directory, a rollback and
    status's baseline name one snapshot."""
    s = sp.settings
    if s is None:
        return []
    model = s.model
    endpoint = (s.hf_endpoint or "https://huggingface.co").rstrip("/")
    return [(endpoint, model.repo, model.revision)] if not catalog.is_commit(model.revision) else []
