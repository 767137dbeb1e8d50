"""Rolling rollouts, rollback and the health gate.

Per host (GPUs are full, so the new container cannot start beside the old one): the deploy
replaces the units (stop -> start), then the gate polls readiness within the startup window.
A host whose release changed and then failed is put back on the release it replaced (kept in
paths.PREVIOUS by the deploy). A host the deploy never changed (preflight refused the new
image, the release id and units are as before) is NOT rolled back: that would restore the
release before the current one, which was never replaced.
"""

from __future__ import annotations

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import fanout, inputs
from .. import hostcmd as commands
from .. import lockinfo
from . import driver, lock
from .driver import FleetError

DEPLOY = "deploys/nemotron.py"
DEPLOY_SLACK = 900  # seconds a deploy may take beyond the startup window (pulls, weights checks)


# ---------------------------------------------------------------------------- batches

def check_options(n_hosts: int, batch: str, canary: int, max_failures: int) -> None:
    """One sentence per bad option, raised as FleetError (exit 2)."""
    if canary < 0 or (canary and canary >= n_hosts):
        raise FleetError(f"--canary {canary} must be at least 0 and fewer than the {n_hosts} host(s) "
                         "(the canary batch is followed by the rest)")
    if max_failures < 0:
        raise FleetError(f"--max-failures {max_failures} must be 0 or more")
    batch_size(batch, n_hosts)


def batch_size(batch: str, n_hosts: int) -> int:
    m = re.fullmatch(r"(\d+)(%?)", str(batch).strip())
    if not m:
        raise FleetError(f"--batch {batch!r} must be a host count (N >= 1) or a percentage (1% to 100%)")
    n = int(m.group(1))
    if m.group(2):
        if not 1 <= n <= 100:
            raise FleetError(f"--batch {batch} must be a percentage from 1% to 100%")
        return max(1, math.ceil(n_hosts * n / 100))
    if n < 1:
        raise FleetError(f"--batch {batch} must be at least 1 host")
    return n


def batches(hosts: list[str], batch: str, canary: int) -> list[list[str]]:
    """Deterministic batches in inventory order: the canary batch first, then `batch` (N or P%
    of all hosts)."""
    size = batch_size(batch, len(hosts))
    out = [hosts[:canary]] if canary else []
    rest = hosts[canary:]
    out += [rest[i:i + size] for i in range(0, len(rest), size)]
    return [b for b in out if b]


# ---------------------------------------------------------------------------- host steps

@dataclass
class HostState:
    release: str | None
    units: str | None

    def changed_from(self, other: "HostState") -> bool:
        return (self.release, self.units) != (other.release, other.units)


def read_state(inventory: str, host: str) -> HostState | None:
    """The host's release id and unit digest, or None when the host does not answer."""
    e = driver.on_host(inventory, host, commands.release_read(), timeout=60)
    if not e.reachable:
        return None
    kv = lockinfo.parse(e.lines())
    return HostState(kv.get("id") or None, kv.get("units_sha256") or None)


def gate(inventory: str, host: str, window: float, poll: float = 5.0, log=print) -> tuple[bool, str]:
    """The readiness gate, used by rollout, rollback and rebuild: every instance passes the
    host's health check (/health 200, the model listed, the optional probe) within `window`."""
    t0 = time.time()
    while True:
        e = driver.on_host(inventory, host, commands.gate(), timeout=240)
        detail = " ".join(ln for ln in e.lines() if "instance" in ln)[-300:]
        if e.rc == 0:
            return True, detail
        if not e.reachable:
            return False, f"host unreachable: {e.text[-200:]}"
        if time.time() - t0 > window:
            return False, detail or e.text.strip()[-300:]
        log(f"  {host}: waiting for health ({time.time() - t0:.0f}s of {window:.0f}s): {detail or 'no answer'}")
        time.sleep(poll)


def rollback_host(inventory: str, host: str, expect: str | None = None, window: float = 60) -> tuple[bool, str]:
    # each instance through the front door within min(window, 60) s: 8 instances fit the 900 s bound
    ready = int(max(10, min(window, 60)))
    e = driver.on_host(inventory, host, commands.rollback(expect, ready), timeout=900)
    return e.rc == 0, (e.lines() or [""])[-1]


def audit(inventory: str, host: str, event: str, detail: str) -> None:
    driver.on_host(inventory, host, commands.audit_command(driver.operator(), event, detail), timeout=60)


# ---------------------------------------------------------------------------- outcome

@dataclass
class HostResult:
    host: str
    old: str | None = None
    new: str | None = None
    result: str = "not reached"
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Outcome:
    results: list[HostResult] = field(default_factory=list)
    halted: bool = False
    reason: str = ""

    def table(self) -> str:
        rows = [("host", "release", "result", "time", "detail")]
        for r in self.results:
            rows.append((r.host, f"{r.old or '-'} -> {r.new or '-'}", r.result, f"{r.seconds:.0f}s", r.detail[:70]))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    @property
    def ok(self) -> bool:
        return not self.halted and all(r.result == "ok" for r in self.results)


# ---------------------------------------------------------------------------- rollout

def _failure_line(out: str) -> str:
    return next((ln.strip() for ln in out.splitlines() if "refused" in ln or "rror" in ln), out.strip()[-200:])


def _recover(inventory: str, res: HostResult, before: HostState, window: float, log) -> None:
    """After a failed deploy or gate: roll back only a host the deploy changed."""
    after = read_state(inventory, res.host)
    if after is not None and not after.changed_from(before):
        res.new = after.release
        res.detail += "; the host still runs its release (nothing to roll back)"
        return
    if not before.release:
        res.detail += "; no earlier release to roll back to"
        return
    ok, text = rollback_host(inventory, res.host, expect=before.release, window=window)
    back, _ = gate(inventory, res.host, window, log=log) if ok else (False, "")
    res.result = "rolled back" if ok and back else "failed, rollback failed"
    res.detail += f"; {text}"
    res.new = (read_state(inventory, res.host) or HostState(None, None)).release


def deploy_one(inventory: str, host: str, data: dict, window: float, env: dict, log=print) -> HostResult:
    t0 = time.time()
    before = read_state(inventory, host)
    res = HostResult(host)
    if before is None:
        res.result, res.detail = "unreachable", "could not connect over SSH"
        return res
    res.old = before.release
    # the gate waits for readiness; a front door's one-at-a-time restarts wait for each instance
    # themselves, at most the startup window each (an instance that fails stops the deploy there)
    r = driver.run(inventory, [host], DEPLOY, data={"ready_timeout": str(max(1, int(window))), **data,
                                                    "wait_ready": "false"},
                   timeout=window + DEPLOY_SLACK, env=env)
    if r.rc != 0 and not driver.connected(r.out, host):
        res.result, res.detail = "unreachable", "could not connect over SSH"
    elif r.rc != 0:
        res.result = "failed"
        res.detail = f"deploy timed out after {r.seconds:.0f}s" if r.timed_out else _failure_line(r.out)
    else:
        ok, detail = gate(inventory, host, window, log=log)
        res.result, res.detail = ("ok", detail) if ok else ("failed", f"health gate: {detail}")
        res.new = (read_state(inventory, host) or HostState(None, None)).release
    if res.result == "failed":
        _recover(inventory, res, before, window, log)
    res.seconds = time.time() - t0
    audit(inventory, host, "rollout", f"{res.old or 'none'} -> {res.new or 'none'}: {res.result}")
    return res


def _recover_group(inventory: str, results: list[HostResult], before: dict, window: float, log) -> None:
    """A group that failed: every member the deploy changed goes back to the release it replaced,
    all together (the members of one model must run one release), then the head is gated."""
    changed = []
    for res in results:
        after = read_state(inventory, res.host)
        if after is not None and not after.changed_from(before[res.host]):
            res.new = after.release
            res.detail += "; the host still runs its release (nothing to roll back)"
        elif not before[res.host].release:
            res.detail += "; no earlier release to roll back to"
        else:
            changed.append(res)
    if not changed:
        return
    with ThreadPoolExecutor(max_workers=len(changed)) as pool:
        back = list(pool.map(lambda r: rollback_host(inventory, r.host, expect=before[r.host].release,
                                                     window=window), changed))
    head_ok, _ = gate(inventory, results[0].host, window, log=log) if all(ok for ok, _ in back) else (False, "")
    for res, (ok, text) in zip(changed, back):
        res.result = "rolled back" if ok and head_ok else "failed, rollback failed"
        res.detail += f"; {text}"
        res.new = (read_state(inventory, res.host) or HostState(None, None)).release


def deploy_group(inventory: str, members: list[str], data: dict, window: float, env: dict,
                 log=print) -> list[HostResult]:
    """A multi-node serving group as one unit: one deploy over all its members, the gate on the
    head (its /health answers only with every member joined) and then on each worker; a failure
    rolls back every member it changed."""
    t0 = time.time()
    before = {m: read_state(inventory, m) for m in members}
    results = [HostResult(m, old=(before[m].release if before[m] else None)) for m in members]
    lost = [m for m in members if before[m] is None]
    if lost:
        for res in results:
            res.result = "unreachable" if res.host in lost else "not reached"
            res.detail = (f"could not connect over SSH" if res.host in lost else
                          f"serving group member {', '.join(lost)} is unreachable: the group deploys as one unit")
        return results
    r = driver.run(inventory, members, DEPLOY, data={"ready_timeout": str(max(1, int(window))), **data,
                                                     "wait_ready": "false"},
                   timeout=window + DEPLOY_SLACK, env=env)
    failed = None
    if r.rc != 0:
        failed = f"deploy timed out after {r.seconds:.0f}s" if r.timed_out else _failure_line(r.out)
    else:
        for m in members:  # the head first: it is ready only once the whole group has joined
            ok, detail = gate(inventory, m, window, log=log)
            if not ok:
                failed = f"health gate on {m}: {detail}"
                break
    for res in results:
        res.result, res.detail = ("failed", failed) if failed else ("ok", "serving group up (gated on the head)")
        if not failed:
            res.new = (read_state(inventory, res.host) or HostState(None, None)).release
    if failed:
        _recover_group(inventory, results, before, window, log)
    for res in results:
        res.seconds = time.time() - t0
        audit(inventory, res.host, "rollout", f"{res.old or 'none'} -> {res.new or 'none'}: {res.result}"
              f" (serving group {', '.join(members)})")
    return results


def _deploy_unit(inventory, unit, data, window, env, log) -> list[HostResult]:
    if len(unit) == 1:
        return [deploy_one(inventory, unit[0], data, window, env, log)]
    return deploy_group(inventory, unit, data, window, env, log)


# ---------------------------------------------------------------------------- weights fan-out

@dataclass
class FanIn:
    """What the rollout needs for the weights fan-out (docs/fanout.md): the key each host takes
    part with, the directories whose marker says a host holds it, how peers reach each host,
    and the holders found (updated as hosts are deployed)."""
    wants: dict
    dirs: dict  # {weights dir: key}
    address: dict
    holders: dict = field(default_factory=dict)

    def probe(self) -> str:
        return fanout.holders_script({d: k[1] for d, k in self.dirs.items()}) if self.dirs else "true"


def fan_in(inventory: str, hosts: list[str], data: dict | None) -> FanIn:
    """The fan-out's inputs from the hosts' data (the run's --data on top, as the deploy sees it);
    a member of a multi-node serving group fetches as it would alone (fanout.wanted)."""
    from pyinfra_cli.util import parse_cli_arg  # --data values as pyinfra reads them (JSON, numbers, booleans)

    datas = driver.host_data(inventory) if hosts else {}
    given = {k: parse_cli_arg(v) if isinstance(v, str) else v for k, v in (data or {}).items()}
    datas = {h: {**(datas.get(h) or {}), **given} for h in hosts}
    wants, address = fanout.participants(datas, inputs.read_secrets)
    dirs = {}
    for h, key in wants.items():
        where = fanout.weights_dir(datas[h], key)
        if where:
            dirs[where] = key
    return FanIn(wants, dirs, address)


def _seeds(fan: FanIn, heads: list[str], log) -> dict:
    """{host: its weights_seed_from} for one batch, decided from the holders verified before it.
    The batch deploys at once: a host whose source is still fetching waits for it on the host
    (weights._wait_lines) and moves on to the next source, then the origin, if it stalls."""
    f = fanout.decide([heads], fan.wants, fan.holders)
    for line in f.lines():
        log(f"  weights: {line}")
    return {h: f.seed_from(h, fan.address) for h in heads}


def rollout(inventory: str, *, batch: str = "1", canary: int = 0, max_failures: int = 0, window: float = 1200,
            limit: list[str] | None = None, data: dict | None = None, message: str = "",
            ttl: int = lock.DEFAULT_TTL, log=print) -> Outcome:
    """Batches of deploy units (a host, or a multi-node serving group counted as one): canary
    first, each gated on health, halted when the failure budget (hosts) is spent. Hosts that
    need the same weights fan out (docs/fanout.md): one host per model fetches it from the
    origin, the others copy it from a host that holds it (or is fetching it) in a tree."""
    hosts = driver.serving_hosts(inventory, limit)
    units = driver.group_units(inventory, hosts)
    check_options(len(units), batch, canary, max_failures)
    plan = [[h for u in b for h in u] for b in batches(units, batch, canary)]
    unit_of = {h: u for u in units for h in u}
    outcome = Outcome([HostResult(h) for h in hosts])
    by_host = {r.host: r for r in outcome.results}
    fan = fan_in(inventory, hosts, data)
    # the reachability probe also reads which hosts hold which weights (their markers): no extra command
    for h, e in driver.exec_all(inventory, hosts, fan.probe(), timeout=90).items():
        if not e.reachable:
            by_host[h].result, by_host[h].detail = "unreachable", e.text[:200]
        else:
            fan.holders[h] = fanout.parse_holders(e.lines(), fan.dirs)
    reachable = [h for h in hosts if by_host[h].result != "unreachable"]
    failures = len(hosts) - len(reachable)
    with lock.with_lock(inventory, reachable, message or f"rollout by {driver.operator()}", ttl, log=log) as held:
        for n, group in enumerate(plan):
            label = "canary" if canary and n == 0 else f"batch {n + (0 if canary else 1)}"
            log(f"{label}: {', '.join(group)}")
            lost = held.refresh()
            if failures > max_failures or lost:
                outcome.halted = True
                outcome.reason = "; ".join(lost) or f"failure budget {max_failures} spent before {label}"
                break
            todo = [unit_of[h] for h in group if h == unit_of[h][0]
                    and all(by_host[m].result != "unreachable" for m in unit_of[h])]
            seeds = _seeds(fan, [u[0] for u in todo], log)

            def one(u):
                # the fan-out's sources reach the host as its weights_seed_from (JSON for --data)
                extra = {"weights_seed_from": json.dumps(seeds[u[0]])} if seeds.get(u[0]) else {}
                return _deploy_unit(inventory, u, {**(data or {}), **extra}, window, held.env(), log)
            with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
                for done in pool.map(one, todo):
                    for res in done:
                        by_host[res.host].__dict__.update(res.__dict__)
                        log(f"  {res.host}: {res.result} ({res.old or '-'} -> {res.new or '-'}, {res.seconds:.0f}s) {res.detail}")
                        failures += res.result != "ok"
                        if res.result == "ok" and res.host in fan.wants:
                            # its deploy verified the weights (the check wrote the marker): a source now
                            fan.holders.setdefault(res.host, set()).add(fan.wants[res.host])
            if failures > max_failures:
                outcome.halted = True
                outcome.reason = f"{failures} failure(s), budget {max_failures}: halted after {label}"
                break
    return outcome


def rollback(inventory: str, limit: list[str] | None = None, window: float = 1200, ttl: int = lock.DEFAULT_TTL,
             log=print) -> Outcome:
    """Return hosts, one at a time, to the release kept before their current one."""
    hosts = driver.serving_hosts(inventory, limit)
    units = driver.group_units(inventory, hosts)
    outcome = Outcome()
    with lock.with_lock(inventory, hosts, f"rollback by {driver.operator()}", ttl, log=log):
        for unit in units:  # a serving group's members together, then its head gated first
            t0 = time.time()
            done = [HostResult(h, old=(read_state(inventory, h) or HostState(None, None)).release) for h in unit]
            with ThreadPoolExecutor(max_workers=len(unit)) as pool:
                back = list(pool.map(lambda h: rollback_host(inventory, h, window=window), unit))
            for res, (ok, text) in zip(done, back):
                good, detail = gate(inventory, res.host, window, log=log) if all(o for o, _ in back) else (False, text)
                res.new = (read_state(inventory, res.host) or HostState(None, None)).release
                res.result, res.detail, res.seconds = ("ok" if good else "failed"), detail, time.time() - t0
                audit(inventory, res.host, "rollback", f"{res.old or 'none'} -> {res.new or 'none'}: {res.result}")
                outcome.results.append(res)
    outcome.halted = any(r.result != "ok" for r in outcome.results)
    return outcome
