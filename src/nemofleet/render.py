"""Render the plan into file contents (systemd units, the health program's config, cron, env files).

Pure functions of (plan, settings): no host access, so they are unit-tested with golden
strings and `systemd-analyze verify`. Every value is quoted for where it goes: `systemd_word`
for ExecStart lines, `shell.quote` for the drain script, JSON for the health program's config,
patterns in settings.py for cron and Environment= lines.
"""

from __future__ import annotations

import hashlib
import json
import re

import jinja2

from . import paths, remote, shell
from .nvsmi import HEALTH_FIELDS, RESETS_FILE
from .gpuhealth import DRAIN_XIDS
from .plan_types import CONTAINER_PORT, Instance, Plan

DEV_CHAR_RULE_TEXT = (
    "# Managed by nemofleet: /dev/char links for NVIDIA devices (NVIDIA Container Toolkit, runc)\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n')


# templates from the installed package (nemofleet/templates: the repository's top-level templates/,
# shipped inside the wheel)
_env = jinja2.Environment(
    loader=jinja2.PackageLoader("nemofleet", "templates"), undefined=jinja2.StrictUndefined,
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
)
_env.filters["sh"] = shell.quote  # the drain script's values (templates/nemofleet-drain.sh.j2)
# free text in unit files: no line breaks, and % would be read as a systemd specifier
_env.filters["sysd"] = lambda v: re.sub(r"[\x00-\x1f]", " ", str(v)).replace("%", "%%")
# HAProxy: a word of a statement (haproxy_word), and free text in a comment line (no line break)
_env.filters["hap"] = lambda v: haproxy_word(v)
_env.filters["comment"] = lambda v: re.sub(r"[\x00-\x1f\x7f]", " ", str(v))

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def systemd_word(word: str) -> str:
    """Quote one ExecStart argument for systemd (quotes are removed by systemd, % and $ expand).
    One argument is always one word on one line: a control character (a newline would start a
    new directive) is written as systemd's C escape \\xNN inside the quotes."""
    word = str(word).replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(word):  # fullmatch: `$` would let a trailing newline through
        return word
    word = word.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + _CONTROL.sub(lambda m: "\\x%02x" % ord(m.group()), word) + "'"


_HAPROXY_WORD = re.compile(r"[A-Za-z0-9_.:\[\]-]+")


def haproxy_word(word) -> str:
    """One word of an HAProxy statement (a bind address:port, a server name or address:port).
    HAProxy splits on spaces and ends a statement at a newline, so anything but letters, digits
    and `_ . : [ ] -` is refused here (settings.py types these values; this is the last guard)."""
    text = str(word)
    if not _HAPROXY_WORD.fullmatch(text):
        raise ValueError(f"{text!r} cannot be one word of an HAProxy statement")
    return text


def release_id(plan: Plan) -> str:
    """A release is (image, model revision, rendered flags): its id names it on the host."""
    blob = json.dumps([plan.image, plan.model.repo, plan.model.revision,
                       [i.args for i in plan.instances]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def release_record(plan: Plan) -> str:
    """/var/lib/nemofleet/release: what this host serves (no timestamps: it must not churn)."""
    return (f"id={release_id(plan)}\nimage={plan.image}\nmodel={plan.model.repo}@{plan.model.revision}\n"
            f"instances={','.join(i.name for i in plan.instances)}\n")


def frontend_networks(frontends, inst: Instance, single: bool) -> list[tuple[str, str]]:
    """(network, alias) of each frontend (settings.Frontend) an instance joins."""
    nets = []
    for fe in frontends:
        alias = fe.alias or inst.name
        if not single:
            alias = f"{alias}-{inst.name.rsplit('-', 1)[-1]}" if fe.alias else inst.name
        nets.append((fe.network, alias))
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
    if inst.group:
        # a multi-node group member: the host's network, so NCCL, the rendezvous and VLLM_HOST_IP
        # see the host's own addresses (vLLM's run_cluster.sh does the same); the head's API
        # listens on bind_address:port_base itself (docs/recipes.md#multi-node)
        w += ["--ipc=host", "--shm-size=16g", "--network=host"]
    else:
        w += ["--ipc=host", "--shm-size=16g", "-p", f"{url_host(plan.bind_address)}:{inst.host_port}:{CONTAINER_PORT}"]
    if nets and not inst.group:
        if legacy_networks:  # Docker < 25: one --network at create time, the rest connected after
            w += [f"--network={nets[0][0]}", f"--network-alias={nets[0][1]}"]
        else:
            w += [f"--network=name={n},alias={a}" for n, a in nets]
    for m in plan.mounts:
        w += ["-v", f"{m.host}:{m.container}:ro"]
    w += ["-v", f"{paths.COMPILE_CACHE}/{inst.name}:/root/.cache/vllm", f"--env-file={paths.VLLM_ENV}"]
    for k, v in sorted(plan.env.items()):
        w += ["-e", f"{k}={v}"]
    w.append(plan.image)
    w += inst.args
    return [systemd_word(x) for x in w]


def unit(plan: Plan, inst: Instance, frontends, docker_major: int, start_timeout: int = 1800) -> str:
    # Docker < 25 takes one --network at create time: create, connect the others, start
    # (docs/recipes.md, "Units")
    connect_after_create = docker_major < 25 and len(frontends) > 1
    nets = frontend_networks(frontends, inst, len(plan.instances) == 1)
    drain = int(inst.args[inst.args.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in inst.args else 0
    g = inst.group
    # a worker waits for the head's rendezvous port (bounded), so the head starts first; the
    # head's /health answers only once every member has joined
    wait_head = ([systemd_word(x) for x in join_wait(g.head_address, g.port, g.join_timeout)]
                 if g and not g.head else [])
    return _env.get_template("vllm.service.j2").render(
        host=plan.host, i=inst, served_name=plan.served_name, wait_head=wait_head,
        group=(f"rank {g.rank} ({g.role}) of serving group {g.name}" if g else ""),
        gpu_indices=",".join(str(g.index) for g in inst.gpus), start_timeout=start_timeout,
        docker_stop=drain + 30, stop_timeout=drain + 60, connect_after_create=connect_after_create,
        run_words=run_words(plan, inst, nets, connect_after_create, docker_major < 25), later_networks=[(systemd_word(n), systemd_word(a)) for n, a in nets[1:]] if connect_after_create else [],
    )


# bash's /dev/tcp wait: a constant program; the address and port reach it as its arguments
# ($1, $2), never as part of its text
JOIN_WAIT_SCRIPT = 'until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do sleep 2; done'


def join_wait(address: str, port: int, timeout: int) -> list[str]:
    """argv that waits (at most `timeout` s) until `address:port` accepts a TCP connection.
    `address` is the head's typed IP (multinode.member_address); it is still only an argument."""
    return ["/usr/bin/timeout", str(int(timeout)), "/bin/bash", "-c", JOIN_WAIT_SCRIPT, "join-wait",
            str(address), str(int(port))]


def url_host(address: str) -> str:
    """An IPv6 address in brackets, as `docker run -p` and URLs need it."""
    return f"[{address}]" if ":" in address else address


def probe_address(plan: Plan) -> str:
    """Where checks on the host reach the published ports (as it goes in a URL)."""
    return "127.0.0.1" if plan.bind_address in ("0.0.0.0", "::", "127.0.0.1") else url_host(plan.bind_address)


def health_program() -> str:
    """/usr/local/bin/nemofleet-health: the program remote/health.py, the same on every host (what it
    checks is in its config, health_config)."""
    return remote.source("health")


def health_config(plan: Plan, s, front_door: bool = False) -> str:
    """/etc/nemofleet/health.json: what the health program checks on this host, as JSON (no value of
    it is ever run as code; the webhook URL is not in it but in health.conf, 0600)."""
    group = next((i.group for i in plan.instances if i.group), None)
    config = {
        "host": plan.host, "address": probe_address(plan), "prom_dir": s.prom_dir,
        "state_dir": paths.HEALTH_STATE, "conf": paths.HEALTH_CONF, "auth_header": paths.API_AUTH,
        # the front door's drain script ("" without a front door)
        "drain": paths.DRAIN_SCRIPT if front_door else "",
        "check_infer": 1 if s.health_check_infer else 0, "fail_restart": s.health_fail_restart,
        "restart_grace": s.health_restart_grace, "restarts_per_hour": s.health_restarts_per_hour,
        # nvidia-smi query fields (fewer once the driver refused one: <state_dir>/gpu-fields), the Xid
        # codes that mean the GPU must stop serving, and the GPU resets recorded (docs/gpu-health.md)
        "gpu_fields": list(HEALTH_FIELDS), "drain_xids": sorted(DRAIN_XIDS), "resets_file": RESETS_FILE,
        # a headless worker of a serving group has port 0: no API, checked by its unit and the head's port
        "instances": [{"name": i.name, "port": 0 if i.group and not i.group.head else int(i.host_port),
                       "model": plan.served_name, "unit": i.unit} for i in plan.instances],
        "gpus": [{"instance": i.name, "uuid": g.uuid} for i in plan.instances for g in i.gpus],
        # this host's part of a multi-node serving group: the head's /health passes only while every
        # member is joined
        "group": {"name": group.name, "role": group.role, "rank": group.rank, "head": group.head_address,
                  "port": int(group.port)} if group else None,
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


FRONT_DOOR_DROPIN_TEXT = (
    "# Managed by nemofleet: the front door listens on the Docker bridge gateway, which exists once\n"
    "# dockerd has started.\n[Unit]\nAfter=docker.service\nWants=docker.service\n")


def front_door_binds(s, bridge: str | None) -> list[str]:
    """Where the front door listens: loopback (clients on the host, the load generator) and the
    address containers reach the host on (front_door_address, else Docker's bridge gateway)."""
    port = s.front_door_port
    extra = s.front_door_address or bridge
    if extra in ("0.0.0.0", "::"):  # every address, loopback included
        return [f"{url_host(extra)}:{port}"]
    binds = [f"127.0.0.1:{port}"]
    if extra and extra not in ("127.0.0.1",):
        binds.append(f"{url_host(extra)}:{port}")
    return binds


# A request is buffered whole (option http-buffer-request) so that it can be retried on another
# server; HAProxy replays only a request that fits one buffer (its manual, retry-on). 256 KiB holds
# a chat request of about 60k tokens of English text; each request in flight takes two such
# buffers (and a third while a retry is possible), allocated only while it is in flight.
PROXY_BUFSIZE = 262144
PROXY_RETRIES = 3  # further tries of one request, each on another server (option redispatch 1)
GATEWAY_STATE = "/var/lib/haproxy/nemofleet-server-state"  # the gateway's runtime state across reloads
GATEWAY_WEIGHT = 100  # each gateway server's full weight: a canary's share is set as a fraction of it


def haproxy_config(header: list[str], frontend: str, binds: list[str], servers: list[tuple[str, str]],
                   timeout: int, fall: int, rise: int, inter: int = 2, gateway: bool = False) -> str:
    """The one HAProxy config nemofleet writes (templates/haproxy.cfg.j2), for a host's front door
    and for the fleet gateway alike: `servers` [(name, "address:port")], /health checked every
    `inter` s (down after `fall` failures, back after `rise` passes) and every response observed,
    a failed answer retried on another server, the key checked against paths.FRONT_DOOR_KEYS, long
    timeouts for streams. A front door balances leastconn over its equal instances; the gateway
    balances roundrobin, the one algorithm that keeps a canary at its weight (docs/gateway.md), and
    keeps its runtime state (drains, weights) across a reload."""
    return _env.get_template("haproxy.cfg.j2").render(
        header=header, frontend=frontend, keys_file=paths.FRONT_DOOR_KEYS, socket=paths.FRONT_DOOR_SOCKET,
        backend=paths.FRONT_DOOR_BACKEND, timeout=timeout, maxconn=4096, binds=binds, servers=servers,
        inter=inter, fall=fall, rise=rise, bufsize=PROXY_BUFSIZE, retries=PROXY_RETRIES,
        balance="roundrobin" if gateway else "leastconn", weight=GATEWAY_WEIGHT if gateway else None,
        state_file=GATEWAY_STATE if gateway else None)


def front_door_config(plan: Plan, s, bridge: str | None) -> str:
    header = [
        f"Managed by nemofleet: the front door of {plan.host} (rendered from its serving plan; do not edit).",
        f"One OpenAI-compatible endpoint for {plan.served_name}: least outstanding requests across the",
        "instances, /health checked actively and every response observed passively, the API key checked",
        f"here (patterns in {paths.FRONT_DOOR_KEYS}, 0600, read at load) and again by each instance.",
        "Validated with `haproxy -c -f` before it replaces the live file; applied with `systemctl reload`."]
    address = probe_address(plan)
    return haproxy_config(header, "front_door", front_door_binds(s, bridge),
                          [(i.name, f"{address}:{i.host_port}") for i in plan.instances],
                          s.front_door_timeout, fall=2, rise=1)


def drain_script(plan: Plan, s) -> str:
    return _env.get_template("nemofleet-drain.sh.j2").render(
        host=plan.host, instances=plan.instances, served_name=plan.served_name, address=probe_address(plan),
        group=next((i.group for i in plan.instances if i.group), None),
        socket=paths.FRONT_DOOR_SOCKET, backend=paths.FRONT_DOOR_BACKEND, drain_seconds=s.drain_seconds,
        ready_timeout=s.ready_timeout)


def health_conf(s) -> str:
    """/etc/nemofleet/health.conf (0600): what the health program must not read from a 0644 file.
    KEY=value lines, read as text (never sourced): the URL is checked in settings.py to be one line."""
    text = "# Managed by nemofleet: read by /usr/local/bin/nemofleet-health (root only).\n"
    if s.health_webhook_url:
        text += f"DEFAULT_WEBHOOK_URL={s.health_webhook_url.reveal()}\n"  # a 0600 file
    return text


def health_cron(s) -> str:
    from .valuetypes import cron_problem

    if cron_problem(s.health_schedule):  # settings.py refuses it first; never a second cron line
        raise ValueError(f"health_schedule {cron_problem(s.health_schedule)}")
    return _env.get_template("nemofleet-health.cron.j2").render(schedule=s.health_schedule)


def docker_proxy(s) -> str | None:
    """The dockerd proxy drop-in; values are URLs checked in settings.py (no quote, % or newline
    can reach the Environment= lines)."""
    keys = {"http_proxy": s.http_proxy, "https_proxy": s.https_proxy, "no_proxy": s.no_proxy}
    if not any(keys.values()):
        return None
    return _env.get_template("docker-proxy.conf.j2").render(**keys)


def env_file(values: dict[str, str]) -> str:
    """KEY=value lines for docker --env-file; values were checked to hold no newline."""
    for k, v in values.items():
        if "\n" in str(v) or "\r" in str(v):
            raise ValueError(f"{k} must be one line")
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items()))


def first_health_check() -> str:
    """One run of the health script by the deploy, under the cron's lock (waiting up to 60 s for a
    run in progress), bounded to 300 s; its verdict is the health cron's business, never the deploy's
    (an unhealthy instance is reported by the script and by `nemofleet status`)."""
    return shell.join(["timeout", "300", "flock", "-w", "60", paths.HEALTH_LOCK, paths.HEALTH_SCRIPT]) + " || true"
