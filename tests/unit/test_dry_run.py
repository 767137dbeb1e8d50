"""An honest dry run (issue 39): the whole deploy, walked against a host's facts, adds only
operations that will run, and never one with `_if=` (which `pyinfra --dry` and its confirmation
prompt can only list as a "conditional change", also on a host where nothing will change).

The stages of deploy.py are walked with the real stage code (`op=` a namespace that runs each
nemofleet operation's body against a modelled host, as opharness does for one operation, and
records pyinfra's own operations as the change they always are). A converged host gives no
operation with a command; a host that differs in one file gives that file's operation and
exactly the operations that follow from it (the Docker restart after its proxy drop-in, one
unit's drain restart after its unit file, the audit line after the release record, ...).
"""
from __future__ import annotations

import copy
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host, ctx_state

sys.path.insert(0, str(Path(__file__).parent))
from opharness import FakeHost, FakeState, readable  # noqa: E402
from test_desired import CASES, SECRETS, SEED_PUB  # noqa: E402

from nemofleet import deploy, desired, paths  # noqa: E402
from nemofleet.facts import prefetch  # noqa: E402
from nemofleet.operations import daemon_json  # noqa: E402

SEED_KEY = "-----BEGIN OPENSSH X-----\nabc\n-----END"
HOST = "dry-run-host"  # a name of its own: prefetch keeps its cache per host name


# ---------------------------------------------------------------------------- a modelled host


@dataclass
class Model:
    """What a host holds, answered as each fact the operations read would answer it."""
    files: dict = field(default_factory=dict)  # path -> (mode "644", content); a directory: (mode, None)
    units: dict = field(default_factory=dict)  # unit -> {"enabled", "active"}
    unit_files: list = field(default_factory=list)
    daemon: dict | None = field(default_factory=dict)  # daemon.json's data ({}: absent)
    images: set = field(default_factory=set)
    weights: dict = field(default_factory=dict)  # directory -> WeightsStatus value
    networks: set = field(default_factory=set)
    containers: dict = field(default_factory=dict)  # name -> {"running", "networks"}
    packages: dict = field(default_factory=dict)  # name -> version
    asked: list = field(default_factory=list)  # (fact class, kwargs) in the order asked

    def fact(self, cls, kwargs: dict):
        self.asked.append((cls, dict(kwargs)))
        name = cls.__name__
        if name == "FilesDigest":
            return {p: self._digest(p) for p in kwargs["paths"]}
        if name == "FileText":
            return (self.files.get(kwargs["path"]) or (None, ""))[1] or ""
        if name == "UnitStates":
            return {"units": {u: dict(self.units[u]) for u in kwargs["units"] if u in self.units},
                    "files": list(self.unit_files)}
        if name == "DaemonJson":
            return {"exists": bool(self.daemon), "text": json.dumps(self.daemon), "data": self.daemon, "error": None}
        if name == "DockerInfo":
            return {"installed": True, "running": True, "server": "24.0.7"}
        if name == "ImageInfo":
            return {"id": "sha256:0", "env": {}} if kwargs["ref"] in self.images else None
        if name == "WeightsStatus":
            return self.weights.get(kwargs["directory"], {"exists": False, "complete": False, "marker": False,
                                                          "missing": [], "truncated": [], "present_bytes": 0})
        if name == "Networks":
            return {n: n in self.networks for n in kwargs["names"]}
        if name == "ContainerNetworks":
            return {n: self.containers[n] for n in kwargs["names"] if n in self.containers}
        if name == "AptPackages":
            return {n: {"version": self.packages[n], "held": False} for n in kwargs["names"] if n in self.packages}
        raise KeyError(f"the model answers no fact {name}")

    def _digest(self, path: str):
        if path not in self.files:
            return None
        mode, content = self.files[path]
        return (mode, "dir") if content is None else (mode, hashlib.sha256(content.encode()).hexdigest())


class ModelHost(FakeHost):
    def __init__(self, model: Model):
        super().__init__(HOST, {})
        self.model = model

    def get_fact(self, cls, **kwargs):
        return self.model.fact(cls, kwargs)


def converged(want: desired.Desired) -> Model:
    """The host as a converge leaves it: every file, unit, key and image as `want` has them."""
    m = Model()
    groups = (want.host_files, want.secret_files, want.units, want.release_files, want.health_files,
              want.front_door_files, want.front_door_secrets)
    for group in groups:
        for path, (content, mode) in group.items():
            m.files[path] = (oct(int(mode, 8))[2:], content)
    for d, mode in {**want.secret_dirs, paths.STATE_DIR: "0755"}.items():
        m.files[d] = (oct(int(mode, 8))[2:], None)
    if want.front_door:
        m.files[paths.FRONT_DOOR_CFG] = ("644", want.front_door_config)
        m.packages["haproxy"] = "2.6.12-1+deb12u1"
        m.units["haproxy.service"] = {"enabled": True, "active": True}
    if want.authorized_key:
        m.files[paths.ROOT_AUTHORIZED_KEYS] = ("600", want.authorized_key + "\n")
    m.units.update({u: {"enabled": True, "active": True} for u in want.unit_names})
    m.unit_files = list(want.unit_names)
    m.daemon = daemon_json.merge({}, want.daemon_json, want.daemon_json_defaults)
    m.images.add(want.image)
    for d in want.downloads:
        m.weights[d.directory] = {"exists": True, "complete": True, "marker": True, "missing": [], "truncated": [],
                                  "present_bytes": 1, "commit_ok": True}
    m.networks = set(want.networks)
    m.containers = {c: {"running": True, "networks": sorted(nets)} for c, nets in want.attached.items()}
    return m


def converged_want(case: str, secrets: dict | None = None) -> desired.Desired:
    """desired.build() for a host that holds its release: its record, its probed GPU access and
    its CDI spec are on the host (what a first converge leaves there)."""
    f, data = copy.deepcopy(CASES[case])
    secrets = secrets or SECRETS
    first = desired.build(case, data, f, secrets)
    assert first.ok, first.refusals
    f["toolkit"]["cdi_specs"] = ["/var/run/cdi/nvidia.yaml"]
    f["release"] = {"id": first.release_id}
    f["gpu_access"] = first.gpu_probe.signature
    want = desired.build(case, data, f, secrets)
    assert (want.cdi_command, want.previous_release, want.prune, want.gpu_returns) == (None, want.release_id, [], [])
    return want


# ---------------------------------------------------------------------------- walking the stages


@dataclass
class Step:
    name: str
    op: str  # module.operation
    commands: list
    conditional: bool  # added with _if=: pyinfra lists it as a conditional change


class _Walker:
    """One module of deploy.OPS: nemofleet's operations run against the model, its decision
    helpers answer from the model, pyinfra's own operations recorded as the change they are."""

    def __init__(self, module, steps: list):
        self._module, self._steps = module, steps

    def __getattr__(self, attr):
        target = getattr(self._module, attr)
        if hasattr(target, "unknown"):  # a decision helper: answered from the facts
            return target
        if not hasattr(target, "_inner"):
            return target

        def call(**kwargs):
            name = kwargs.pop("name", attr)
            conditional = "_if" in kwargs
            kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
            if target.__module__.startswith("nemofleet."):
                commands = [readable(c) for c in target._inner(**kwargs)]
            else:  # pyinfra's server.shell / systemd.service(restarted=True): always a command
                commands = list(kwargs.get("commands") or [f"{target.__module__}.{attr}"])
            self._steps.append(Step(name, f"{self._module.__name__.rsplit('.', 1)[-1]}.{attr}", commands,
                                    conditional))
        return call


def walk(want: desired.Desired, model: Model, gateway: bool = False) -> list[Step]:
    """Every operation the deploy's stages add for `want` on the modelled host, in order."""
    steps: list[Step] = []
    op = SimpleNamespace(**{k: _Walker(v, steps) for k, v in vars(deploy.OPS).items() if k != "log"},
                         log=lambda text: None)
    with ctx_state.use(FakeState()), ctx_host.use(ModelHost(model)):
        prefetch.forget()
        if gateway:
            deploy._front_door(want, label="Gateway", secret_dirs=want.secret_dirs, op=op)
            return steps
        deploy.phases(want, op)
    return steps


def changes(steps: list[Step]) -> list[str]:
    return [s.name for s in steps if s.commands]


def assert_honest(steps: list[Step]) -> None:
    """No operation pyinfra would list as a conditional change; every one added says why it does
    nothing (no-op) or yields what it will run."""
    assert not [s.name for s in steps if s.conditional]


WANTS = {**{case: (case, None) for case in CASES if not case.startswith("group")},
         "h200-1x-cdi-seed-key": ("h200-1x-cdi", dict(SECRETS, weights_seed_key=SEED_KEY,
                                                      weights_seed_public_key=SEED_PUB))}


@pytest.mark.parametrize("name", sorted(WANTS))
def test_a_converged_host_gets_no_operation_with_a_command(name):
    case, secrets = WANTS[name]
    want = converged_want(case, secrets)
    steps = walk(want, converged(want))
    assert_honest(steps)
    assert changes(steps) == []
    # and the operations that only follow a change are not there at all
    follow = ("Restart ", "Reload systemd", "Audit log", "First health check", "Wait until", "Create the /dev/char")
    assert not [s.name for s in steps if s.name.startswith(follow) or "reload HAProxy" in s.name]


def test_the_gateway_converged_changes_nothing_and_one_key_change_reloads_it():
    from test_inputs import KEY

    want = desired.build("gw", {"gateway_backends": [{"host": "10.0.0.5", "port": 8800}]}, {},
                         {"vllm_api_key": KEY}, groups=["gateway"])
    model = converged(want)
    steps = walk(want, model, gateway=True)
    assert_honest(steps)
    assert changes(steps) == []
    model.files[paths.FRONT_DOOR_KEYS] = ("600", "Bearer old\n")
    assert changes(walk(want, model, gateway=True)) == ["Gateway: API key patterns (0600)",
                                                        "Gateway: reload HAProxy (connections in flight are kept)"]


def test_a_changed_docker_proxy_drop_in_restarts_docker_and_nothing_else():
    want = converged_want("a100-1x-docker20-frontends")
    assert paths.DOCKER_PROXY in want.host_files
    model = converged(want)
    model.files[paths.DOCKER_PROXY] = ("600", "[Service]\nEnvironment=HTTP_PROXY=http://old:3128\n")
    steps = walk(want, model)
    assert_honest(steps)
    assert changes(steps) == ["Host files (Docker proxy drop-in, /dev/char udev rule)",
                              "Reload systemd for the Docker proxy", "Restart Docker for the proxy"]


def test_a_missing_dev_char_rule_creates_the_links_without_restarting_docker():
    want = converged_want("a100-1x-docker20-frontends")
    model = converged(want)
    del model.files[paths.DEV_CHAR_RULE]
    assert changes(walk(want, model)) == ["Host files (Docker proxy drop-in, /dev/char udev rule)",
                                          "Create the /dev/char links now"]


def _unit(want, i: int) -> tuple[str, str]:
    unit = want.unit_names[i]
    return unit, f"/etc/systemd/system/{unit}"


def test_one_changed_unit_behind_the_front_door_is_drained_and_restarted_alone():
    want = converged_want("h100-8x-front-door-frontends")
    assert want.drain_restarts
    model = converged(want)
    unit, path = _unit(want, 1)
    model.files[path] = ("644", "[Service]\nExecStart=old\n")
    steps = walk(want, model)
    assert_honest(steps)
    assert changes(steps) == [f"vLLM unit {unit}", f"Reload systemd for {unit}",
                              f"Restart {unit} through the front door (drain, restart, ready, back in)"]
    drain = next(s for s in steps if s.name.startswith(f"Restart {unit}"))
    assert drain.commands == [want.drain_restarts[1][2]]


def test_a_changed_unit_that_does_not_run_is_started_not_drained():
    want = converged_want("h100-8x-front-door-frontends")
    model = converged(want)
    unit, path = _unit(want, 2)
    model.files[path] = ("644", "[Service]\nExecStart=old\n")
    model.units[unit] = {"enabled": True, "active": False}
    steps = walk(want, model)
    assert_honest(steps)
    want_ready = ["Wait until the (re)started instances are ready"] if want.ready_command else []
    assert changes(steps) == [f"vLLM unit {unit}", f"Reload systemd for {unit}", "vLLM instances enabled and running",
                              *want_ready, "First health check (metrics for nemofleet status)"]
    running = next(s for s in steps if s.name == "vLLM instances enabled and running")
    assert running.commands == [f"timeout 120 systemctl start --no-block -- {unit}"]


def test_a_changed_unit_without_a_front_door_is_restarted_then_waited_for():
    want = converged_want("h200-1x-cdi")
    assert not want.drain_restarts and want.ready_command
    model = converged(want)
    unit, path = _unit(want, 0)
    model.files[path] = ("644", "[Service]\nExecStart=old\n")
    steps = walk(want, model)
    assert_honest(steps)
    assert changes(steps) == ["vLLM units", "Reload systemd for changed units", "vLLM instances enabled and running",
                              "Wait until the (re)started instances are ready",
                              "First health check (metrics for nemofleet status)"]
    running = next(s for s in steps if s.name == "vLLM instances enabled and running")
    assert len(running.commands) == 1 and running.commands[0].endswith(f"restart {unit}")  # the restart script


def test_a_new_release_record_writes_the_audit_line():
    want = converged_want("h200-1x-cdi")
    model = converged(want)
    model.files[paths.RELEASE] = ("644", "{}\n")
    assert changes(walk(want, model)) == ["Release record", "Audit log"]
    del model.files[paths.STATE_DIR]  # only the directory's mode: no new record, no audit line
    model.files[paths.RELEASE] = converged(want).files[paths.RELEASE]
    model.files[paths.STATE_DIR] = ("700", None)
    assert changes(walk(want, model)) == ["Release record"]


def test_a_changed_front_door_config_reloads_haproxy_a_drain_script_does_not():
    want = converged_want("h100-8x-front-door-frontends")
    model = converged(want)
    model.files[paths.FRONT_DOOR_CFG] = ("644", "global\n")
    assert changes(walk(want, model)) == ["Front door: HAProxy config (haproxy -c before it is live)",
                                          "Front door: reload HAProxy (connections in flight are kept)"]
    model = converged(want)
    model.files[paths.DRAIN_SCRIPT] = ("755", "#!/bin/sh\n")
    assert changes(walk(want, model)) == ["Front door: drain script and HAProxy drop-in"]
    model = converged(want)
    del model.files[paths.FRONT_DOOR_DROPIN]
    assert changes(walk(want, model)) == ["Front door: drain script and HAProxy drop-in",
                                          "Reload systemd for the HAProxy drop-in"]


def test_haproxy_that_is_stopped_is_started_with_the_new_config_not_reloaded():
    want = converged_want("h100-8x-front-door-frontends")
    model = converged(want)
    model.files[paths.FRONT_DOOR_CFG] = ("644", "global\n")
    model.units["haproxy.service"] = {"enabled": True, "active": False}
    assert changes(walk(want, model)) == ["Front door: HAProxy config (haproxy -c before it is live)",
                                          "Front door: HAProxy enabled and running"]


def test_haproxy_installed_by_this_run_is_reloaded_after_its_config():
    """Debian's package starts HAProxy with its own config as it installs it: the facts (read
    before) say stopped, so the start is a no-op then, and only the reload loads nemofleet's."""
    want = converged_want("h100-8x-front-door-frontends")
    model = converged(want)
    del model.packages["haproxy"]
    model.units["haproxy.service"] = {"enabled": False, "active": False}
    model.files[paths.FRONT_DOOR_CFG] = ("644", "# the package's own\n")
    assert changes(walk(want, model)) == ["Front door: HAProxy (distribution package)",
                                          "Front door: HAProxy config (haproxy -c before it is live)",
                                          "Front door: HAProxy enabled and running",
                                          "Front door: reload HAProxy (connections in flight are kept)"]


def test_a_changed_gpu_key_in_daemon_json_probes_gpu_access_again():
    want = converged_want("h100-8x-trap")
    assert "exec-opts" in want.daemon_json
    model = converged(want)
    model.daemon = dict(model.daemon, **{"exec-opts": ["native.cgroupdriver=systemd"]})
    assert changes(walk(want, model)) == ["Docker daemon.json (merged; reload or restart only when needed)",
                                          "GPU access survives systemctl daemon-reload (probe)"]
    model = converged(want)
    model.daemon = dict(model.daemon, debug=True)  # a key nemofleet does not own: kept, nothing changes
    assert changes(walk(want, model)) == []


def test_a_changed_health_script_runs_the_first_health_check():
    want = converged_want("h200-1x-cdi")
    model = converged(want)
    model.files[paths.HEALTH_CRON] = ("644", "")
    assert changes(walk(want, model)) == ["Health check script and cron",
                                          "First health check (metrics for nemofleet status)"]


@pytest.mark.parametrize("name", sorted(WANTS))
def test_a_fresh_host_gets_every_operation_and_the_read_ahead_covers_what_they_ask(name):
    """On a host with nothing (no files, units, image, weights), every operation is added as a
    plain change; every fact the stages and their helpers ask for is one deploy.fact_reads()
    reads ahead (the recorder walks the same code with "everything changes"), so the deploy's
    decisions cost no remote command."""
    case, secrets = WANTS[name]
    want = converged_want(case, secrets)
    fresh = Model(daemon={})
    steps = walk(want, fresh)
    assert_honest(steps)
    names = changes(steps)
    assert "vLLM instances enabled and running" in names and "Audit log" in names
    assert "First health check (metrics for nemofleet status)" in names
    if want.ready_command:
        assert "Wait until the (re)started instances are ready" in names
    if want.drain_restarts:  # nothing runs yet: started by units.running, never drained
        assert not any("through the front door" in n for n in names)
        assert "Front door: reload HAProxy (connections in flight are kept)" in names  # installed by this run
    read_ahead = {prefetch.key(c, k) for c, k in deploy.fact_reads(want)}
    for model in (fresh, converged(want)):
        if model is not fresh:
            walk(want, model)
        # DockerInfo: read by daemon_json.configured only when it rewrites the file (not ahead)
        asked = {prefetch.key(c, k) for c, k in model.asked if c.__name__ != "DockerInfo"}
        assert asked <= read_ahead, sorted(asked - read_ahead)


def test_the_stages_gate_nothing_with_if():
    """The source says it too: no `_if=` in the stages (a condition pyinfra cannot show)."""
    src = Path(deploy.__file__).read_text()
    assert "_if=" not in src.replace("never with `_if=`", "")


# ---------------------------------------------------------------------------- what pyinfra lists


def plan(want: desired.Desired, model: Model) -> dict[str, tuple[bool, bool]]:
    """What `pyinfra --dry` and its prompt list for the host: the real pyinfra operations added by
    the real stages in a State that checks for changes (as without -y), the facts read ahead as
    converge() reads them (deploy.fact_reads, answered by the model; any other fact read would
    try to connect and fail), then pyinfra's own plan rows: {operation: (change, conditional)}."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.state import StateStage
    from pyinfra_cli.prints import build_plan_json

    inventory = Inventory(([HOST], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    h = inventory.get_host(HOST)
    state.activate_host(h)
    with ctx_state.use(state), ctx_host.use(h):
        prefetch.forget()
        prefetch._CACHE[HOST] = {prefetch.key(c, k): model.fact(c, k) for c, k in deploy.fact_reads(want)}
        try:
            deploy.phases(want)
        finally:
            prefetch.forget()
    return {row["name"].split(" | ", 1)[1]: (bool(row["hosts_with_change"]), bool(row["hosts_with_conditional_change"]))
            for row in build_plan_json(state)}


@pytest.mark.parametrize("name", sorted(WANTS))
def test_pyinfra_lists_no_change_and_nothing_conditional_on_a_converged_host(name):
    case, secrets = WANTS[name]
    want = converged_want(case, secrets)
    rows = plan(want, converged(want))
    assert len(rows) >= 12 and not [op for op, (change, maybe) in rows.items() if change or maybe]


def test_pyinfra_lists_a_changed_unit_and_what_follows_it_as_plain_changes():
    want = converged_want("h100-8x-front-door-frontends")
    model = converged(want)
    unit, path = _unit(want, 1)
    model.files[path] = ("644", "[Service]\nExecStart=old\n")
    rows = plan(want, model)
    assert {op: v for op, v in rows.items() if any(v)} == {
        f"vLLM unit {unit}": (True, False), f"Reload systemd for {unit}": (True, False),
        f"Restart {unit} through the front door (drain, restart, ready, back in)": (True, False)}
    want = converged_want("h200-1x-cdi")
    model = converged(want)
    model.files[paths.RELEASE] = ("644", "{}\n")
    assert {op: v for op, v in plan(want, model).items() if any(v)} == {"Release record": (True, False),
                                                                      "Audit log": (True, False)}
