"""The fleet gateway (deploys/gateway.py): one OpenAI-compatible endpoint across GPU hosts.

A host of the inventory group `gateway` runs HAProxy from its distribution, like a GPU host's
front door and through the same steps (`deploy.front_door`, `render.haproxy_config`,
`operations.frontdoor.configured`): leastconn over `gateway_backends` (each GPU host's front door,
or the instance port of a single-instance host), /health checked every 2 s so a host that stops
answering is ejected after `gateway_fall` failures and taken back after `gateway_rise` passes,
every response observed (observe layer7), the fleet's API key checked here against a 0600 file
and again by each host, config validated with `haproxy -c` before it is live, reloaded (never
restarted) when it changes. No GPU, driver or Docker is needed or checked on a gateway host.

`build()` is pure (unit-tested); `gateway()` turns it into operations.
"""

from __future__ import annotations

from pyinfra.api import deploy

from . import paths, render
from . import settings as settings_mod
from .desired import Desired, _secrets_ok
from .fleet.driver import GATEWAY_GROUP as GROUP  # one name for the group; rollouts and status skip it


def binds(s: settings_mod.Settings) -> list[str]:
    port, addr = s["gateway_port"], s["gateway_address"]
    if addr == "0.0.0.0":
        return [f"0.0.0.0:{port}"]
    return [f"127.0.0.1:{port}"] + ([f"{render.url_host(addr)}:{port}"] if addr != "127.0.0.1" else [])


def servers(s: settings_mod.Settings) -> list[tuple[str, str]]:
    return [(b.get("name") or f"{b['host']}:{b['port']}", f"{render.url_host(b['host'])}:{b['port']}")
            for b in s["gateway_backends"]]


def config(host: str, s: settings_mod.Settings) -> str:
    fall, rise = s["gateway_fall"], s["gateway_rise"]
    header = [
        f"Managed by nemofleet: the fleet gateway on {host} (rendered from gateway_backends; do not edit).",
        "One OpenAI-compatible endpoint across the fleet's GPU hosts: least outstanding requests across",
        f"their endpoints, /health checked every 2 s (a backend is ejected after {fall} failed checks and",
        f"taken back after {rise} passed ones) and every response observed, the API key checked here",
        f"(patterns in {paths.FRONT_DOOR_KEYS}, 0600, read at load) and again by each host.",
        "Validated with `haproxy -c -f` before it replaces the live file; applied with `systemctl reload`."]
    return render.haproxy_config(header, "gateway", binds(s), servers(s), s["front_door_timeout"], fall=fall, rise=rise)


def build(host: str, data: dict, secrets: dict) -> Desired:
    """The gateway's desired state; refusals (one sentence each) and nothing else when it cannot be one."""
    d = Desired(host=host, summary=f"gateway host {host}")
    try:
        s = settings_mod.parse(data)
    except settings_mod.SettingsError as exc:
        d.refusals += exc.problems
        return d
    d.settings = s
    _secrets_ok(s, secrets, d)
    if not s["gateway_backends"]:
        d.refusals.append("gateway_backends is empty: list the model endpoints of the GPU hosts "
                          "(e.g. [{\"host\": \"10.0.0.5\", \"port\": 8800}]; docs/gateway.md)")
    if d.refusals:
        return d
    d.front_door = True
    d.front_door_config = config(host, s)
    d.front_door_secrets = {paths.FRONT_DOOR_KEYS: (f"Bearer {secrets['vllm_api_key']}\n", "0600")}
    d.secret_dirs = {paths.ETC: "0700"}
    d.frontend_lines = [f"gateway: base URL http://{render.url_host(_where(s['gateway_address'], host))}:"
                        f"{s['gateway_port']}/v1 over {len(s['gateway_backends'])} backend(s) "
                        f"({', '.join(t for _, t in servers(s))})"]
    return d


def _where(addr: str, host: str) -> str:
    return host if addr in ("0.0.0.0", "::") else addr


@deploy("nemofleet gateway preflight")
def _preflight() -> Desired:
    from pyinfra import host

    from .deploy import data, read_secrets
    from .operations import preflight

    d = data()
    want = build(host.name, d, read_secrets(d))
    preflight.verdict(name="Preflight: can this host be the gateway?", refusals=want.refusals)
    return want


@deploy("nemofleet gateway")
def _configure(want: Desired) -> None:
    from pyinfra import host, logger

    from .deploy import front_door
    from .facts import prefetch
    from .operations import files, frontdoor

    prefetch.load([files.reads(want.front_door_secrets, want.secret_dirs), frontdoor.reads(paths.FRONT_DOOR_CFG)])
    front_door(want, label="Gateway", secret_dirs=want.secret_dirs)
    for line in want.frontend_lines:
        host.log(line, logger.info)


def gateway() -> None:
    """deploys/gateway.py: configure the hosts of group `gateway`; any other host is left alone."""
    from pyinfra import host, logger

    if GROUP not in (host.groups or ()):
        host.log(f"not in inventory group {GROUP}: deploys/gateway.py leaves this host alone", logger.info)
        return
    want = _preflight()
    if not want.refusals:
        _configure(want)
