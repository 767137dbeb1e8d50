"""The stages of deploys/nemotron.py: preflight, host configuration, weights, serving, health.

An applier with no decisions of its own: `desired.build()` decides everything from
(settings, facts, secrets); each stage here turns one part of that `Desired` into pyinfra
operations, and every operation yields nothing when the host already matches.
"""

from __future__ import annotations

import os
import time

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python, server, systemd

from . import bootstrap, paths
from . import settings as settings_mod
from .desired import SECRET_KEYS, Desired, build, to_resolve
from .facts.host import HostFacts
from .facts import prefetch
from .facts.weights import HubCommit
from .operations import daemon_json, docker, files, frontdoor, gpu_access, packages, preflight, units, weights


def data(of=None) -> dict:
    """host.data (or another host's) as a plain dict (pyinfra's HostData has no items())."""
    from pyinfra.api.host import extract_callable_datas

    h = of or host
    keys: set = set()
    for layer in extract_callable_datas(h.data.datas):
        keys.update(layer.keys())
    return {k: h.data.get(k) for k in keys}


def _host_facts(h, d: dict) -> dict:
    return h.get_fact(HostFacts, models_root=d.get("models_root") or settings_mod.BY_NAME["models_root"].default,
                      image=d.get("vllm_image") or settings_mod.DEFAULT_IMAGE)


def group_peers(d: dict) -> tuple[dict | None, dict | None]:
    """({member: HostFacts}, {member: host data}) of the other members of this host's multi-node
    serving group, each read over that member's own connection (multinode.py plans the group
    from every member's facts). A member outside this run is left out: the plan refuses."""
    members = d.get("serving_group_members")
    if not d.get("serving_group") or not isinstance(members, list):
        return None, None
    state = host.state
    peers, peer_data = {}, {}
    for name in members:
        if name == host.name or not isinstance(name, str):
            continue
        other = state.inventory.get_host(name, None)
        if other is None:
            peers[name] = {"absent": f"is not a host of this inventory"}
            continue
        if not state.is_host_in_limit(other):
            continue
        peer_data[name] = data(other)
        try:
            peers[name] = _host_facts(other, peer_data[name])
        except Exception as exc:  # an unreachable member refuses the group, never the run
            peers[name] = {"unreachable": str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__}
    return peers, peer_data


def read_secrets(d: dict) -> dict:
    """Secret values from host data or from their files on the controller (never logged)."""
    out = {}
    for name in SECRET_KEYS:
        value = d.get(name)
        path = d.get(f"{name}_file", settings_mod.BY_NAME[f"{name}_file"].default
                     if f"{name}_file" in settings_mod.BY_NAME else None)
        if not value and isinstance(path, str) and path:
            try:
                with open(os.path.expanduser(path)) as f:
                    value = f.read().strip()
            except OSError:
                value = None
        out[name] = value or None
    return out


def operator() -> str:
    return f"{os.environ.get('NEMOFLEET_OPERATOR') or os.environ.get('USER') or 'root'}@{os.uname().nodename}"


def desired() -> Desired:
    d = data()
    facts = _host_facts(host, d)
    # a revision that is not a commit is resolved once, from the host (no query when pinned)
    facts["commits"] = {(e, r, v): host.get_fact(HubCommit, endpoint=e, repo=r, revision=v)
                        for e, r, v in to_resolve(d)}
    peers, peer_data = group_peers(d)
    if peers is not None:
        # a worker checks, before anything changes, that the head answers on the rendezvous port
        # (an answer, even "refused" before the head runs, proves the route; silence is a firewall)
        from .facts.network import TcpReach
        from .multinode import head_probe

        try:
            target = head_probe(host.name, settings_mod.parse(d), {**peers, host.name: facts})
        except settings_mod.SettingsError:
            target = None  # refused with its sentences by preflight
        if target:
            facts["head_reach"] = {"target": f"{target[0]}:{target[1]}",
                                   "state": host.get_fact(TcpReach, address=target[0], port=target[1])}
    return build(host.name, d, facts, read_secrets(d), operator=operator(),
                 lock_token=os.environ.get("NEMOFLEET_LOCK_TOKEN"), now=time.time(), groups=host.groups,
                 peers=peers, peer_data=peer_data)


@deploy("nemofleet preflight")
def run_preflight() -> Desired:
    """Refuse a host that cannot serve (one sentence each) before anything changes."""
    want = desired()
    host.log(want.summary, logger.info)
    preflight.verdict(name="Preflight: can this host serve its plan?", refusals=want.refusals,
                      warnings=want.warnings)
    return want


@deploy("nemofleet host configuration")
def configure_host(want: Desired) -> set:
    """Returns the set of daemon.json keys this run changes (filled in as the op executes)."""
    daemon_changed: set = set()
    daemon_json.configured(name="Docker daemon.json (merged; reload or restart only when needed)",
                           desired=want.daemon_json, defaults=want.daemon_json_defaults, changed=daemon_changed)
    if want.host_files:
        host_changed: set = set()
        files.managed(name="Host files (Docker proxy drop-in, /dev/char udev rule)", files=want.host_files,
                      changed=host_changed)
        units.daemon_reload(name="Reload systemd for the Docker proxy",
                            _if=lambda: paths.DOCKER_PROXY in host_changed)
        systemd.service(name="Restart Docker for the proxy", service="docker", restarted=True,
                        _if=lambda: paths.DOCKER_PROXY in host_changed)
        server.shell(name="Create the /dev/char links now", commands=["nvidia-ctk system create-dev-char-symlinks --create-all"],
                     _if=lambda: paths.DEV_CHAR_RULE in host_changed)
    files.managed(name="Secrets (0600, root only)", files=want.secret_files, secret=True, dirs=want.secret_dirs)
    if want.authorized_key:
        files.authorized_key(name="Fleet seed key may read weights from this host (read-only rsync)",
                             path=paths.ROOT_AUTHORIZED_KEYS, line=want.authorized_key,
                             key=want.seed_public_key)
    if want.absent:
        files.absent(name="No stale HF token", paths=want.absent)
    if want.cdi_command:
        server.shell(name="Enable nvidia-cdi-refresh" if "refresh" in want.cdi_command else "Generate the CDI spec",
                     commands=[want.cdi_command])
    return daemon_changed


@deploy("nemofleet weights")
def fetch_weights(want: Desired) -> None:
    docker.image(name=f"Image {want.image}", ref=want.image, archive=want.image_archive)
    for d in want.downloads:
        weights.model(name=f"Weights {d.repo}@{d.revision[:12]}", repo=d.repo, revision=d.revision,
                      directory=d.directory, image=want.image, endpoint=d.endpoint, token_file=d.token_file,
                      full_verify=d.full_verify, seed=d.seed, link_from=d.link_from)


def probe_gpu_access(want: Desired, facts_record: str | None, force: bool | set = False) -> None:
    g = want.gpu_probe
    gpu_access.survives_daemon_reload(
        name="GPU access survives systemctl daemon-reload (probe)", image=g.image, gpu_args=g.gpu_args,
        signature=g.signature, remedy_hint=g.remedy_hint, force=force, recorded=facts_record)


@deploy("nemofleet serving")
def serve(want: Desired, daemon_changed: set | None = None) -> None:
    # before any unit (re)starts: a host that would lose its GPUs is failed here. Probed again
    # whenever this run rewrote daemon.json (e.g. repaired a drifted cgroup driver).
    probe_gpu_access(want, want.gpu_access_record, force=daemon_changed if daemon_changed is not None else False)
    if want.networks:
        docker.networks(name="Frontend networks", wanted=want.networks)
    if want.previous_release and want.previous_release != want.release_id:
        server.shell(name=f"Keep release {want.previous_release} for rollback", commands=[want.keep_previous_command])
    changed: set = set()
    if want.front_door:
        front_door(want)
    if want.drain_restarts:
        # one instance at a time, its unit file then its restart, so the others keep serving and a
        # run that stops half way leaves every unit file matching the container that runs it
        for path, unit, command in want.drain_restarts:
            files.managed(name=f"vLLM unit {unit}", files={path: want.units[path]}, changed=changed)
            units.daemon_reload(name=f"Reload systemd for {unit}", _if=lambda path=path: path in changed)
            server.shell(name=f"Restart {unit} through the front door (drain, restart, ready, back in)",
                         commands=[command], _if=lambda path=path: path in changed)
    else:
        files.managed(name="vLLM units", files=want.units, changed=changed)
        units.daemon_reload(name="Reload systemd for changed units", _if=lambda: bool(changed))
    # with a front door, running units were restarted above: here only starts, enables and removals
    running = units.running(name="vLLM instances enabled and running", units=want.unit_names, changed=changed,
                            deferred=set() if want.drain_restarts else None)
    if want.ready_command:
        server.shell(name="Wait until the (re)started instances are ready", commands=[want.ready_command],
                     _if=running.did_change)
    if want.attached:
        docker.attached(name="Instances on their frontend networks", containers=want.attached)
    record_changed: set = set()
    files.managed(name="Release record", files=want.release_files, dirs={paths.STATE_DIR: "0755"},
                  changed=record_changed)
    server.shell(name="Audit log", commands=[want.audit_command], _if=lambda: bool(record_changed))
    weights.pruned(name="Weights no release on this host uses", directories=want.prune)
    for line in want.frontend_lines:
        host.log(line, logger.info)


def front_door(want: Desired, label: str = "Front door", secret_dirs: dict | None = None) -> None:
    """HAProxy from the distribution: config checked with haproxy -c before it is live, reloaded
    (never restarted) only when its config or keys changed. The same steps set up a host's front
    door and the fleet gateway (nemofleet.gateway, label "Gateway")."""
    packages.installed(name=f"{label}: HAProxy (distribution package)", packages=["haproxy"])
    door_changed: set = set()
    if want.front_door_files:
        files.managed(name=f"{label}: drain script and HAProxy drop-in", files=want.front_door_files,
                      changed=door_changed)
    files.managed(name=f"{label}: API key patterns (0600)", files=want.front_door_secrets, secret=True,
                  changed=door_changed, **({"dirs": secret_dirs} if secret_dirs else {}))
    frontdoor.configured(name=f"{label}: HAProxy config (haproxy -c before it is live)",
                         path=paths.FRONT_DOOR_CFG, content=want.front_door_config, changed=door_changed,
                         **({"role": label.lower()} if label != "Front door" else {}))
    if paths.FRONT_DOOR_DROPIN in want.front_door_files:
        units.daemon_reload(name="Reload systemd for the HAProxy drop-in",
                            _if=lambda: paths.FRONT_DOOR_DROPIN in door_changed)
    started = units.enabled_and_active(name=f"{label}: HAProxy enabled and running", unit="haproxy.service")
    server.shell(name=f"{label}: reload HAProxy (connections in flight are kept)",
                 commands=["systemctl reload haproxy"],
                 _if=lambda: not started.did_change() and bool(door_changed - {paths.FRONT_DOOR_DROPIN, paths.DRAIN_SCRIPT}))


@deploy("nemofleet health")
def health(want: Desired) -> None:
    files.managed(name="Health check script and cron", files=want.health_files)
    if want.gpu_returns:  # only when the health script drained a GPU that reads healthy again
        server.shell(name="GPUs healthy again: their instances back in the front door", commands=want.gpu_returns)


def nemotron() -> None:
    """The main job: fresh GPU hosts to serving; a converged host changes nothing."""
    from .gateway import GROUP

    if GROUP in (host.groups or ()):  # no GPUs there: deploys/gateway.py configures it
        host.log(f"a host of group {GROUP}: deploys/gateway.py configures it; nothing to serve here", logger.info)
        return
    try:
        s = settings_mod.parse(data())
    except settings_mod.SettingsError:
        s = None  # refused with its sentences by preflight
    pending = bootstrap.install(s) if s is not None else False
    if pending:  # the driver/toolkit change first: preflight must see the host as it is then
        python.call(name="Preflight and converge on the freshly installed host", function=converge)
    elif pending is not None:
        converge()


def fact_reads(want: Desired) -> list[tuple]:
    """The facts the stages below read, with the arguments they read them with: read ahead in
    one remote command (facts/prefetch.py). Anything missing here is read by its operation."""
    from .facts.docker import DaemonJson
    from .facts.packages import AptPackages

    reads = [(DaemonJson, {"path": daemon_json.DAEMON_JSON}), docker.image_reads(want.image)]
    if want.authorized_key:
        reads.append(files.key_reads(paths.ROOT_AUTHORIZED_KEYS))
    reads += [files.reads(f, d) for f, d in ((want.host_files, None), (want.secret_files, want.secret_dirs),
                                             (want.units, None), (want.release_files, {paths.STATE_DIR: "0755"}),
                                             (want.health_files, None)) if f]
    if want.front_door:  # the front door's files and the units it writes one at a time
        reads += [files.reads(f) for f in (want.front_door_files, want.front_door_secrets)]
        reads += [frontdoor.reads(paths.FRONT_DOOR_CFG), (AptPackages, {"names": ("haproxy",)}),
                  units.running_reads(["haproxy.service"])]
    if want.drain_restarts:
        reads += [files.reads({path: want.units[path]}) for path, _, _ in want.drain_restarts]
    reads += [weights.model_reads(d.directory, d.revision, d.full_verify) for d in want.downloads]
    if want.networks:
        reads.append(docker.networks_reads(want.networks))
    reads.append(units.running_reads(want.unit_names))
    if want.attached:
        reads.append(docker.attached_reads(want.attached))
    return reads


def converge() -> None:
    want = run_preflight()
    if not want.ok:
        return
    prefetch.load(fact_reads(want))
    daemon_changed = configure_host(want)
    fetch_weights(want)
    serve(want, daemon_changed)
    health(want)


def gpu_probe_only() -> None:
    """Diagnose the NVML trap now: a test container must keep its GPU across daemon-reload."""
    want = run_preflight()
    if not want.ok:
        return
    docker.image(name=f"Image {want.image}", ref=want.image, archive=want.image_archive)
    probe_gpu_access(want, want.gpu_access_record, force=True)


def preflight_only() -> None:
    want = run_preflight()
    if want.ok:
        p = want.plan
        host.log(f"preflight passed: {len(p.instances)} instance(s) of {p.model.key} "
                 f"(TP {p.instances[0].tp}, {p.instances[0].memory.summary()})", logger.info)
