"""Render the plan into file contents (systemd units, health script, cron, env files).

Pure functions of (plan, settings): no host access, so they are unit-tested with golden
strings and `systemd-analyze verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import jinja2

from .plan import CONTAINER_PORT, Instance, Plan

TEMPLATES = Path(os.environ.get("NEMOFLEET_TEMPLATES") or Path(__file__).resolve().parents[2] / "templates")
UNIT_DIR = "/etc/systemd/system"
ETC = "/etc/nemofleet"
VLLM_ENV = f"{ETC}/vllm.env"
API_AUTH = f"{ETC}/api-auth.header"
HF_ENV = f"{ETC}/hf.env"
STATE_DIR = "/var/lib/nemofleet"
COMPILE_CACHE = "/var/cache/nemofleet/vllm"
DOCKER_PROXY = "/etc/systemd/system/docker.service.d/nemofleet-proxy.conf"
DEV_CHAR_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
DEV_CHAR_RULE_TEXT = (
    "# Managed by nemofleet: /dev/char links for NVIDIA devices (NVIDIA Container Toolkit, runc)\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n')

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
)

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_word(word: str) -> str:
    """Quote one ExecStart argument for systemd (quotes are removed by systemd, % and $ expand)."""
    word = str(word).replace("%", "%%").replace("$", "$$")
    if _SAFE.match(word):
        return word
    return "'" + word.replace("\\", "\\\\").replace("'", "\\'") + "'"


def release_id(plan: Plan) -> str:
    """A release is (image, model revision, rendered flags): its id names it on the host."""
    blob = json.dumps([plan.image, plan.model.repo, plan.model.revision,
                       [i.args for i in plan.instances]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def release_record(plan: Plan) -> str:
    """/var/lib/nemofleet/release: what this host serves (no timestamps: it must not churn)."""
    return (f"id={release_id(plan)}\nimage={plan.image}\nmodel={plan.model.repo}@{plan.model.revision}\n"
            f"instances={','.join(i.name for i in plan.instances)}\n")


def frontend_networks(frontends: list[dict], inst: Instance, single: bool) -> list[tuple[str, str]]:
    nets = []
    for fe in frontends:
        alias = fe.get("alias") or inst.name
        if not single:
            alias = f"{alias}-{inst.name.rsplit('-', 1)[-1]}" if fe.get("alias") else inst.name
        nets.append((fe["network"], alias))
    return nets


def gpu_args(method: str, uuids: list[str]) -> list[str]:
    """docker run arguments that give a container these GPUs: CDI device requests, or the
    legacy --gpus hook (the quotes keep docker's CSV parser from splitting the list)."""
    if method == "cdi":
        return [f"--device=nvidia.com/gpu={u}" for u in uuids]
    return ["--gpus", f'"device={",".join(uuids)}"']


def run_words(plan: Plan, inst: Instance, nets: list[tuple[str, str]], connect_after_create: bool,
              legacy_networks: bool) -> list[str]:
    w = ["--rm", f"--name={inst.name}"]
    if not connect_after_create:
        w.append("--pull=never")
    w += gpu_args(plan.gpu_method, inst.gpu_uuids)
    w += ["--ipc=host", "--shm-size=16g", "-p", f"{plan.bind_address}:{inst.host_port}:{CONTAINER_PORT}"]
    if nets:
        if legacy_networks:  # Docker < 25: one --network at create time, the rest connected after
            w += [f"--network={nets[0][0]}", f"--network-alias={nets[0][1]}"]
        else:
            w += [f"--network=name={n},alias={a}" for n, a in nets]
    for m in plan.mounts:
        w += ["-v", f"{m.host}:{m.container}:ro"]
    w += ["-v", f"{COMPILE_CACHE}/{inst.name}:/root/.cache/vllm", f"--env-file={VLLM_ENV}"]
    for k, v in sorted(plan.env.items()):
        w += ["-e", f"{k}={v}"]
    w.append(plan.image)
    w += inst.args
    return [systemd_word(x) for x in w]


def unit(plan: Plan, inst: Instance, frontends: list[dict], docker_major: int, start_timeout: int = 1800) -> str:
    connect_after_create = docker_major < 25 and len(frontends) > 1  # reference §6, §7
    nets = frontend_networks(frontends, inst, len(plan.instances) == 1)
    drain = int(inst.args[inst.args.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in inst.args else 0
    return _env.get_template("vllm.service.j2").render(
        host=plan.host, i=inst, served_name=plan.served_name,
        gpu_indices=",".join(str(g.index) for g in inst.gpus), start_timeout=start_timeout,
        docker_stop=drain + 30, stop_timeout=drain + 60, connect_after_create=connect_after_create,
        run_words=run_words(plan, inst, nets, connect_after_create, docker_major < 25), later_networks=nets[1:] if connect_after_create else [],
    )


def probe_address(plan: Plan) -> str:
    """Where checks on the host reach the published ports."""
    return "127.0.0.1" if plan.bind_address in ("0.0.0.0", "::", "127.0.0.1") else plan.bind_address


def health_script(plan: Plan, settings: dict) -> str:
    return _env.get_template("nemofleet-health.sh.j2").render(
        host=plan.host, instances=plan.instances, served_name=plan.served_name, address=probe_address(plan),
        check_infer=1 if settings.get("health_check_infer") else 0,
        fail_restart=int(settings.get("health_fail_restart", 0) or 0),
        webhook_url=settings.get("health_webhook_url") or "",
        prom_dir=settings.get("prom_dir", "/var/lib/prometheus/node-exporter"),
    )


def health_cron(settings: dict) -> str:
    return _env.get_template("nemofleet-health.cron.j2").render(schedule=settings.get("health_schedule", "* * * * *"))


def docker_proxy(settings: dict) -> str | None:
    keys = {k: settings.get(k) for k in ("http_proxy", "https_proxy", "no_proxy")}
    if not any(keys.values()):
        return None
    return _env.get_template("docker-proxy.conf.j2").render(**keys)


def env_file(values: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items()))
