"""The stages of deploys/nemotron.py: preflight, host configuration, weights, serving, health.

An applier with no decisions of its own: `desired.build()` decides everything from
(settings, facts, secrets); each stage here turns one part of that `Desired` into pyinfra
operations, and every operation yields nothing when the host already matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, TypeVar, cast

import os
import sys
import time
import weakref
from types import SimpleNamespace

from pyinfra import host, logger
from pyinfra.api import deploy as _pyinfra_deploy
from pyinfra.operations import python, server, systemd

from . import bootstrap, bundle, factmodel, fanout, inputs, inventory, paths, render, spec
from .lock import run as runlock
from .lock.info import operator
from .desired import Desired, decide
from .inputs import HostInputs
from .valuetypes import Refusal
from .facts.host import HostFacts, known_reads
from .facts import prefetch
from .facts.weights import HubCommit
from .operations import daemon_json, docker, files, frontdoor, gpu_access, packages, preflight, units, weights


_F = TypeVar("_F", bound=Callable[..., Any])


def stage(name: str) -> Callable[[_F], _F]:
    """pyinfra's @deploy, typed as what it is here: the function itself, run as a named stage."""
    return cast(Callable[[_F], _F], _pyinfra_deploy(name))


def data(of=None) -> dict:
    """host.data (or another host's) as a plain dict (pyinfra's HostData has no items())."""
    from pyinfra.api.host import extract_callable_datas

    h = of or host
    keys: set = set()
    for layer in extract_callable_datas(h.data.datas):
        keys.update(layer.keys())
    return {k: h.data.get(k) for k in keys}


def _host_facts(h, sp, own: bool = False) -> dict:
    """HostFacts of host `h` (its spec `sp`), read for the image it will really pull (after the
    registry rewrite). What the operations will ask for again (daemon.json, the image, a verified
    weights marker) is handed to the batched read of this run, which then does not read it twice
    (facts/prefetch.py)."""
    args = spec.facts_args(sp)
    facts = h.get_fact(HostFacts, **args)
    if own and isinstance(facts, dict):  # this host's (a serving group peer's are its own run's)
        prefetch.known(known_reads(facts, **args))
    return facts


def group_peers(sp) -> dict:
    """{member: HostFacts, or factmodel.PeerMissing with its sentence} of the other members of this
    host's multi-node serving group, each read over that member's own connection (multinode.py
    plans the group from every member's facts). A member outside this run is left out: the plan
    refuses."""
    state = host.state
    peers: dict = {}
    for name in sp.members:
        if name == host.name:
            continue
        other = state.inventory.get_host(name, None)
        if other is None:
            peers[name] = factmodel.PeerMissing(why="is not a host of this inventory")
            continue
        if not state.is_host_in_limit(other) or name not in run().specs:
            continue
        try:
            peers[name] = _host_facts(other, run().specs[name])
        except Exception as exc:  # an unreachable member refuses the group, never the run
            said = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            peers[name] = factmodel.PeerMissing(why=f"did not answer ({said})")
    return peers


class Run:
    """What one pyinfra run reads once for all its hosts: their specs (spec.read_all: host data
    and secrets, typed) and the weights fan-out decided from them (docs/fanout.md)."""

    def __init__(self, state):
        why = inventory.argv_problem(sys.argv)  # an inventory whose serving_groups were never applied
        if why:
            raise SystemExit(f"nemofleet: {why}")
        hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
        self.specs = spec.read_all({h.name: data(h) for h in hosts}, {h.name: h.groups for h in hosts},
                                   dict(getattr(state.inventory, "override_data", None) or {}))
        # the hosts pyinfra connected to, in inventory order: pyinfra prepares them concurrently, so
        # each host reads the same decision and no host reads another's facts for it
        active = set(state.active_hosts)
        self.fanout = fanout.for_run({h.name: self.specs[h.name] for h in hosts if h in active})
        self.staging = bundle.Staging()  # which host receives each bundle part (docs/air-gap.md)


_RUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # {pyinfra State: Run}


def run() -> Run:
    """This pyinfra run's Run (read at its first use, once per pyinfra state)."""
    state = host.state
    r = _RUNS.get(state)
    if r is None:
        r = _RUNS[state] = Run(state)
    return r


def host_inputs() -> HostInputs:
    """This host's HostInputs, from the one gatherer: its spec, HostFacts for the image it pulls, the
    commits of unpinned revisions (asked from the host), the serving group's peers, the lock
    token of this run and the fan-out's sources for it."""
    r = run()
    sp = r.specs[host.name]
    facts = _host_facts(host, sp, own=True)
    # a revision that is not a commit is resolved once, from the host (no query when pinned)
    commits = {(e, rp, v): host.get_fact(HubCommit, endpoint=e, repo=rp, revision=v) for e, rp, v in spec.to_resolve(sp)}
    peers = group_peers(sp) if sp.members else {}
    if sp.members:
        # a worker checks, before anything changes, that the head answers on the rendezvous port
        # (an answer, even "refused" before the head runs, proves the route; silence is a firewall)
        from .facts.network import TcpReach
        from .multinode import head_probe

        head = sp.members[0]
        known = {**peers, host.name: facts}
        target = head_probe(host.name, sp.settings, {head: factmodel.parse_peer(head, known.get(head))})
        if target:
            facts["head_reach"] = {"target": f"{target[0]}:{target[1]}",
                                   "state": host.get_fact(TcpReach, address=target[0], port=target[1])}
    return inputs.gather(r.specs, {**peers, host.name: facts}, hosts=[host.name], commits={host.name: commits},
                         seeds={host.name: r.fanout.seed_from(host.name)}, lock_token=runlock.token(),
                         now=time.time(), operator=operator())[host.name]


@stage("nemofleet preflight")
def run_preflight() -> Desired:
    """Refuse a host that cannot serve (one sentence each) before anything changes."""
    i = host_inputs()
    want, takes = decide(i), list[str]()
    if want.ok and i.settings is not None and i.settings.bundle:
        # the bundle's signature and the parts it lacks checked now; the parts this host takes
        # from it are received below, on one host of the run, before any change
        b, why, takes = bundle.preflight(want, i.settings, i.facts, bootstrap.TOOLKIT_PACKAGES, preflight.dry_run())
        want = replace(want, refusals=[*want.refusals, *why], bundle=b)
    host.log(want.summary, logger.info)
    preflight.say_if_dry(want.refusals)
    runlock.exempt(preflight.verdict(name="Preflight: can this host serve its plan?", refusals=want.refusals,
                                     warnings=want.warnings))  # a refusal changes nothing: no lock for it
    if want.ok and takes and want.bundle is not None and i.settings is not None:
        b, root, units = want.bundle, i.settings.models_root, []
        image = [n for n in takes if n.startswith("images/")]
        for name, src, sha in _parts(b, image):  # (key, [(part, SHA-256, name)], commands, cleanup when refused)
            at = _staged(root, name)
            units.append((_key(name), [(src, sha, name)], docker.archive_commands(name, src, sha, at), f"rm -rf -- {at}"))
        for d in want.downloads:
            names = [p["path"] for p in b.find("weights", repo=d.repo, revision=d.revision) if p["path"] in takes]
            parts = _parts(b, names, lambda p: b.parts[p]["file"])
            if parts:
                units.append((_key(f"weights {d.repo}@{d.revision}"), [(src, sha, n) for n, (_, src, sha) in zip(names, parts)],
                              list(weights.from_bundle(d.directory, parts)), f"rm -rf -- {d.directory}"))
        run().staging.take(host.name, [u[0] for u in units])
        weights.bundle_received(name="Bundle: image and weights to the run's first host taking each (SHA-256 checked), "
                                     "its verdict to the others", staging=run().staging, units=units)
        want = replace(want, prune=[*want.prune, *(_staged(root, n) for n in image)])  # once every host loaded it
    return want


def _key(what: str):
    """A bundle part's key in the run's Staging: shared by the hosts of the fleet fan-out (one
    receives it, the others copy from a peer), this host's own otherwise."""
    return what if fanout.wanted(run().specs[host.name]) is not None else (what, host.name)


def _staged(root: str, name: str) -> str:
    """Where a host keeps a bundle's image archive while the run's hosts copy it from each other."""
    return f"{root}/.nemofleet-{os.path.basename(name).removesuffix('.tar')}"


# ---------------------------------------------------------------------------- stages
# Each stage body takes `op`: the operation modules (OPS) when the deploy runs, or a recorder
# (fact_reads) that walks the same code to collect what each operation reads (`.reads`, declared
# next to the operation with operations.reads_with), so the batched read ahead cannot drift from
# what the stages do.
#
# An operation that depends on another's change (a daemon-reload after a unit file, Docker's
# restart after its proxy drop-in, the audit line after the release record) is added only when
# that change will happen, decided from the same facts by the module's helper (files.will_change,
# units.running_plan, ...; operations.predicts): never with `_if=`, which pyinfra can only show
# as a "conditional change" in --dry and at its prompt, also on a host where nothing will change.
# The facts are read ahead before the stages add their operations (converge: prefetch.load), so
# the helpers cost no remote command; while the recorder walks, they answer "everything changes"
# (each helper's `unknown`), so every operation that may be added is walked.


def _log(text: str) -> None:
    host.log(text, logger.info)


OPS = SimpleNamespace(daemon_json=daemon_json, files=files, units=units, systemd=systemd, server=server,
                      docker=docker, weights=weights, gpu_access=gpu_access, frontdoor=frontdoor,
                      packages=packages, log=_log)


class _Module:
    def __init__(self, module, sink: list):
        self._module, self._sink = module, sink

    def __getattr__(self, name):
        target = getattr(self._module, name)
        if hasattr(target, "unknown"):  # a decision from facts not read yet: "it changes"
            return target.unknown
        reads = getattr(target, "reads", None)

        def record(*args, **kwargs):
            pair = reads(**kwargs) if reads is not None else None
            if pair is not None:
                self._sink.append(pair)
        return record


def _reads(walk: Callable[[SimpleNamespace], None]) -> list[tuple]:
    sink: list = []
    walk(SimpleNamespace(**{k: _Module(v, sink) for k, v in vars(OPS).items() if k != "log"}, log=lambda text: None))
    return sink


@dataclass
class Carried:
    """What a phase tells the ones after it: the daemon.json keys this run changes (the GPU probe
    runs again when they hold GPU keys) and whether an instance (re)starts (the first health check
    runs), both decided from the facts before anything runs."""
    daemon_changed: set = field(default_factory=set)
    started: bool = False


def _configure_host(want: Desired, carried: Carried, op=OPS) -> None:
    """daemon.json, host files, secrets, the seed key's line, the CDI spec."""
    carried.daemon_changed = op.daemon_json.changed_keys(desired=want.daemon_json, defaults=want.daemon_json_defaults)
    op.daemon_json.configured(name="Docker daemon.json (merged; reload or restart only when needed)",
                              desired=want.daemon_json, defaults=want.daemon_json_defaults)
    if want.host_files:
        host_changed = op.files.will_change(files=want.host_files)
        op.files.managed(name="Host files (Docker proxy drop-in, /dev/char udev rule)", files=want.host_files)
        if paths.DOCKER_PROXY in host_changed:
            op.units.daemon_reload(name="Reload systemd for the Docker proxy")
            op.systemd.service(name="Restart Docker for the proxy", service="docker", restarted=True)
        if paths.DEV_CHAR_RULE in host_changed:
            op.server.shell(name="Create the /dev/char links now",
                            commands=["timeout 120 nvidia-ctk system create-dev-char-symlinks --create-all"])
    op.files.managed(name="Secrets (0600, root only)", files=want.secret_files, secret=True, dirs=want.secret_dirs)
    if want.authorized_key:
        op.files.authorized_key(name="Fleet seed key may read weights from this host (read-only rsync)",
                                path=paths.ROOT_AUTHORIZED_KEYS, line=want.authorized_key,
                                key=want.seed_public_key)
    if want.absent:
        op.files.absent(name="No stale HF token", paths=want.absent)
    if want.cdi_command:
        op.server.shell(name="Enable nvidia-cdi-refresh" if "refresh" in want.cdi_command else "Generate the CDI spec",
                        commands=[want.cdi_command])


def _fetch_weights(want: Desired, carried: Carried, op=OPS) -> None:
    """The image and the weights (verified, from a peer or the mirror; with a bundle: every part
    from it, nothing from a registry or mirror)."""
    b = want.bundle
    op.docker.image(name=f"Image {want.image}", ref=want.image, archive=want.image_archive,
                    part=b and _image_part(b, b.find("image", image=want.image)[0]["path"]))
    for d in want.downloads:
        op.weights.model(name=f"Weights {d.repo}@{d.revision[:12]}", repo=d.repo, revision=d.revision,
                         directory=d.directory, image=want.image, endpoint=d.endpoint, token_file=d.token_file,
                         full_verify=d.full_verify, seed=d.seed, link_from=d.link_from,
                         parts=b and _parts(b, [p["path"] for p in b.find("weights", repo=d.repo, revision=d.revision)],
                                            lambda p: b.parts[p]["file"]))


def _image_part(b, name: str) -> tuple:
    """docker.image's `part`: the archive, where this host keeps it, and, asked at execution,
    whether this host received it from the controller, else the peers it copies it from: the
    fan-out tree (fanout.decide) from the host that received it, over the hosts that take it."""
    s = run().specs[host.name].settings
    assert s is not None  # a host that passed preflight
    key, me, root, state = _key(name), host.name, s.models_root, host.state

    def sources() -> tuple[bool, list | None]:
        r = run()
        first, why = r.staging.verdicts.get(key, (None, None))
        if first == me:
            return True, None
        order = [h.name for h in state.inventory if h in state.active_hosts]
        fan = fanout.decide([order], {h: key for h in order if h in r.staging.takers.get(key, ())},
                            {first: {key}} if first and not why else {})
        peers = fan.seed_from(me, r.fanout.address, start=fanout.SOURCE_START)
        return False, peers and [{**p, "root": root} for p in peers]
    return (name, *bundle.upload(b, name), _staged(root, name), sources)


def _parts(b, names, rename=lambda name: name) -> list[tuple]:
    """[(name, its bytes as a file, SHA-256)] of a bundle's parts, as the operations upload them
    (a part's file is opened at its first read: nothing is read for a host that needs nothing)."""
    return [(rename(n), *bundle.upload(b, n)) for n in names]


def probe_gpu_access(want: Desired, force: bool | set = False, op=OPS) -> None:
    g = want.gpu_probe
    assert g is not None  # a host that passed preflight has its probe
    op.gpu_access.survives_daemon_reload(
        name="GPU access survives systemctl daemon-reload (probe)", image=g.image, gpu_args=g.gpu_args,
        signature=g.signature, remedy_hint=g.remedy_hint, force=force, recorded=want.gpu_access_record)


def _serve(want: Desired, carried: Carried, op=OPS) -> None:
    """The units, their starts and ready wait, the release record; `carried.started`: whether this
    run (re)starts an instance through units.running."""
    # before any unit (re)starts: a host that would lose its GPUs is failed here. Probed again
    # whenever this run rewrites daemon.json's GPU keys (e.g. repairs a drifted cgroup driver).
    probe_gpu_access(want, force=carried.daemon_changed, op=op)
    if want.networks:
        op.docker.networks(name="Frontend networks", wanted=want.networks)
    if want.previous_release and want.previous_release != want.release_id:
        op.server.shell(name=f"Keep release {want.previous_release} for rollback",
                        commands=[want.keep_previous_command])
    if want.front_door:
        _front_door(want, op=op)
    changed: set = set()  # the unit files this run writes
    if want.drain_restarts:
        for path, _, _ in want.drain_restarts:
            changed |= op.files.will_change(files={path: want.units[path]})
    else:
        changed = op.files.will_change(files=want.units)
    # with a front door, running units whose file changes are restarted through it (deferred)
    plan = op.units.running_plan(units=want.unit_names, changed=changed,
                                 deferred=set() if want.drain_restarts else None)
    if want.drain_restarts:
        # one instance at a time, its unit file then its restart, so the others keep serving and a
        # run that stops half way leaves every unit file matching the container that runs it
        for path, unit, command in want.drain_restarts:
            op.files.managed(name=f"vLLM unit {unit}", files={path: want.units[path]})
            if path in changed:
                op.units.daemon_reload(name=f"Reload systemd for {unit}")
            if unit in plan.deferred:  # runs now: drained, restarted, ready, back in (else started below)
                op.server.shell(name=f"Restart {unit} through the front door (drain, restart, ready, back in)",
                                commands=[command])
    else:
        op.files.managed(name="vLLM units", files=want.units)
        if changed:
            op.units.daemon_reload(name="Reload systemd for changed units")
    # with a front door, running units were restarted above: here only starts, enables and removals
    op.units.running(name="vLLM instances enabled and running", units=want.unit_names, changed=changed,
                     deferred=set() if want.drain_restarts else None)
    started = carried.started = plan.changes()
    if want.ready_command and started:
        op.server.shell(name="Wait until the (re)started instances are ready", commands=[want.ready_command])
    if want.attached:
        op.docker.attached(name="Instances on their frontend networks", containers=want.attached)
    record_changed = op.files.will_change(files=want.release_files, dirs={paths.STATE_DIR: "0755"})
    op.files.managed(name="Release record", files=want.release_files, dirs={paths.STATE_DIR: "0755"})
    if record_changed:
        op.server.shell(name="Audit log", commands=[want.audit_command])
    op.weights.pruned(name="Weights no release on this host uses", directories=want.prune)
    for line in want.frontend_lines:
        op.log(line)


def _front_door(want: Desired, label: str = "Front door", secret_dirs: dict | None = None, op=OPS) -> None:
    """HAProxy from the distribution: config checked with haproxy -c before it is live, reloaded
    (never restarted) only when its config or keys change. The same steps set up a host's front
    door and the fleet gateway (`gateway()` below, label "Gateway")."""
    installing = op.packages.will_install(packages=["haproxy"])
    op.packages.installed(name=f"{label}: HAProxy (distribution package)", packages=["haproxy"],
                          debs=want.bundle and _parts(want.bundle, bundle.debs(want.bundle, ["haproxy"])))
    door_changed: set = set()
    if want.front_door_files:
        door_changed |= op.files.will_change(files=want.front_door_files)
        op.files.managed(name=f"{label}: drain script and HAProxy drop-in", files=want.front_door_files)
    door_changed |= op.files.will_change(files=want.front_door_secrets, dirs=secret_dirs)
    op.files.managed(name=f"{label}: API key patterns (0600)", files=want.front_door_secrets, secret=True,
                     dirs=secret_dirs)
    if op.frontdoor.will_change(path=paths.FRONT_DOOR_CFG, content=want.front_door_config):
        door_changed.add(paths.FRONT_DOOR_CFG)
    op.frontdoor.configured(name=f"{label}: HAProxy config (haproxy -c before it is live)",
                            path=paths.FRONT_DOOR_CFG, content=want.front_door_config, role=label.lower())
    if paths.FRONT_DOOR_DROPIN in door_changed:
        op.units.daemon_reload(name="Reload systemd for the HAProxy drop-in")
    starts = op.units.will_enable_or_start(unit="haproxy.service")
    op.units.enabled_and_active(name=f"{label}: HAProxy enabled and running", unit="haproxy.service")
    # a HAProxy that runs now reloads a changed config or key file (a start reads them anyway);
    # one installed by this run may have been started by its package with the default config
    if (installing or not starts) and door_changed - {paths.FRONT_DOOR_DROPIN, paths.DRAIN_SCRIPT}:
        op.server.shell(name=f"{label}: reload HAProxy (connections in flight are kept)",
                        commands=["timeout 120 systemctl reload haproxy"])


def _health(want: Desired, carried: Carried, op=OPS) -> None:
    """The health script and its cron line; when this run (re)starts an instance or changes the
    script, one health run now (under the cron's lock, bounded), so `nemofleet status` shows the
    instances' health and load right after a converge instead of after cron's first run. A
    converged re-run changes nothing here and runs nothing."""
    changed = op.files.will_change(files=want.health_files)
    op.files.managed(name="Health check script and cron", files=want.health_files)
    if want.gpu_returns:  # only when the health script drained a GPU that reads healthy again
        op.server.shell(name="GPUs healthy again: their instances back in the front door", commands=want.gpu_returns)
    if changed or carried.started:
        op.server.shell(name="First health check (metrics for nemofleet status)",
                        commands=[render.first_health_check()])


# The deploy's phases, in order: each a pyinfra stage of its own name, and each walked with a
# recorder in place of the operations to learn what it reads (fact_reads below)
PHASES = (("nemofleet host configuration", _configure_host), ("nemofleet weights", _fetch_weights),
          ("nemofleet serving", _serve), ("nemofleet health", _health))
_STAGES = tuple(stage(name)(body) for name, body in PHASES)


def phases(want: Desired, op=OPS) -> None:
    """Run every phase for a host that passed preflight (`op`: the operations, or a recorder)."""
    carried = Carried()
    for run_stage, (_, body) in zip(_STAGES, PHASES):
        (run_stage if op is OPS else body)(want, carried, op)


def nemotron() -> None:
    """The main job: fresh GPU hosts to serving; a converged host changes nothing."""
    if spec.GATEWAY_GROUP in (host.groups or ()):  # no GPUs there: deploys/gateway.py configures it
        host.log(f"a host of group {spec.GATEWAY_GROUP}: deploys/gateway.py configures it; nothing to serve here",
                 logger.info)
        return
    s = run().specs[host.name].settings  # None: refused with its sentences by preflight
    pending = bootstrap.install(s) if s is not None else False
    if pending:  # the driver/toolkit change first: preflight must see the host as it is then
        python.call(name="Preflight and converge on the freshly installed host", function=converge)
    elif pending is not None:
        converge()
    runlock.guard()  # a plain run takes the deploy lock before its first change (lock/run.py)


def fact_reads(want: Desired) -> list[tuple]:
    """The facts the stages below read, with the arguments they read them with: read ahead in one
    remote command (facts/prefetch.py). Derived by walking the very stage code converge() runs,
    with a recorder in place of the operations (each operation declares its read next to itself);
    anything an operation reads that is not here it reads itself."""
    return _reads(lambda op: phases(want, op))


def gateway_reads(want: Desired) -> list[tuple]:
    """The facts the gateway's stage reads (derived the same way)."""
    return _reads(lambda op: _front_door(want, label="Gateway", secret_dirs=want.secret_dirs, op=op))


def converge() -> None:
    want = run_preflight()
    if not want.ok:
        return
    prefetch.load(fact_reads(want))
    phases(want)


def gpu_probe_only() -> None:
    """Diagnose the NVML trap now: a test container must keep its GPU across daemon-reload."""
    want = run_preflight()
    if not want.ok:
        return
    docker.image(name=f"Image {want.image}", ref=want.image, archive=want.image_archive)
    probe_gpu_access(want, force=True)
    runlock.guard()


def preflight_only() -> None:
    want = run_preflight()
    if want.ok and want.plan is not None:
        p = want.plan
        host.log(f"preflight passed: {len(p.instances)} instance(s) of {p.model.key} "
                 f"(TP {p.instances[0].tp}, {p.instances[0].memory.summary()})", logger.info)


# ---------------------------------------------------------------------------- the fleet gateway


@stage("nemofleet gateway preflight")
def _gateway_preflight() -> Desired:
    want = decide(inputs.gather(run().specs, {host.name: {}}, hosts=[host.name], operator=operator())[host.name])
    b, why = bundle.for_host(run().specs[host.name].settings)  # HAProxy's .deb from it, when set
    want = replace(want, refusals=[*want.refusals, *([Refusal(why, "bundle")] if why else [])], bundle=b)
    preflight.verdict(name="Preflight: can this host be the gateway?", refusals=want.refusals)
    return want


@stage("nemofleet gateway")
def _gateway_configure(want: Desired) -> None:
    prefetch.load(gateway_reads(want))
    _front_door(want, label="Gateway", secret_dirs=want.secret_dirs)
    for line in want.frontend_lines:
        host.log(line, logger.info)


def gateway() -> None:
    """deploys/gateway.py: configure the hosts of group `gateway` (HAProxy over gateway_backends,
    gateway.decide decides it); any other host is left alone."""
    if spec.GATEWAY_GROUP not in (host.groups or ()):
        host.log(f"not in inventory group {spec.GATEWAY_GROUP}: deploys/gateway.py leaves this host alone",
                 logger.info)
        return
    want = _gateway_preflight()
    if not want.refusals:
        _gateway_configure(want)
