"""The fleet gateway during a rollout, a rollback and a rebuild (issue 49, docs/gateway.md).

When the inventory has hosts of group `gateway`, a host's server on every gateway (the server
named like the host in the inventory) is drained before the host changes -- no new request, those
in flight finish, at most the host's drain_seconds -- and set ready again once it passed the
health gate (a canary: set to its weight while it bakes). The runtime API is the gateway's admin
socket (root only), spoken by the program remote/haproxy_api.py over SSH; each change is written
to the gateway's server-state file, so a reload of its config keeps it. A gateway that does not
answer refuses the command before any host changes, unless --no-gateway-drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import paths, remote, render, shell
from ..valuetypes import host_number, reads_host
from . import driver
from .driver import FleetError

DRAINED = 0x08 | 0x10  # HAProxy's admin flags: drained through the API, or inherited (SRV_ADMF_*DRAIN)
FULL = render.GATEWAY_WEIGHT


@dataclass
class Server:
    name: str
    op: int  # 0 stopped (DOWN), 2 running
    admin: int
    weight: int
    scur: int  # requests in flight

    @property
    def drained(self) -> bool:
        return bool(self.admin & DRAINED)


@reads_host(lambda why, lines: {})
def parse(lines) -> dict[str, Server]:
    """haproxy_api.py's `server NAME op= admin= weight= scur=` lines; a line that is not one
    (another program's words, a number out of range) is left out."""
    out = {}
    for line in lines:
        word = str(line).split()
        if len(word) != 6 or word[0] != "server":
            continue
        kv = dict(w.partition("=")[::2] for w in word[2:])
        nums = [host_number(kv.get(k), 0, 1 << 20) for k in ("op", "admin", "weight", "scur")]
        ints = [n for n in nums if isinstance(n, int)]
        if len(ints) == 4:
            out[word[1]] = Server(word[1], *ints)
    return out


def command(action: str, *args, seconds: int = 30) -> str:
    return shell.join(remote.argv("haproxy_api", paths.FRONT_DOOR_SOCKET, paths.FRONT_DOOR_BACKEND,
                                  render.GATEWAY_STATE, seconds, action, *args))


def canary_weight(share: float, canary: int, servers: int) -> int:
    """The weight (of FULL) that gives `canary` servers `share` (0-1) of the requests together,
    the other servers at FULL: c*w / (c*w + (n-c)*FULL) = share; 1 at the least."""
    rest = servers - canary
    if rest <= 0 or share >= 1:
        return FULL
    return max(1, min(FULL, round(FULL * share * rest / (canary * (1 - share)))))


def gateway_hosts(inventory: str) -> list[str]:
    return [h for h, g in driver.host_groups(inventory).items() if driver.GATEWAY_GROUP in g]


class Gateways:
    """The inventory's gateway hosts, spoken to over one kept connection each."""

    def __init__(self, inventory: str, hosts: list[str], log=print, use: bool = True):
        self.gateways = gateway_hosts(inventory)
        self.log, self.session, self.error = log, None, ""
        specs = driver.host_specs(inventory, hosts) if self.gateways else {}
        self.drain_seconds = {h: (s.settings.drain_seconds if s.settings else 30) for h, s in specs.items()}
        self.servers: dict[str, dict[str, Server]] = {}  # per gateway, as last read
        self.drained: set[str] = set()  # the hosts this run drained and has not set ready yet
        if self.gateways and not use:
            log(f"  gateway: --no-gateway-drain: hosts are not drained at {', '.join(self.gateways)} "
                "(clients may see failed requests while a host restarts)")
        elif self.gateways:
            try:
                self.session = driver.Session(inventory, self.gateways)
            except Exception as exc:  # noqa: BLE001 - the inventory's gateways cannot be reached at all
                self._refuse(f"({str(exc)[:120]})")
            self.check([])  # every gateway answers, before the lock is taken or any host changes

    def __bool__(self) -> bool:
        return self.session is not None

    def _refuse(self, why: str) -> None:
        self.close()
        raise FleetError(f"the gateway {', '.join(self.gateways)} cannot be reached over its runtime API {why}: "
                         "no host was changed; fix it, or go on without draining hosts at the gateway (clients may "
                         "see failed requests) with --no-gateway-drain")

    def _all(self, action: str, *args, seconds: int = 30) -> bool:
        if self.session is None:
            return True
        ok = True
        for gw in self.gateways:
            e = self.session.run(gw, command(action, *args, seconds=seconds), timeout=seconds + 30)
            if e.rc != 0:
                ok, self.error = False, f"{gw}: {(e.lines() or ['no answer'])[-1][:200]}"
                self.log(f"  gateway {action} {' '.join(map(str, args))} failed on {self.error}")
            else:
                self.servers[gw] = parse(e.lines())
        return ok

    def check(self, hosts: list[str]) -> list[str]:
        """Every gateway answers (else the refusal), and each of `hosts` its leftover drain or
        weight names, which a run that stopped (a halt, Ctrl-C, a killed controller) left: put back."""
        if not self:
            return []
        if not self._all("show"):
            self._refuse(f"({self.error})")
        behind = {h for srv in self.servers.values() for h in srv}
        if [h for h in hosts if h not in behind]:
            self.log(f"  gateway: no server named {', '.join(h for h in hosts if h not in behind)} on "
                     f"{', '.join(self.gateways)}: not drained there (name a backend after its host)")
        left = sorted({h for _, h, _ in self.held_out(hosts)})
        if left:
            self.log(f"  gateway: {', '.join(left)} left drained or at a canary weight by a run that stopped: "
                     "set ready at full weight again")
            self._all("ready", *left)
        return left

    def held_out(self, hosts: list[str]) -> list[tuple[str, str, Server]]:
        """(gateway, host, its server) for each of `hosts` drained or below full weight, as last read."""
        return [(gw, h, srv[h]) for gw, srv in self.servers.items() for h in hosts
                if h in srv and (srv[h].drained or srv[h].weight != FULL)]

    def drain(self, hosts: list[str]) -> None:
        """No new request to `hosts`; returns once those in flight finished (at most their
        drain_seconds, then they are cut by the host's own stop)."""
        seconds = max([self.drain_seconds.get(h, 30) for h in hosts] + [1]) + 5
        self.drained |= set(hosts)
        if self._all("drain", *hosts, seconds=seconds):
            busy = {h: s.scur for srv in self.servers.values() for h, s in srv.items() if h in hosts and s.scur}
            self.log(f"  gateway: {', '.join(hosts)} drained" + (f" ({busy} request(s) still in flight after "
                                                                   f"{seconds - 5}s)" if busy else ""))

    def ready(self, hosts: list[str], share: float | None = None, canary: int = 0) -> int:
        """`hosts` back at full weight; with `share`, at the weight giving them that share of the
        requests together (the weighted canary). Returns the weight set."""
        if not self or not hosts:
            return FULL
        # the servers that serve (a host out of the gateway counts for nothing) and these hosts
        n = max([sum(s.op == 2 or h in hosts for h, s in srv.items()) for srv in self.servers.values()] + [0])
        w = FULL if share is None else canary_weight(share, canary or len(hosts), n)
        shown = f"{100 * share:g}" if share is not None else "100"
        self.drained -= set(hosts)
        if w == FULL:
            self._all("ready", *hosts)
        else:
            self._all("weight", w, *hosts)
            self.log(f"  gateway: {', '.join(hosts)} at weight {w} of {FULL} ({shown}% of the requests)")
        return w

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        """Whatever happened, the hosts drained by this run are set ready (a host that does not
        serve is kept out by the gateway's own health checks), and the connections closed."""
        if self.drained:
            self.ready(sorted(self.drained))
        self.close()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def min_requests(slo_min: int, weight: int) -> int:
    """The canary's minimum requests for the bake at `weight`: the --slo-min-requests a host at full
    weight must serve, scaled to the share its weight gives it (a thin canary is its weight's doing,
    not the release's), never under 10."""
    return max(10, math.ceil(slo_min * weight / FULL))


def status_lines(inventory: str, hosts: list[str]) -> dict[str, list[str]]:
    """`nemofleet status`: {host: lines} for each host drained or held at a canary weight on a
    gateway, with the fix ("" for a gateway that did not answer)."""
    try:
        gws = Gateways(inventory, hosts, log=lambda _: None)
    except FleetError as exc:
        return {"": [f"{str(exc).split(': no host was changed')[0]}: hosts drained there are not shown"]}
    out: dict[str, list[str]] = {}
    with gws:  # read as it was made
        for gw, h, s in gws.held_out(hosts):
            what = "drained" if s.drained else f"at weight {s.weight} of {FULL}"
            out.setdefault(h, []).append(f"gateway {gw}: {h} is {what} (a rollout that stopped left it so): the "
                                         "next `nemofleet rollout` or `nemofleet rollback` puts it back")
    return out
