"""The fleet gateway's decision: what a host of the inventory group `gateway` runs, a pure function
of its inputs like desired.decide (which hands a gateway host here). The gateway at run time --
draining a host's server and setting a canary's weight through HAProxy's runtime API during a
rollout -- is fleet/gateway.py.

A gateway host runs HAProxy from its distribution, like a GPU host's front door and through the same
steps (deploy._front_door, render.haproxy_config, operations.frontdoor.configured): roundrobin by
weight over `gateway_backends` (each GPU host's front door, or the instance port of a
single-instance host), /health checked every 2 s so a host that stops answering is ejected after
`gateway_fall` failures and taken back after `gateway_rise` passes, every response observed
(observe layer7), a failed answer retried on another host, the fleet's API key checked here against
a 0600 file and again by each host. No GPU, driver or Docker is needed or checked on a gateway host
(docs/gateway.md).
"""

from __future__ import annotations

from typing import Any

from . import paths, render
from . import settings as settings_mod
from .inputs import HostInputs
from .secret import reveal
from .valuetypes import Refusal


def binds(s: settings_mod.Settings) -> list[str]:
    port, addr = s.gateway_port, s.gateway_address
    if addr == "0.0.0.0":
        return [f"0.0.0.0:{port}"]
    return [f"127.0.0.1:{port}"] + ([f"{render.url_host(addr)}:{port}"] if addr != "127.0.0.1" else [])


def servers(s: settings_mod.Settings) -> list[tuple[str, str]]:
    return [(b.name, f"{render.url_host(b.host)}:{b.port}") for b in s.gateway_backends]


def config(host: str, s: settings_mod.Settings) -> str:
    fall, rise = s.gateway_fall, s.gateway_rise
    header = [
        f"Managed by nemofleet: the fleet gateway on {host} (rendered from gateway_backends; do not edit).",
        "One OpenAI-compatible endpoint across the fleet's GPU hosts: requests in turn by weight across",
        f"their endpoints, /health checked every 2 s (a backend is ejected after {fall} failed checks and",
        f"taken back after {rise} passed ones) and every response observed, the API key checked here",
        f"(patterns in {paths.FRONT_DOOR_KEYS}, 0600, read at load) and again by each host.",
        "Validated with `haproxy -c -f` before it replaces the live file; applied with `systemctl reload`."]
    return render.haproxy_config(header, "gateway", binds(s), servers(s), s.front_door_timeout,
                                 fall=fall, rise=rise, gateway=True)


def decide(i: HostInputs, secret_refusals: list[str]) -> dict[str, Any]:
    """The gateway's desired state as the fields of a desired.Desired; refusals (one sentence each,
    with its code) and nothing else when it cannot be one. `secret_refusals`: the decision's own
    verdict on the host's secrets (no API key)."""
    host, s = i.name, i.settings
    head: dict[str, Any] = dict(host=host, summary=f"gateway host {host}")
    refusals = [r for r in i.refusals if not r.startswith("could not read ")]  # no GPU facts are read there
    if s is None or refusals:
        return dict(head, refusals=refusals)
    refusals += secret_refusals
    if not s.gateway_backends:
        refusals.append(Refusal("gateway_backends is empty: list the model endpoints of the GPU hosts "
                                "(e.g. [{\"host\": \"10.0.0.5\", \"port\": 8800}]; docs/gateway.md)", "gateway"))
    if refusals:
        return dict(head, refusals=refusals, settings=s)
    where = host if s.gateway_address in ("0.0.0.0", "::") else s.gateway_address
    return dict(
        head, settings=s, front_door=True, front_door_config=config(host, s), secret_dirs={paths.ETC: "0700"},
        front_door_secrets={paths.FRONT_DOOR_KEYS: (f"Bearer {reveal(i.secrets['vllm_api_key'])}\n", "0600")},
        frontend_lines=[f"gateway: base URL http://{render.url_host(where)}:{s.gateway_port}/v1 over "
                        f"{len(s.gateway_backends)} backend(s) ({', '.join(t for _, t in servers(s))})"])
