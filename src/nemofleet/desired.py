"""The whole desired state of one host: a pure function of (settings, facts, secrets).

`build()` makes every decision of a run -- the preflight verdict, the serving plan, the
daemon.json keys nemofleet owns, every managed file (path, content, mode), the units, the GPU
access method and its probe signature, the release -- and does no I/O, so it is golden-tested
with exact strings (tests/unit/test_desired.py). `deploy.py` only turns a `Desired` into
pyinfra operations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from dataclasses import dataclass, field

from . import gateway, gpuhealth
from . import models as catalog
from . import paths, render, shell, versions
from . import preflight as checks
from . import settings as settings_mod
from . import hostcmd as fleet_commands
from . import multinode
from . import plan as host_plan
from .inputs import GATEWAY_GROUP, SECRET_KEYS, HostInputs, make  # noqa: F401
from .gpuaccess import effective_cgroup_driver
from .factmodel import Facts, ModelDir
from .plan_types import Plan, PlanError
from .secret import SshPublicKey, reveal
from . import valuetypes as vt
from .valuetypes import Refusal

if TYPE_CHECKING:
    from .bundle import Bundle

FileMap = dict  # {path: (content, mode)}



@dataclass
class Download:
    repo: str
    revision: str
    directory: str
    endpoint: str | None
    token_file: str | None
    full_verify: bool
    seed: dict | list | None  # one peer, or several tried in order (seed_sources)
    link_from: tuple[str, str] | None = None  # (directory, its commit) to hard-link from first


@dataclass
class GpuProbe:
    image: str
    gpu_args: list[str]
    signature: str
    remedy_hint: str


@dataclass(frozen=True)
class Desired:
    """Assembled once by decide() from its parts (host configuration, weights, serving, front door,
    health: each a pure function returning its fields); nothing assigns to it afterwards."""
    host: str
    summary: str
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    settings: settings_mod.Settings | None = None
    plan: Plan | None = None
    # the serving plan as far as it was made, also when the host is refused for something outside
    # it (no API key yet, a daemon.json to fix): `nemofleet plan`'s offline preview shows it; the
    # deploy applies `plan` alone, which is None while any refusal stands
    preview: Plan | None = None
    # host configuration
    daemon_json: dict = field(default_factory=dict)  # keys nemofleet owns
    daemon_json_defaults: dict = field(default_factory=dict)  # keys written only when absent
    host_files: FileMap = field(default_factory=dict)  # Docker proxy drop-in, /dev/char rule
    secret_files: FileMap = field(default_factory=dict)
    secret_dirs: dict = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)  # files that must not exist (a stale HF token)
    authorized_key: str | None = None  # the fleet seed key, restricted (see seed_authorized_key)
    seed_public_key: str | None = None  # that key alone: the line of authorized_keys that is ours
    cdi_command: str | None = None  # how this host gets a CDI spec, when it has none
    # weights
    image: str = ""
    image_archive: str | None = None
    bundle: "Bundle | None" = None  # the signed bundle the parts come from (deploy.run_preflight)
    downloads: list[Download] = field(default_factory=list)
    prune: list[str] = field(default_factory=list)  # weights directories no release here uses
    # serving
    gpu_probe: GpuProbe | None = None
    gpu_access_record: str | None = None  # the signature that last passed the probe on the host
    networks: dict = field(default_factory=dict)  # {network: create}
    units: FileMap = field(default_factory=dict)
    unit_names: list[str] = field(default_factory=list)
    attached: dict = field(default_factory=dict)  # {container: {network: alias}}
    ready_command: str | None = None
    release_id: str | None = None
    previous_release: str | None = None
    keep_previous_command: str | None = None
    release_files: FileMap = field(default_factory=dict)
    audit_command: str | None = None
    frontend_lines: list[str] = field(default_factory=list)
    # front door (HAProxy): its config (validated with haproxy -c on the host before it is live),
    # its keys file (0600), the drop-in and the drain script; changed instances restart through
    # nemofleet-drain one at a time instead of all at once
    front_door: bool = False
    front_door_config: str | None = None
    front_door_files: FileMap = field(default_factory=dict)
    front_door_secrets: FileMap = field(default_factory=dict)
    drain_restarts: list[tuple[str, str, str]] = field(default_factory=list)  # (unit path, unit, command)
    # health
    health_files: FileMap = field(default_factory=dict)
    # GPUs the health script drained that this plan serves on again: marker removed, instances back
    # in the front door (docs/gpu-health.md); empty on a converged host
    gpu_returns: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals and self.plan is not None


# ---------------------------------------------------------------------------- daemon.json


def docker_settings(s: settings_mod.Settings, p: Plan | None, facts: Facts) -> tuple[dict, dict]:
    """The daemon.json keys nemofleet owns on this host (None: remove the key), and those written
    only where the file lacks them: an operator's own log driver or log options are kept (and
    Docker is not restarted for them)."""
    desired: dict = {}
    defaults: dict = {}
    if facts.toolkit.runtime or facts.toolkit.version:
        desired["runtimes"] = {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}
    if s.docker_default_runtime:
        desired["default-runtime"] = s.docker_default_runtime
    # daemon.json holds JSON lists: the settings' tuples are written (and compared) as lists
    for listed, name in ((s.docker_registry_mirrors, "registry-mirrors"),
                         (s.docker_insecure_registries, "insecure-registries")):
        if listed is not None:
            desired[name] = list(listed) or None
    for key, value, name in (("docker_log_driver", s.docker_log_driver, "log-driver"),
                             ("docker_log_opts", s.docker_log_opts, "log-opts")):
        if value:  # the operator asked for it: owned; nemofleet's default: written where absent
            (defaults if value == settings_mod.BY_NAME[key].default else desired)[name] = value
    exec_opts = list(s.docker_exec_opts) if s.docker_exec_opts is not None else None
    if exec_opts is None and p is not None and p.docker_exec_opts:
        exec_opts = p.docker_exec_opts
    if exec_opts is not None:
        desired["exec-opts"] = exec_opts or None
    if p is not None and p.gpu_method == "cdi" and versions.major(facts.docker.server) < 28:
        desired["features"] = {"cdi": True}  # CDI is on by default from Docker 28.3 (docs/recipes.md)
    return desired, defaults


def gpu_access_signature(p: Plan, facts: Facts, daemon: dict) -> str:
    """What decides whether containers keep their GPUs once this run is done: the GPU method,
    Docker's cgroup driver, and the Docker, toolkit and driver versions (a run that rewrites
    other GPU keys of daemon.json forces the probe by itself)."""
    d = facts.docker
    # exec-opts None in `daemon` removes the key (Docker's default driver); absent leaves it
    exec_opts = (daemon["exec-opts"] or []) if "exec-opts" in daemon else None
    cgroup = effective_cgroup_driver(exec_opts, d.cgroup_driver, facts.cgroup)
    return json.dumps({"method": p.gpu_method, "cgroup_driver": cgroup, "docker": d.server,
                       "toolkit": facts.toolkit.version, "driver": facts.gpus.driver},
                      sort_keys=True)


def cdi_command(p: Plan, facts: Facts) -> str | None:
    tk = facts.toolkit
    if p.gpu_method != "cdi" or tk.cdi_specs:
        return None
    if versions.parse(tk.version) >= (1, 18):
        # CTK >= 1.18 keeps /var/run/cdi/nvidia.yaml current on driver/toolkit changes and at boot
        return "timeout 120 systemctl enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service"
    return "timeout 120 nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


# ---------------------------------------------------------------------------- files


def seed_authorized_key(public_key: SshPublicKey, models_root: str, networks=()) -> str:
    """The fleet seed key may only read the models root with rsync on this host: one compromised
    host must not be root on all. OpenSSH's `restrict` (no pty, no forwarding), `from=` the
    fleet's networks (weights_seed_networks, CIDR: sshd(8) AUTHORIZED_KEYS FILE FORMAT) and a
    forced command: rsync's own restricted wrapper, read-only, rooted at the models directory.
    The line is nemofleet's own: the key is the parsed type and blob (secret.parse_public_key),
    never the file's options, comment or a second line; models_root is a confined path
    (settings: no quote, space or system directory)."""
    where = f'from="{",".join(networks)}",' if networks else ""
    return f'restrict,{where}command="/usr/bin/rrsync -ro {models_root}" {public_key.line()} nemofleet-fleet-seed'


def secret_files(s: settings_mod.Settings, secrets: dict) -> tuple[FileMap, list[str]]:
    # the one place secret values are revealed: into 0600 files (secret.Secret)
    key = reveal(secrets["vllm_api_key"]) or ""  # present: decide() refuses a host without one
    out = {paths.VLLM_ENV: (render.env_file({"VLLM_API_KEY": key}), "0600"),
           paths.API_AUTH: (f"Authorization: Bearer {key}\n", "0600"),
           paths.HEALTH_CONF: (render.health_conf(s), "0600")}
    absent = []
    if secrets.get("hf_token"):
        out[paths.HF_ENV] = (render.env_file({"HF_TOKEN": reveal(secrets["hf_token"]) or ""}), "0600")
    else:
        absent.append(paths.HF_ENV)
    if secrets.get("weights_seed_key"):
        out[paths.SEED_KEY] = ((reveal(secrets["weights_seed_key"]) or "").strip() + "\n", "0600")
    return out, absent


def link_source(directory: str, revision: str, on_disk: Mapping[str, ModelDir]) -> tuple[str, str] | None:
    """A complete directory of the same repo to hard-link from before downloading `directory`
    (same commit under the old name: nothing to fetch; another commit: only the changed files)."""
    root, name = directory.rsplit("/", 1)
    if name in on_disk:
        return None
    repo = catalog.repo_of_dir(name)
    # names read from disk: only our own `<repo>` or `<repo>@<12 hex>` directories are link sources
    ours = set(shell.own_names(on_disk, rf"{re.escape(repo)}(?:@[0-9a-f]{{12}})?"))
    same = [(n, m) for n, m in sorted(on_disk.items()) if n in ours and m.complete]
    # the same commit under the old name first, then the newest-named per-commit directory
    best = sorted(same, key=lambda nm: (nm[1].revision != revision, "@" not in nm[0]))
    return (f"{root}/{best[0][0]}", best[0][1].revision or "") if best else None


def unused_weights(s: settings_mod.Settings, p: Plan, facts: Facts) -> list[str]:
    """Weights directories of this plan's repos that neither this release nor the one it replaces
    (kept for `nemofleet rollback`) uses: removed after the new release serves. Only directories
    of the same repos are touched; anything else under models_root is the operator's."""
    root, on_disk = s.models_root, facts.models
    keep = {d["dir"].rsplit("/", 1)[1] for d in p.downloads}
    previous = (facts.release or {}).get("model", "")  # "org/name@commit"
    if s.weights_keep_revisions > 1 and "@" in previous:
        repo, rev = previous.rsplit("@", 1)
        keep.add(catalog.host_dir_name(repo, rev))
    # names read from disk: only those of our own shape, `<org>--<name>@<12 hex>` of a repo of this
    # plan, are ever named in the prune's `rm -rf` (a directory called `$(...)` or `*` is not ours)
    ours = "|".join(re.escape(catalog.local_dir_name(d["repo"])) for d in p.downloads)
    names = shell.own_names(on_disk, rf"(?:{ours})@[0-9a-f]{{12}}") if ours else []
    return [f"{root}/{n}" for n in sorted(names) if n not in keep]


def seed_sources(s: settings_mod.Settings) -> dict | list | None:
    """weights_seed_from as the weights operation takes it: one peer (a mapping), or several
    (a list, tried in order: what the fleet fan-out hands a host, docs/fanout.md), each with the
    models root (rrsync on the peer serves paths below it) and the copy's bandwidth bound."""
    seed = s.weights_seed_from
    if not seed:
        return None
    extra = {"root": s.models_root}
    if s.weights_peer_bwlimit is not None:
        extra["bwlimit"] = str(s.weights_peer_bwlimit)
    # settings.SeedPeer, or a tuple of them tried in order
    peers = [{**x.as_dict(), **extra} for x in (seed if isinstance(seed, tuple) else (seed,))]
    return peers if isinstance(seed, tuple) else peers[0]


def api_instances(p: Plan) -> list:
    """The instances that serve an API (all but a serving group's headless workers)."""
    return [i for i in p.instances if not (i.group and not i.group.head)]


def ready_command(p: Plan, timeout: int) -> str | None:
    if not api_instances(p):
        return None  # a headless worker: its group is ready when the head is (the rollout gates on it)
    addr = render.probe_address(p)
    # wait_ready NAME URL SECONDS: every value is an argument, quoted once by shell.join
    fn = ("wait_ready() { end=$(( $(date +%s) + $3 )); "
          "until [ \"$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 \"$2\")\" = 200 ]; do "
          "if [ $(date +%s) -gt $end ]; then printf 'instance %s not ready after %ss:\\n' \"$1\" \"$3\" >&2; "
          "timeout 30 journalctl -u \"nemofleet-vllm-$1\" -n 20 --no-pager -o cat >&2; return 1; fi; sleep 2; done; }; ")
    return fn + " ".join(shell.join(["wait_ready", i.name, f"http://{addr}:{int(i.host_port)}/health", int(timeout)]) + ";"
                         for i in api_instances(p))


# ---------------------------------------------------------------------------- build


def _secret_refusals(secrets: Mapping) -> list[str]:
    # each secret's form was checked where it was read (spec.read_secrets); what is left to
    # decide is whether the host may serve without one
    if not secrets.get("vllm_api_key"):
        return [Refusal("no API key: set vllm_api_key or vllm_api_key_file (a file on the controller) "
                        "so /v1 is not open to anyone who can reach the port", "api-key")]
    return []


# Keys each member of a serving group may set on its own; every other key must be the same on all
# members (one model, one image, one set of flags: what the group runs is planned from them).
GROUP_LOCAL_KEYS = ("serving_group_interface", "expected_host_key", "install_nvidia_driver", "nvidia_driver_branch",
                    "install_container_toolkit", "weights_seed_from", "weights_peer_address", "vllm_image_archive",
                    "http_proxy", "https_proxy", "no_proxy")


def group_differences(s: settings_mod.Settings, peer_settings: Mapping) -> list[str]:
    """One sentence per member whose settings differ from this host's on a key the group shares
    (`peer_settings`: {member: Settings, or the sentence why it has none}, from their specs)."""
    out = []
    for member, other in sorted((peer_settings or {}).items()):
        if isinstance(other, str):
            out.append(f"serving group member {member} {other}")
            continue
        keys = [k.name for k in settings_mod.KEYS if k.name not in GROUP_LOCAL_KEYS and not k.secret
                and getattr(other, k.name) != getattr(s, k.name)]
        if keys:
            out.append(f"serving_group {s.serving_group}: {member} differs from this host in {', '.join(keys[:5])}"
                       f"{' ...' if len(keys) > 5 else ''}; a group runs one model with one set of flags, so set "
                       "these in the group's group data")
    return vt.coded("serving-group", out)


def build(host: str, data: dict, facts: dict, secrets: dict, operator: str = "root",
          lock_token: str | None = None, now: float = 0.0, groups=(), peers: dict | None = None,
          peer_data: dict | None = None, commits: dict | None = None) -> Desired:
    """`decide()` over the HostInputs of these raw inputs (inputs.make: the one constructor)."""
    return decide(make(host, data, facts, secrets, groups=groups, lock_token=lock_token, now=now,
                       operator=operator, peers=peers, peer_data=peer_data, commits=commits))


def decide(i: HostInputs) -> Desired:
    """Everything this run should make true on host `i.name`: the one decision, used by the
    deploy (and through it rollout, rollback and rebuild), `nemofleet plan` and `nemofleet status`.
    Never raises for bad input: a host that cannot serve comes back with `refusals` (one sentence
    each, with its code) and nothing else to apply."""
    if GATEWAY_GROUP in i.groups:  # the fleet gateway's own decision (gateway.py)
        return Desired(**gateway.decide(i, _secret_refusals(i.secrets)))
    facts, s = i.facts, i.settings
    head: dict[str, Any] = dict(host=i.name, summary=checks.summary(facts))
    refusals, warnings = list(i.refusals), list(i.warnings)
    if s is None or refusals:
        return Desired(**head, refusals=refusals, warnings=warnings)
    if s.serving_group:
        refusals += group_differences(s, i.peer_settings or {})
        if refusals:
            return Desired(**head, refusals=refusals, warnings=warnings, settings=s)
    p, refused, warned = _plan(i)
    refusals += refused
    warnings += warned
    owned, defaults, refused = host_configuration(s, p, facts)
    refusals += refused
    if p is not None:
        refusals += _secret_refusals(i.secrets)
        if front_door_wanted(s, p):
            refusals += front_door_refusals(s, p, facts)
    if refusals or p is None:
        return Desired(**head, refusals=refusals, warnings=warnings, settings=s, preview=p, daemon_json=owned,
                       daemon_json_defaults=defaults)
    secrets = dict(i.secrets)
    fields: dict[str, Any] = dict(daemon_json=owned, daemon_json_defaults=defaults, **host_files_part(s, p, facts, secrets))
    w, weights_warnings = weights(s, p, facts, secrets)
    serve = serving(s, p, facts, owned, i.operator)
    door = front_door(s, p, facts, secrets) if front_door_wanted(s, p) else {}
    door_warnings = door.pop("warnings", [])
    lines = serve.pop("frontend_lines") + door.pop("frontend_lines", [])
    return Desired(**head, refusals=[], warnings=warnings + weights_warnings + door_warnings, settings=s,
                   preview=p, plan=p, **fields, **w, **serve, **door, frontend_lines=lines,
                   **health(s, p, facts, bool(door)))


def _plan(i: HostInputs) -> tuple[Plan | None, list[str], list[str]]:
    """The serving plan (plan.py) and the preflight checks over it (preflight.py), with their
    refusals and warnings."""
    s, facts = i.settings, i.facts
    assert s is not None
    why = checks.host_refusal(facts)
    if why:
        return None, [why], []
    try:
        p = for_host(i.name, facts, s, i.group_facts)
    except PlanError as exc:
        return None, [Refusal(str(exc), "plan")], []
    refused, warned = checks.after_plan(facts, s, p)
    return p, refused, list(p.warnings) + warned


def for_host(host: str, facts: Facts, s: settings_mod.Settings, group_facts: dict | None = None) -> Plan:
    """The plan for a host from its Facts and Settings: a single host's (plan.make_plan) or a serving
    group member's (multinode.make_group_plan); `group_facts`: {member: Facts | PeerMissing} of its
    whole serving group (this host included) when it is in one. Raises PlanError."""
    docker, tk = facts.docker, facts.toolkit
    make = multinode.make_group_plan if s.serving_group else host_plan.make_plan
    kw = {"peers": group_facts} if s.serving_group else {}
    gpus = host_plan.gpus_from_facts(facts.gpus.gpus)
    try:
        return make(
            host, gpus, s,
            # a CDI spec exists, or the toolkit can generate one (the host configuration does)
            docker_version=docker.server,
            cdi_available=bool(tk.cdi_specs) or versions.parse(tk.version) >= versions.MIN_TOOLKIT,
            cgroup_version=facts.cgroup, cgroup_driver=docker.cgroup_driver,
            local_meta=checkpoint_meta(facts, s), health=facts.health, **kw,
        )
    except PlanError as exc:
        # a refusal counts whole GPUs only: name the ones MIG kept out, or "3x A100" on a 4-GPU
        # host reads as a wrong fact (the MIG warning goes with the plan that was not made)
        mig = [g for g in gpus if g.mig == "Enabled"]
        text = str(exc)
        if mig and "MIG" not in text:
            which = ", ".join(str(g.index) for g in mig)
            raise PlanError(
                f"{text} (GPU {which} {'has' if len(mig) == 1 else 'have'} MIG enabled and {'is' if len(mig) == 1 else 'are'} "
                f"not counted: vLLM needs whole GPUs; nvidia-smi -i {mig[0].index} -mig 0 and a GPU reset give "
                f"{'it' if len(mig) == 1 else 'them'} back)") from None
        raise


def checkpoint_meta(facts: Facts, s: settings_mod.Settings) -> ModelDir | None:
    """What the checkpoint on the host says of itself (config.json, index), for this commit's
    directory or, before it exists, any directory of the same repo."""
    models = facts.models
    model = s.model
    same = models.get(catalog.host_dir_name(model.repo, model.revision))
    if same:
        return same
    repo = catalog.local_dir_name(model.repo)
    return next((meta for name, meta in sorted(models.items()) if name.split("@", 1)[0] == repo), None)


def host_configuration(s: settings_mod.Settings, p: Plan | None, facts: Facts) -> tuple[dict, dict, list[str]]:
    """daemon.json's keys (those nemofleet owns, those written only when absent) and why they
    cannot be written here."""
    owned, defaults = docker_settings(s, p, facts)
    refusals: list[str] = []
    try:
        from .dockerconf import DaemonJsonError, validate_settings
        validate_settings({**defaults, **owned})
    except DaemonJsonError as exc:
        refusals.append(Refusal(str(exc), "daemon-json"))
    runtime = owned.get("default-runtime")
    known = {"runc", "io.containerd.runc.v2", *(owned.get("runtimes") or {}),
             *((facts.daemon_json.data or {}).get("runtimes") or {})}
    if runtime and runtime not in known:
        refusals.append(Refusal(f"docker_default_runtime {runtime!r} is not a runtime dockerd knows here "
                                f"({', '.join(sorted(known))}): dockerd would refuse to start", "daemon-json"))
    if facts.daemon_json.data is None:
        refusals.append(Refusal(f"/etc/docker/daemon.json is {facts.daemon_json.error}; nemofleet leaves it "
                                "untouched: fix or remove it, then re-run", "daemon-json"))
    return owned, defaults, refusals


def host_files_part(s: settings_mod.Settings, p: Plan, facts: Facts, secrets: dict) -> dict[str, Any]:
    """The host's own files: Docker's proxy drop-in and the /dev/char rule, the 0600 secrets, the
    fleet seed key's authorized_keys line, how it gets a CDI spec."""
    files: FileMap = {}
    proxy = render.docker_proxy(s)
    if proxy:
        files[paths.DOCKER_PROXY] = (proxy, "0600")  # a proxy URL may carry credentials
    if facts.toolkit.version and s.nvidia_dev_char_rule:
        files[paths.DEV_CHAR_RULE] = (render.DEV_CHAR_RULE_TEXT, "0644")  # some runc versions need the links
    secret, absent = secret_files(s, secrets)
    out = dict(host_files=files, secret_files=secret, absent=absent, secret_dirs={paths.ETC: "0700"},
               cdi_command=cdi_command(p, facts))
    if secrets.get("weights_seed_key") and secrets.get("weights_seed_public_key"):
        out.update(seed_public_key=secrets["weights_seed_public_key"].line(),
                   authorized_key=seed_authorized_key(secrets["weights_seed_public_key"], s.models_root,
                                                      s.weights_seed_networks))
    return out


def weights(s: settings_mod.Settings, p: Plan, facts: Facts, secrets: dict) -> tuple[dict[str, Any], list[str]]:
    """The image and the weights this plan needs (and where they come from), and the weights
    directories no release here uses any more."""
    seed = seed_sources(s)  # every download's sources are the same
    wanted = [Download(repo=d["repo"], revision=d["revision"], directory=d["dir"], endpoint=p.env.get("HF_ENDPOINT"),
                       token_file=paths.HF_ENV if secrets.get("hf_token") else None,
                       full_verify=s.weights_verify == "full", seed=seed,
                       link_from=link_source(d["dir"], d["revision"], facts.models))
              for d in p.downloads]
    warnings = []
    if seed and any(not (m := facts.models.get(x.directory.rsplit("/", 1)[-1])) or not m.complete for x in wanted):
        seeds = seed if isinstance(seed, list) else [seed]
        peers = [x["host"] for x in seeds]
        if all(x.get("held") for x in seeds):  # a converge's origin fetcher asks the others first
            warnings.append(f"weights: copied from the first of {', '.join(peers)} that holds a verified copy "
                            "now (rsync over SSH, verified here), else fetched from the mirror")
        else:
            warnings.append(f"weights: copied from {', then '.join(peers)} (rsync over SSH, verified here), "
                            "then the mirror if no peer has them")
    return dict(image=p.image, image_archive=s.vllm_image_archive or s.vllm_image_archives.get(p.image),
                downloads=wanted, prune=unused_weights(s, p, facts)), warnings


def serving(s: settings_mod.Settings, p: Plan, facts: Facts, daemon: dict, operator: str) -> dict[str, Any]:
    """The GPU access probe, the frontend networks, the units, the release record and its audit line."""
    hint = ("use CDI (Docker >= 25 and a CDI spec; nvml_remedy: cdi) or set nvml_remedy: cgroupfs"
            if p.gpu_method == "gpus" else "check the CDI spec (nvidia-ctk cdi list) and the toolkit")
    # with a front door, frontends reach it and the instances join no frontend network
    frontends = [] if front_door_wanted(s, p) or p.instances[0].group else s.frontends
    docker_major = versions.major(facts.docker.server)
    single = len(p.instances) == 1
    attached = {i.name: dict(render.frontend_networks(frontends, i, single)) for i in p.instances} if frontends else {}
    release_id, previous = render.release_id(p), (facts.release or {}).get("id")
    return dict(
        gpu_probe=GpuProbe(p.image, render.gpu_args(p.gpu_method, p.instances[0].gpu_uuids[:1]),
                           gpu_access_signature(p, facts, daemon), hint),
        gpu_access_record=facts.gpu_access, networks={f.network: f.create for f in s.frontends},
        units={paths.unit_path(i.name): (render.unit(p, i, frontends, docker_major, s.start_timeout), "0644")
               for i in p.instances},
        unit_names=[i.unit for i in p.instances], attached=attached,
        ready_command=ready_command(p, s.ready_timeout) if s.wait_ready else None,
        release_id=release_id, previous_release=previous, keep_previous_command=fleet_commands.keep_previous(),
        release_files={paths.RELEASE: (render.release_record(p), "0644")},
        # the deploy's release-change line, through the fleet's one audit writer
        audit_command=fleet_commands.audit_command(operator, "release", (
            f"{previous or 'none'} -> {release_id} ({p.image}, {p.model.repo}@{p.model.revision[:12]}, "
            f"{len(p.instances)} instance(s))")),
        frontend_lines=[f"frontend {fe.name or fe.network}: base URL http://{attached[i.name][fe.network]}:8000/v1 "
                        f"model {p.served_name}" for fe in frontends for i in p.instances])


def health(s: settings_mod.Settings, p: Plan, facts: Facts, front_door: bool) -> dict[str, Any]:
    """The health program, its config and cron line, and the GPUs it drained that serve again."""
    return dict(health_files={paths.HEALTH_SCRIPT: (render.health_program(), "0755"),
                              paths.HEALTH_CONFIG: (render.health_config(p, s, front_door), "0644"),
                              paths.HEALTH_CRON: (render.health_cron(s), "0644")},
                gpu_returns=fleet_commands.gpu_returns(gpuhealth.returning(p.instances, facts.health), front_door))


def front_door_wanted(s: settings_mod.Settings, p: Plan) -> bool:
    """front_door: true/false, or none: on when the host runs more than one instance. A serving
    group's head runs on the host's network, so its frontends reach it through the front door
    (on when it has frontends); a headless worker has no API to put one in front of."""
    if not api_instances(p):
        return False
    if p.instances[0].group:
        return s.front_door if s.front_door is not None else bool(s.frontends)
    return s.front_door if s.front_door is not None else len(p.instances) > 1


def front_door_refusals(s: settings_mod.Settings, p: Plan, facts: Facts) -> list[str]:
    port, addr = s.front_door_port, s.front_door_address
    out = []
    if port in {i.host_port for i in p.instances}:
        out.append(f"front_door_port {port} is the port of an instance ({p.instances[0].host_port}-"
                   f"{p.instances[-1].host_port} are taken): choose another")
    have = {a for addrs in facts.addresses.values() for a in addrs}
    if addr and have and addr not in have | {"0.0.0.0", "::"}:
        out.append(f"front_door_address {addr} is not an address of this host ({', '.join(sorted(have))}): "
                   "HAProxy could not listen on it")
    return vt.coded("front-door", out)


def front_door(s: settings_mod.Settings, p: Plan, facts: Facts, secrets: dict) -> dict[str, Any]:
    """The front door's config, drop-in, drain script and keys file, the drain restarts, and what
    frontends are told."""
    # Docker's default bridge gateway (docker0's first IPv4 address): what host-gateway resolves to in containers
    bridge = next((a for a in facts.addresses.get("docker0", ()) if ":" not in a), None)
    where = s.front_door_address or bridge
    warnings = []
    if s.frontends and not where:
        warnings.append("the front door listens on 127.0.0.1 only: this host has no Docker bridge (docker0) "
                        "and no front_door_address, so frontend containers cannot reach it")
    return dict(
        front_door=True, front_door_config=render.front_door_config(p, s, bridge),
        front_door_files={paths.FRONT_DOOR_DROPIN: (render.FRONT_DOOR_DROPIN_TEXT, "0644"),
                          paths.DRAIN_SCRIPT: (render.drain_script(p, s), "0755")},
        front_door_secrets={paths.FRONT_DOOR_KEYS: (f"Bearer {reveal(secrets['vllm_api_key'])}\n", "0600")},
        # a running instance whose unit changed: drained, restarted, ready, back in (under the health
        # check's lock, so a self-heal never runs meanwhile); one not running is started by units.running.
        # A serving group's one instance cannot be drained to others, and must restart with the rest of
        # its group in the same step (units.running on every member): no drain restart for it
        drain_restarts=[] if p.instances[0].group else [
            (paths.unit_path(i.name), i.unit, shell.join(["systemctl", "is-active", "-q", i.unit]) + " || exit 0; "
             + shell.join(["flock", "-w", 900, paths.HEALTH_LOCK, paths.DRAIN_SCRIPT, "restart", i.name]))
            for i in p.instances],
        warnings=warnings,
        frontend_lines=[
            f"frontend {fe.name or fe.network}: base URL http://{render.url_host(where or '127.0.0.1')}:"
            f"{s.front_door_port}/v1 (the front door; or host.docker.internal with extra_hosts "
            f"host.docker.internal:host-gateway) model {p.served_name}; the instances do not join "
            f"{fe.network} while the front door is on (front_door: false attaches each instance to it instead, "
            "one endpoint per instance)" for fe in s.frontends])
