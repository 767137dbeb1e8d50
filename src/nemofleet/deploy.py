"""The stages of deploys/nemotron.py: preflight, host configuration, weights, serving, health.

Each stage is a pyinfra @deploy. Decisions come from the serving plan (plan.py) and the
preflight verdict (preflight.py); this module only turns them into operations.
"""

from __future__ import annotations

import json
import os
import re
import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python, server, systemd

from . import bootstrap, render
from . import preflight as checks
from .facts.host import HostFacts
from .operations import daemon_json, docker, files, gpu_access, preflight, units, weights
from .operations.daemon_json import DaemonJsonError, validate_settings
from .plan import Plan, effective_cgroup_driver

DEFAULT_FRONTENDS: list[dict] = []


def data() -> dict:
    """host.data as a plain dict (pyinfra's HostData has no items())."""
    from pyinfra.api.host import extract_callable_datas

    keys: set = set()
    for layer in extract_callable_datas(host.data.datas):
        keys.update(layer.keys())
    return {k: host.data.get(k) for k in keys}


settings = data


def _facts(s: dict) -> dict:
    return host.get_fact(HostFacts, models_root=s.get("models_root", "/srv/nemofleet/models"),
                         image=s.get("vllm_image", "vllm/vllm-openai:v0.27.1"))


def docker_settings(s: dict, p: Plan | None, facts: dict) -> dict:
    """The daemon.json keys nemofleet owns on this host."""
    desired: dict = {}
    if facts["toolkit"].get("runtime") or facts["toolkit"].get("version"):
        desired["runtimes"] = {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}
    if s.get("docker_default_runtime"):
        desired["default-runtime"] = s["docker_default_runtime"]
    for key, name in (("docker_registry_mirrors", "registry-mirrors"), ("docker_insecure_registries", "insecure-registries")):
        if s.get(key) is not None:
            desired[name] = s[key] or None
    if s.get("docker_log_driver", "json-file"):
        desired["log-driver"] = s.get("docker_log_driver", "json-file")
    if s.get("docker_log_opts", True) is not None:
        desired["log-opts"] = s.get("docker_log_opts") or {"max-size": "100m", "max-file": "3"}
    exec_opts = s.get("docker_exec_opts")
    if exec_opts is None and p is not None and p.docker_exec_opts:
        exec_opts = p.docker_exec_opts
    if exec_opts is not None:
        desired["exec-opts"] = exec_opts or None
    if p is not None and p.gpu_method == "cdi":
        major = int(checks.vt(facts["docker"].get("server"))[0])
        if major < 28:  # reference §3.2: CDI is on by default from 28.3
            desired["features"] = {"cdi": True}
    return desired


def _secret(s: dict, key: str) -> str | None:
    value = s.get(key)
    path = s.get(f"{key}_file")
    if not value and path:
        path = os.path.expanduser(path)
        try:
            value = open(path).read().strip()
        except OSError:
            return None
    return value or None


@deploy("nemofleet preflight")
def run_preflight() -> tuple[Plan | None, dict]:
    """Refuse a host that cannot serve (one sentence each) before anything changes."""
    s = settings()
    facts = _facts(s)
    verdict = checks.check(host.name, facts, s)
    host.log(checks.summary(facts), logger.info)
    try:
        validate_settings(docker_settings(s, verdict.plan, facts))
    except DaemonJsonError as exc:
        verdict.refusals.append(str(exc))
    if facts["daemon_json"]["data"] is None:
        verdict.refusals.append(f"/etc/docker/daemon.json is {facts['daemon_json']['error']}; nemofleet leaves it "
                                "untouched: fix or remove it, then re-run")
    frontends = s.get("frontends") or DEFAULT_FRONTENDS
    if not isinstance(frontends, list) or not all(isinstance(f, dict) and isinstance(f.get("network"), str) for f in frontends):
        verdict.refusals.append("frontends must be a list of mappings with a network name (and alias, create)")
    if verdict.plan is not None and not _secret(s, "vllm_api_key"):
        verdict.refusals.append("no API key: set vllm_api_key or vllm_api_key_file (a file on the controller) "
                                "so /v1 is not open to anyone who can reach the port")
    preflight.verdict(name="Preflight: can this host serve its plan?", refusals=verdict.refusals,
                      warnings=verdict.warnings)
    if verdict.refusals:
        return None, facts
    return verdict.plan, facts


@deploy("nemofleet host configuration")
def configure_host(p: Plan, facts: dict) -> set:
    """Returns the set of daemon.json keys this run changes (filled in as the op executes)."""
    s = settings()
    daemon_changed: set = set()
    daemon_json.configured(name="Docker daemon.json (merged; reload or restart only when needed)",
                           desired=docker_settings(s, p, facts), changed=daemon_changed)
    host_files: dict = {}
    proxy = render.docker_proxy(s)
    if proxy:
        host_files[render.DOCKER_PROXY] = (proxy, "0644")
    if facts["toolkit"].get("version") and s.get("nvidia_dev_char_rule", True):
        # some runc versions need /dev/char links for the GPUs (reference §3.3)
        host_files[render.DEV_CHAR_RULE] = (render.DEV_CHAR_RULE_TEXT, "0644")
    host_changed: set = set()
    if host_files:
        files.managed(name="Host files (Docker proxy drop-in, /dev/char udev rule)", files=host_files,
                      changed=host_changed)
        units.daemon_reload(name="Reload systemd for the Docker proxy",
                            _if=lambda: render.DOCKER_PROXY in host_changed)
        systemd.service(name="Restart Docker for the proxy", service="docker", restarted=True,
                        _if=lambda: render.DOCKER_PROXY in host_changed)
        server.shell(name="Create the /dev/char links now", commands=["nvidia-ctk system create-dev-char-symlinks --create-all"],
                     _if=lambda: render.DEV_CHAR_RULE in host_changed)
    secrets = {render.VLLM_ENV: (render.env_file({"VLLM_API_KEY": _secret(s, "vllm_api_key")}), "0600"),
               render.API_AUTH: (f"Authorization: Bearer {_secret(s, 'vllm_api_key')}\n", "0600")}
    token = _secret(s, "hf_token")
    if token:
        secrets[render.HF_ENV] = (render.env_file({"HF_TOKEN": token}), "0600")
    seed_key = _secret(s, "weights_seed_key")
    if seed_key:
        # one fleet key lets a rebuilt host copy weights from a peer (weights_seed_from)
        secrets[weights.SEED_KEY] = (seed_key + "\n", "0600")
    files.managed(name="Secrets (0600, root only)", files=secrets, secret=True, dirs={render.ETC: "0700"})
    if seed_key and s.get("weights_seed_public_key_file"):
        pub = open(os.path.expanduser(s["weights_seed_public_key_file"])).read().strip()
        files_line(pub)
    if not token:
        files.absent(name="No stale HF token", paths=[render.HF_ENV])
    tk = facts["toolkit"]
    if p.gpu_method == "cdi" and not tk.get("cdi_specs"):
        if checks.vt(tk.get("version")) >= (1, 18):
            # CTK >= 1.18 keeps /var/run/cdi/nvidia.yaml current on driver/toolkit changes and at boot
            server.shell(name="Enable nvidia-cdi-refresh", commands=[
                "systemctl enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service"])
        else:
            server.shell(name="Generate the CDI spec", commands=["nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"])
    return daemon_changed


def _image_archive(s: dict, p: Plan) -> str | None:
    return s.get("vllm_image_archive") or (s.get("vllm_image_archives") or {}).get(p.image)


@deploy("nemofleet weights")
def fetch_weights(p: Plan) -> None:
    s = settings()
    docker.image(name=f"Image {p.image}", ref=p.image, archive=_image_archive(s, p))
    token_file = render.HF_ENV if _secret(s, "hf_token") else None
    seed = s.get("weights_seed_from")
    if isinstance(seed, str) and seed:
        seed = {"host": seed}
    for d in p.downloads:
        weights.model(name=f"Weights {d['repo']}@{d['revision'][:12]}", repo=d["repo"], revision=d["revision"],
                      directory=d["dir"], image=p.image, endpoint=p.env.get("HF_ENDPOINT"),
                      token_file=token_file, full_verify=s.get("weights_verify") == "full",
                      seed=seed or None)


def gpu_access_signature(s: dict, p: Plan, facts: dict) -> str:
    """What decides whether containers keep their GPUs once this run is done: the GPU method,
    Docker's cgroup driver, and the Docker, toolkit and driver versions (a run that rewrites
    other GPU keys of daemon.json forces the probe by itself)."""
    d, desired = facts["docker"], docker_settings(s, p, facts)
    # exec-opts None in `desired` removes the key (Docker's default driver); absent leaves it
    exec_opts = (desired["exec-opts"] or []) if "exec-opts" in desired else None
    cgroup = effective_cgroup_driver(exec_opts, d.get("cgroup_driver"), facts.get("cgroup"))
    return json.dumps({"method": p.gpu_method, "cgroup_driver": cgroup, "docker": d.get("server"),
                       "toolkit": facts["toolkit"].get("version"), "driver": facts["gpus"].get("driver")},
                      sort_keys=True)


def probe_gpu_access(s: dict, p: Plan, facts: dict, force: bool | set = False) -> None:
    hint = ("use CDI (Docker >= 25 and a CDI spec; nvml_remedy: cdi) or set nvml_remedy: cgroupfs"
            if p.gpu_method == "gpus" else "check the CDI spec (nvidia-ctk cdi list) and the toolkit")
    gpu_access.survives_daemon_reload(
        name="GPU access survives systemctl daemon-reload (probe)", image=p.image,
        gpu_args=render.gpu_args(p.gpu_method, p.instances[0].gpu_uuids[:1]),
        signature=gpu_access_signature(s, p, facts), remedy_hint=hint, force=force,
        recorded=facts.get("gpu_access"))


@deploy("nemofleet serving")
def serve(p: Plan, facts: dict, daemon_changed: set | None = None) -> None:
    s = settings()
    # before any unit (re)starts: a host that would lose its GPUs is failed here. Probed again
    # whenever this run rewrote daemon.json (e.g. repaired a drifted cgroup driver).
    probe_gpu_access(s, p, facts, force=daemon_changed if daemon_changed is not None else False)
    frontends = s.get("frontends") or DEFAULT_FRONTENDS
    if frontends:
        docker.networks(name="Frontend networks", wanted={f["network"]: bool(f.get("create")) for f in frontends})
    major = int(checks.vt(facts["docker"].get("server"))[0])
    changed: set = set()
    unit_files = {f"{render.UNIT_DIR}/{i.unit}": (render.unit(p, i, frontends, major, int(s.get("start_timeout", 1800))), "0644")
                  for i in p.instances}
    release = render.release_id(p)
    previous = (facts.get("release") or {}).get("id")
    if previous and previous != release:
        # keep the release being replaced (units + record) so `nemofleet rollback` can return to it
        server.shell(name=f"Keep release {previous} for rollback", commands=[
            f"set -e; d={render.STATE_DIR}/previous; rm -rf $d.new; mkdir -p $d.new; "
            f"cp {render.UNIT_DIR}/nemofleet-vllm-*.service $d.new/ 2>/dev/null || true; "
            f"cp {render.STATE_DIR}/release $d.new/release; rm -rf $d; mv $d.new $d"])
    files.managed(name="vLLM units", files=unit_files, changed=changed)
    units.daemon_reload(name="Reload systemd for changed units", _if=lambda: bool(changed))
    running = units.running(name="vLLM instances enabled and running", units=[i.unit for i in p.instances],
                            changed=changed)
    timeout = int(s.get("ready_timeout", 1200))
    addr = render.probe_address(p)
    server.shell(
        name="Wait until the (re)started instances are ready",
        commands=[
            f"wait_ready() {{ end=$(( $(date +%s) + {timeout} )); "
            f"until [ \"$(curl -s -o /dev/null -w '%{{http_code}}' http://{addr}:$2/health)\" = 200 ]; do "
            f"if [ $(date +%s) -gt $end ]; then echo \"instance $1 not ready after {timeout}s:\" >&2; "
            "journalctl -u nemofleet-vllm-$1 -n 20 --no-pager -o cat >&2; return 1; fi; sleep 2; done; }; "
            + " ".join(f"wait_ready {i.name} {i.host_port};" for i in p.instances)
        ],
        _if=lambda: running.did_change() and s.get("wait_ready", True),
    )
    if frontends:
        nets = {i.name: dict(render.frontend_networks(frontends, i, len(p.instances) == 1)) for i in p.instances}
        docker.attached(name="Instances on their frontend networks", containers=nets)
    record_changed: set = set()
    files.managed(name="Release record", files={f"{render.STATE_DIR}/release": (render.release_record(p), "0644")},
                  dirs={render.STATE_DIR: "0755"}, changed=record_changed)
    who = shlex.quote(f"{os.environ.get('USER') or 'root'}@{os.uname().nodename}")
    server.shell(name="Audit log", commands=[
        f"echo \"$(date -u +%FT%TZ) {who} release {previous or 'none'} -> {release} "
        f"({p.image}, {p.model.repo}@{p.model.revision[:12]}, {len(p.instances)} instance(s))\" >> {render.STATE_DIR}/audit.log"],
        _if=lambda: bool(record_changed))
    for fe in frontends:
        for i in p.instances:
            alias = dict(render.frontend_networks(frontends, i, len(p.instances) == 1))[fe["network"]]
            host.log(f"frontend {fe.get('name', fe['network'])}: base URL http://{alias}:8000/v1 "
                     f"model {p.served_name}", logger.info)


@deploy("nemofleet health")
def health(p: Plan) -> None:
    s = settings()
    files.managed(
        name="Health check script and cron",
        files={
            "/usr/local/bin/nemofleet-health": (render.health_script(p, s), "0755"),
            "/etc/cron.d/nemofleet-health": (render.health_cron(s), "0644"),
        },
    )


def files_line(pub: str) -> None:
    from pyinfra.operations import files as pfiles

    pfiles.line(name="Fleet seed key may read weights from this host", path="/root/.ssh/authorized_keys",
                line=f"^{re.escape(pub)}$", replace=pub, present=True)


def nemotron() -> None:
    """The main job: fresh GPU hosts to serving; a converged host changes nothing."""
    pending = bootstrap.install(settings())
    if pending:  # the driver/toolkit change first: preflight must see the host as it is then
        python.call(name="Preflight and converge on the freshly installed host", function=converge)
    elif pending is not None:
        converge()


def converge() -> None:
    p, facts = run_preflight()
    if p is None:
        return
    daemon_changed = configure_host(p, facts)
    fetch_weights(p)
    serve(p, facts, daemon_changed)
    health(p)


def gpu_probe_only() -> None:
    """Diagnose the NVML trap now: a test container must keep its GPU across daemon-reload."""
    p, facts = run_preflight()
    if p is None:
        return
    s = settings()
    docker.image(name=f"Image {p.image}", ref=p.image, archive=_image_archive(s, p))
    probe_gpu_access(s, p, facts, force=True)


def preflight_only() -> None:
    p, _ = run_preflight()
    if p is not None:
        host.log(f"preflight passed: {len(p.instances)} instance(s) of {p.model.key} "
                 f"(TP {p.instances[0].tp}, {p.instances[0].memory.summary()})", logger.info)
