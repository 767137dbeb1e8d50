"""Rolling rollouts, rollback and the health gate.

Per host (GPUs are full, so the new container cannot start beside the old one): the deploy
replaces the units (stop -> start), then the gate polls readiness within the startup window.
A host whose release changed and then failed is put back on the release it replaced (kept in
paths.PREVIOUS by the deploy). A host the deploy never changed (preflight refused the new
image, the release id and units are as before) is NOT rolled back: that would restore the
release before the current one, which was never replaced.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import canary as gate_math
from .. import fanout, paths, remote, shell, spec
from .. import hostcmd as commands
from ..lock import fleet as lock
from ..lock import info as lockinfo
from . import driver, gateway
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


def batches(hosts: list, batch: str, canary: int) -> list[list]:
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


def read_state(inventory: str, host: str) -> HostState | None:
    """The host's release id and unit digest, or None when the host does not answer."""
    return _state(driver.on_host(inventory, host, commands.release_read(), timeout=60))


def _state(e: driver.Exec) -> HostState | None:
    """commands.release_read()'s answer (over a pyinfra process or a kept connection) as a HostState."""
    if not e.reachable:
        return None
    kv = lockinfo.parse(e.lines())
    return HostState(kv.get("id") or None, kv.get("units_sha256") or None)


_STARTING = re.compile(r"UNHEALTHY: /health returned 000 \(failure \d+\)")


def gate_detail(text: str) -> str:
    """The health script's instance lines, with an instance whose port is not open yet called
    "starting": vLLM listens only once its engine is ready, so within the startup window a refused
    connection is a normal start, not a fault (a 503 stays UNHEALTHY)."""
    lines = [_STARTING.sub("starting (port not open yet)", ln) for ln in text.splitlines() if "instance" in ln]
    return " ".join(lines)[-300:]


def gate(inventory: str, host: str, window: float, poll: float = 5.0, log=print,
         session: "driver.Session | None" = None) -> tuple[bool, str]:
    """The readiness gate, used by rollout, rollback and rebuild: every instance passes the
    host's health check (/health 200, the model listed, the optional probe) within `window`.
    With a session, every poll goes over the host's one kept connection."""
    t0 = time.time()
    while True:
        e = (session.run(host, commands.gate(), timeout=240) if session is not None
             else driver.on_host(inventory, host, commands.gate(), timeout=240))
        detail = gate_detail(e.text)
        if e.rc == 0:
            return True, detail
        if not e.reachable:
            return False, f"host unreachable: {e.text[-200:]}"
        if time.time() - t0 > window:
            return False, " ".join(ln for ln in e.lines() if "instance" in ln)[-300:] or e.text.strip()[-300:]
        log(f"  {host}: waiting for health ({time.time() - t0:.0f}s of {window:.0f}s): {detail or 'no answer'}")
        time.sleep(poll)


def rollback_host(inventory: str, host: str, expect: str | None = None, window: float = 60) -> tuple[bool, str]:
    # each instance through the front door within min(window, 60) s: 8 instances fit the 900 s bound
    ready = int(max(10, min(window, 60)))
    e = driver.on_host(inventory, host, commands.rollback(expect, ready), timeout=900)
    return e.rc == 0, (e.lines() or [""])[-1]


@contextmanager
def ticking(log, label: str):
    """A heartbeat line every 10 s while a silent step runs (a thread; no-op without a log)."""
    if not log:
        yield
        return
    beat, stop = driver.Heartbeat(log, label, stage="running"), threading.Event()

    def run() -> None:
        while not stop.wait(1.0):
            beat.beat()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


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
    batches: list[dict] = field(default_factory=list)  # per batch: hosts, gate figures, verdict, reason
    canary: list[str] = field(default_factory=list)  # the hosts of the canary batch
    interrupted: bool = False

    @property
    def result(self) -> str:
        """ok; rolled_back when the rollout stopped and every host it had changed in the failing
        batch is back on its release; halted otherwise (budget spent, a host lost, Ctrl-C, a
        rollback that failed)."""
        if self.ok:
            return "ok"
        if self.interrupted or any(r.result.startswith("failed") or r.result == "unreachable" for r in self.results):
            return "halted"
        return "rolled_back" if any(r.result == "rolled back" for r in self.results) else "halted"

    def to_json(self) -> dict:
        return {"result": self.result, "reason": self.reason,
                "hosts": {r.host: {"from": r.old, "to": r.new, "result": r.result, "canary": r.host in self.canary,
                                   "seconds": round(r.seconds, 1), "detail": r.detail} for r in self.results},
                "batches": self.batches}

    def summary(self) -> str:
        n = {k: sum(r.result == k for r in self.results) for k in ("ok", "rolled back", "not reached")}
        other = len(self.results) - sum(n.values())
        return (f"rollout {self.result}: {n['ok']} ok, {n['rolled back']} rolled back, {n['not reached']} not reached"
                f"{f', {other} failed or unreachable' if other else ''}" + (f" ({self.reason})" if self.reason else ""))

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


def _recover(inventory: str, results: list[HostResult], before: dict, window: float, log) -> None:
    """After a failed deploy or gate, of one host or of a group: only a host the deploy changed is
    rolled back, every member to the release it replaced, all together (the members of one model
    must run one release), then the host or the group's head is gated."""
    changed = []
    for res in results:
        after = read_state(inventory, res.host)
        if after is not None and after == before[res.host]:
            res.new = after.release
            res.detail += "; the host still runs its release (nothing to roll back)"
        elif not before[res.host].release:
            res.detail += "; no earlier release to roll back to"
        else:
            changed.append(res)
    if not changed:
        return
    label = (f"{results[0].host}: rolling back to {before[results[0].host].release}" if len(results) == 1 else
             f"{', '.join(r.host for r in changed)}: rolling back")
    with ticking(log, label), \
            ThreadPoolExecutor(max_workers=len(changed)) as pool:
        back = list(pool.map(lambda r: rollback_host(inventory, r.host, expect=before[r.host].release,
                                                     window=window), changed))
    head_ok, _ = gate(inventory, results[0].host, window, log=log) if all(ok for ok, _ in back) else (False, "")
    for res, (ok, text) in zip(changed, back):
        res.result = "rolled back" if ok and head_ok else "failed, rollback failed"
        res.detail += f"; {text}"
        res.new = (read_state(inventory, res.host) or HostState(None, None)).release


def deploy_unit(inventory: str, members: list[str], data: dict, window: float, env: dict,
                log=print, session: "driver.Session | None" = None) -> list[HostResult]:
    """A deploy unit (a host, or a multi-node serving group as one): one deploy over all its
    members, the gate on the head (its /health answers only with every member joined) and then on
    each worker; a failure rolls back every member it changed."""
    t0 = time.time()
    group = len(members) > 1
    before = {m: read_state(inventory, m) for m in members}
    results = [HostResult(m, old=(b.release if (b := before[m]) else None)) for m in members]
    lost = [m for m in members if before[m] is None]
    if lost:
        for res in results:
            res.result = "unreachable" if res.host in lost else "not reached"
            res.detail = ("could not connect over SSH" if res.host in lost else
                          f"serving group member {', '.join(lost)} is unreachable: the group deploys as one unit")
        return results
    # the gate waits for readiness; a front door's one-at-a-time restarts wait for each instance
    # themselves, at most the startup window each (an instance that fails stops the deploy there)
    r = driver.run(inventory, members, DEPLOY, data={"ready_timeout": str(max(1, int(window))), **data,
                                                     "wait_ready": "false"},
                   timeout=window + DEPLOY_SLACK, env=env,
                   beat=driver.Heartbeat(log, f"{', '.join(members)}: deploying", stage="connecting"))
    failed = None
    if r.rc != 0 and not group and not driver.connected(r.out, members[0]):
        results[0].result, results[0].detail = "unreachable", "could not connect over SSH"
    elif r.rc != 0:
        failed = f"deploy timed out after {r.seconds:.0f}s" if r.timed_out else _failure_line(r.out)
    else:
        for m in members:  # the head first: it is ready only once the whole group has joined
            ok, detail = gate(inventory, m, window, log=log, session=session)
            if not ok:
                failed = f"health gate on {m}: {detail}" if group else f"health gate: {detail}"
                break
        done = "serving group up (gated on the head)" if group else detail
        for res in results:  # a host's release is read after its gate; a failed group's after its rollback
            if not (failed and group):
                res.new = (read_state(inventory, res.host) or HostState(None, None)).release
    for res in results:
        if res.result != "unreachable":
            res.result, res.detail = ("failed", failed) if failed else ("ok", done)
    if failed:
        _recover(inventory, results, before, window, log)
    for res in results:
        res.seconds = time.time() - t0
        audit(inventory, res.host, "rollout", f"{res.old or 'none'} -> {res.new or 'none'}: {res.result}"
              + (f" (serving group {', '.join(members)})" if group else ""))
    return results


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
    specs = spec.read_all({h: {**(datas.get(h) or {}), **given} for h in hosts})
    wants, address = fanout.participants(specs)
    dirs = {}
    for h, key in wants.items():
        where = fanout.weights_dir(specs[h], key)
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


# ---------------------------------------------------------------------------- the bake (canary gate)

BAKE_POLL = 5.0  # seconds between two reads of every instance's /metrics during a bake

# One read of a host: the program remote/metrics.py prints its first GPU's name, then each
# instance's request metrics (the lines the gate uses) after an `@@instance NAME` line. The
# instances and where they listen come from the health program's config the deploy wrote
# (health.json), so this matches the release the host runs now; /metrics is read with the API key
# header like the health program reads it. Paths, the per-instance timeout (5 s for the whole
# answer) and the run's deadline (15 s below the read's own bound, METRICS_TIMEOUT) are its arguments.
METRICS_TIMEOUT = 60
METRICS_SCRIPT = shell.join(remote.argv("metrics", paths.HEALTH_CONFIG, paths.API_AUTH, 5, METRICS_TIMEOUT - 15))


@dataclass
class Reading:
    """One host's answer to METRICS_SCRIPT: GPU name, {instance: parsed samples}, model names."""
    gpu: str = ""
    instances: dict = field(default_factory=dict)

    @property
    def models(self) -> set:
        return {dict(labels).get("model_name") for samples in self.instances.values()
                for (_, labels) in samples if dict(labels).get("model_name")}


def read_metrics(session, hosts: list[str]) -> dict[str, Reading]:
    """Every host's metrics over its kept connection, in parallel; an unanswered host is absent."""
    def one(h):
        e = session.run(h, METRICS_SCRIPT, timeout=METRICS_TIMEOUT)
        if not e.reachable or e.rc != 0:
            return h, None
        gpu, texts = gate_math.split_instances(e.lines())
        return h, Reading(gpu, {n: gate_math.parse(t) for n, t in texts.items()})
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return {h: r for h, r in pool.map(one, hosts) if r is not None}


def pick_baseline(batch: list[str], old: list[str], readings: dict[str, Reading]) -> list[str]:
    """The hosts still on the old release that serve like the batch: the same GPU class and model
    first; all of them when none matches."""
    want = {(readings[h].gpu, m) for h in batch if h in readings for m in readings[h].models or {""}}
    same = [h for h in old if h in readings and any((readings[h].gpu, m) in want for m in readings[h].models or {""})]
    return same or list(old)


def own_window(start: dict[str, Reading], before: dict[str, Reading], hosts: list[str], slo) -> tuple:
    """The batch's own figures before its deploy: from the rollout's start to just before the
    deploy; when that served too few requests, all the old instances served since they started."""
    w = gate_math.Window()
    for h in hosts:
        for read in (start, before):
            for n, samples in (read.get(h) or Reading()).instances.items():
                w.add(f"{h}/{n}", samples)
    f = w.figures()
    if f.requests >= slo.min_requests:
        return f, "the same hosts' own window before the deploy (since the rollout started)"
    life = gate_math.merge([gate_math.figures_of(samples) for h in hosts
                            for samples in (before.get(h) or Reading()).instances.values()])
    return life, "the same hosts' own counters before the deploy (since their instances started)"


def _now() -> float:
    return time.monotonic()


def bake(session, batch: list[str], baseline: list[str], own, seconds: float, slo, log,
         clock=None, sleep=None, poll: float = BAKE_POLL, windows=None) -> dict:
    """Watch the batch (and the baseline hosts, over the same window) for `seconds`: a breach ends
    it at once; thin traffic with on_thin "wait" extends it by up to `seconds` more. `own` is the
    (figures, description) used when `baseline` is empty. Returns the batch's gate record."""
    clock, sleep = clock or _now, sleep or time.sleep
    cw, bw = windows or (gate_math.Window(), gate_math.Window())  # the canary steps share theirs
    t0 = clock()
    while True:
        readings = read_metrics(session, batch + baseline)
        for h, r in readings.items():
            for n, samples in r.instances.items():
                (cw if h in batch else bw).add(f"{h}/{n}", samples)
        c = cw.figures()
        b, kind = (bw.figures(), "hosts still on the old release, same window") if baseline else own
        v = gate_math.verdict(c, b, slo)
        elapsed = clock() - t0
        missing = [h for h in batch + baseline if h not in readings]
        log(f"  bake {elapsed:.0f}/{seconds:.0f}s: canary {c.text()} | baseline {b.text()}"
            + (f" (no answer from {', '.join(missing)})" if missing else ""))
        idle = b.requests < slo.min_requests  # the baseline is thin too: the fleet is (nearly) idle
        if v.state == "breach":
            break
        if elapsed >= seconds and (v.state == "pass" or slo.on_thin != "wait" or idle or elapsed >= 2 * seconds):
            break
        sleep(poll)
    if v.state == "thin":
        if slo.on_thin == "pass":
            v = gate_math.Verdict("pass", f"{v.reason}: passed by --on-thin-traffic pass")
        elif slo.on_thin == "wait" and idle:
            v = gate_math.Verdict("pass", f"{v.reason}: the baseline is as quiet, the fleet is idle: passed "
                                          "unjudged (--on-thin-traffic wait)")
        else:
            v = gate_math.Verdict("breach", f"{v.reason} after {elapsed:.0f}s: the gate cannot vouch for the batch "
                                            f"(--on-thin-traffic {slo.on_thin})", "traffic")
    return {"hosts": batch, "baseline": {"kind": kind, "hosts": baseline}, "seconds": round(elapsed, 1),
            "canary_figures": c.as_dict(), "baseline_figures": b.as_dict(),
            "verdict": "pass" if v.state == "pass" else "fail", "slo": v.slo, "reason": v.reason}


def _bake_steps(session, gw, baked: list[str], base: list[str], own, seconds: float, slo, log,
                steps: tuple[float, ...], n_canary: int, weights: dict) -> dict:
    """The bake. A canary behind a gateway bakes at each share of `steps` in turn (its weight set
    before each step, the first set by its deploy), each step judged over one window for the whole
    bake, with the canary's minimum requests scaled to its weight; once all passed, full weight."""
    if not steps:
        return bake(session, baked, base, own, seconds, slo, log)
    windows, done, record = (gate_math.Window(), gate_math.Window()), [], {}
    for i, share in enumerate(steps):
        w = weights.get(baked[0], gateway.FULL) if i == 0 else gw.ready(baked, share, n_canary)
        step = dataclasses.replace(slo, canary_min=gateway.min_requests(slo.min_requests, w))
        log(f"  canary step {i + 1}/{len(steps)}: {100 * share:g}% of the gateway's requests (weight {w} of "
            f"{gateway.FULL}), judged once it served {step.canary_min} requests")
        record = bake(session, baked, base, own, seconds, step, log, windows=windows)
        done.append({"share": share, "weight": w, "seconds": record["seconds"], "verdict": record["verdict"],
                     "canary_requests": record["canary_figures"]["requests"]})
        if record["verdict"] != "pass":
            break
    else:
        gw.ready(baked)
    return {**record, "seconds": round(sum(s["seconds"] for s in done), 1), "steps": done}


def _roll_back_batch(inventory: str, results: list[HostResult], why: str, window: float, log, session=None,
                     gw=None) -> None:
    """The hosts of a batch that passed health but failed its bake (or was interrupted) go back to
    the release they replaced: rollback path of a failed gate, all at once, each gated again
    (drained at the gateway meanwhile)."""
    todo = [r for r in results if r.old]
    if gw and todo:
        gw.drain([r.host for r in todo])
    with ticking(log, f"{', '.join(r.host for r in todo)}: rolling back"), \
            ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        back = list(pool.map(lambda r: rollback_host(inventory, r.host, expect=r.old, window=window), todo))
    for res, (ok, text) in zip(todo, back):
        good, _ = gate(inventory, res.host, window, log=log, session=session) if ok else (False, "")
        res.result = "rolled back" if ok and good else "failed, rollback failed"
        res.detail = f"{why}; {text}"
        res.new = (read_state(inventory, res.host) or HostState(None, None)).release
    if gw and todo:
        gw.ready([r.host for r in todo])


def rollout(inventory: str, *, batch: str = "1", canary: int = 0, max_failures: int = 0, window: float = 1200,
            limit: list[str] | None = None, data: dict | None = None, message: str = "",
            ttl: int = lock.DEFAULT_TTL, log=print, bake_seconds: float = 0, slo: "gate_math.Slo | None" = None,
            pause_after_canary: bool = False, ask=None, gateway_drain: bool = True,
            canary_steps: tuple[float, ...] = (0.10,)) -> Outcome:
    """Batches of deploy units (a host, or a multi-node serving group counted as one): canary
    first, each gated on health, then (bake_seconds > 0) baked: its request metrics compared with
    the baseline's over the same window (nemofleet.canary's rule), a breach rolling the batch back
    and halting; halted when the failure budget (hosts) is spent. Hosts that need the same weights
    fan out (docs/fanout.md): one host per model fetches it from the origin, the others copy it
    from a host that holds it (or is fetching it) in a tree.
    Ctrl-C: the deploys in flight end (pyinfra gets the same signal from the terminal), every host
    of that batch the deploy changed goes back to its release, the lock is released, and the
    outcome says halted ("interrupted"): the CLI exits 130.
    With a gateway (group `gateway`), each batch is drained there before it changes and set ready
    after its gate; the canary bakes at the shares `canary_steps` (fractions of the gateway's
    requests), each judged (fleet/gateway.py, docs/gateway.md)."""
    slo = slo or gate_math.Slo()
    hosts = driver.serving_hosts(inventory, limit)
    units = driver.group_units(inventory, hosts)
    check_options(len(units), batch, canary, max_failures)
    plan = [[h for u in b for h in u] for b in batches(units, batch, canary)]
    unit_of = {h: u for u in units for h in u}
    outcome = Outcome([HostResult(h) for h in hosts])
    outcome.canary = plan[0] if canary else []
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
    gw = gateway.Gateways(inventory, reachable, log, use=gateway_drain)  # refuses here when it does not answer
    if canary and bake_seconds > 0 and not gw:
        log("  the canary takes a full host's share of the requests: no gateway drains and weighs hosts here "
            "(traffic cannot be shifted by weight)")
    try:
        session: driver.Session | None = driver.Session(inventory, reachable)
    except Exception as exc:  # noqa: BLE001 - without it every poll is a pyinfra process, as before
        log(f"  (no kept connections: {str(exc)[:120]}; polling with a pyinfra process per poll)")
        session = None
    start = read_metrics(session, reachable) if session is not None and bake_seconds > 0 else {}
    try:
        with lock.with_lock(inventory, reachable, message or f"rollout by {driver.operator()}", ttl, log=log) as held:
            gw.check(reachable)
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
                before = read_metrics(session, group) if session is not None and bake_seconds > 0 else {}
                # what each host runs before its deploy, over the kept connections: Ctrl-C's rollback needs it
                pre = {h: st.release for h in group
                       if session is not None and (st := _state(session.run(h, commands.release_read(), timeout=60)))}

                is_canary = bool(canary and n == 0 and bake_seconds > 0 and gw)

                def one(u):
                    # the fan-out's sources reach the host as its weights_seed_from (JSON for --data)
                    extra = {"weights_seed_from": json.dumps(seeds[u[0]])} if seeds.get(u[0]) else {}
                    done = deploy_unit(inventory, u, {**(data or {}), **extra}, window, held.env(), log, session)
                    # back at the gateway: a canary at its first step's share, any other host at full weight
                    ok = all(r.result == "ok" for r in done)
                    weights[u[0]] = gw.ready(u, canary_steps[0] if is_canary and ok else None, len(group))
                    return done
                weights: dict = {}
                try:
                    gw.drain(group)
                    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
                        for done in pool.map(one, todo):
                            for res in done:
                                by_host[res.host].__dict__.update(res.__dict__)
                                log(f"  {res.host}: {res.result} ({res.old or '-'} -> {res.new or '-'}, "
                                    f"{res.seconds:.0f}s) {res.detail}")
                                failures += res.result != "ok"
                                if res.result == "ok" and res.host in fan.wants:
                                    # its deploy verified the weights (the check wrote the marker): a source now
                                    fan.holders.setdefault(res.host, set()).add(fan.wants[res.host])
                except KeyboardInterrupt:
                    _interrupted(inventory, outcome, group, pre, window, log, session, gw)
                    return outcome
                if failures > max_failures:
                    outcome.halted = True
                    outcome.reason = f"{failures} failure(s), budget {max_failures}: halted after {label}"
                    break
                baked = [h for h in group if by_host[h].result == "ok"]
                if bake_seconds > 0 and baked and session is not None:
                    done_hosts = {h for g in plan[:n + 1] for h in g}
                    old = [h for h in reachable if h not in done_hosts and by_host[h].result == "not reached"]
                    base = pick_baseline(baked, old, {**start, **before})
                    own = own_window(start, before, baked, slo) if not base else None
                    log(f"  baking {', '.join(baked)} for {bake_seconds:.0f}s against "
                        f"{', '.join(base) if base else own[1] if own else ''}")
                    try:
                        record = _bake_steps(session, gw, baked, base, own, bake_seconds, slo, log,
                                             canary_steps if is_canary else (), len(group), weights)
                    except KeyboardInterrupt:
                        _interrupted(inventory, outcome, group, pre, window, log, session, gw)
                        return outcome
                    except Exception as exc:  # noqa: BLE001 - a gate that cannot judge fails closed: roll back
                        none = gate_math.Figures().as_dict()
                        record = {"hosts": baked, "baseline": {"kind": "-", "hosts": base}, "seconds": 0,
                                  "canary_figures": none, "baseline_figures": none, "verdict": "fail", "slo": "metrics",
                                  "reason": f"the gate could not judge the batch ({type(exc).__name__})"}
                    record["label"] = label
                    outcome.batches.append(record)
                    figures = (f"{record['verdict']}: {record['reason']}; "
                               f"canary {gate_math.figures_text(record['canary_figures'])}; "
                               f"baseline ({record['baseline']['kind']}) "
                               f"{gate_math.figures_text(record['baseline_figures'])}")
                    log(f"  {label} verdict: {record['verdict'].upper()}: {record['reason']}")
                    for h in baked:
                        audit(inventory, h, "canary", figures)
                    if record["verdict"] != "pass":
                        _roll_back_batch(inventory, [by_host[h] for h in baked],
                                         f"canary gate: {record['slo'] or 'SLO'} broken: {record['reason']}",
                                         window, log, session, gw)
                        outcome.halted = True
                        outcome.reason = f"{label} broke the SLO ({record['reason']}): rolled back, rollout halted"
                        break
                elif bake_seconds <= 0:
                    outcome.batches.append({"label": label, "hosts": group, "verdict": "not baked (--bake 0)",
                                            "reason": "health gate only"})
                if pause_after_canary and canary and n == 0 and len(plan) > 1:
                    choice = (ask or input)(f"canary {', '.join(group)} passed: promote to the remaining "
                                            f"{len(plan) - 1} batch(es) or abort? [promote/abort] ").strip().lower()
                    if choice != "promote":
                        _roll_back_batch(inventory, [by_host[h] for h in group if by_host[h].result == "ok"],
                                         f"aborted by the operator after the canary ({choice or 'no answer'})",
                                         window, log, session, gw)
                        outcome.halted = True
                        outcome.reason = "aborted after the canary: the canary rolled back"
                        break
    finally:
        if session is not None:
            session.close()
        gw.__exit__(None, None, None)  # a host this run drained and did not set ready again is set ready
    return outcome


def _interrupted(inventory: str, outcome: Outcome, group: list[str], pre: dict, window: float, log,
                 session, gw=None) -> None:
    """Ctrl-C during a batch: further Ctrl-C is ignored while every host of that batch that the
    deploy changed goes back to its release (the hosts the deploy never touched stay as they are)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        log(f"interrupted: putting the batch in flight ({', '.join(group)}) back on its release; the lock is "
            "released after")
        by_host = {r.host: r for r in outcome.results}
        changed = []
        for h in group:
            res = by_host[h]
            res.old = res.old or pre.get(h)
            now = read_state(inventory, h)
            if res.old and now is not None and now.release != res.old:
                changed.append(res)
            elif res.result == "not reached":
                res.result, res.detail = "not reached", "interrupted before its deploy finished; unchanged"
        _roll_back_batch(inventory, changed, "interrupted (Ctrl-C)", window, log, session, gw)
        if gw:
            gw.ready(group)  # the hosts of the batch its deploy never changed too
        outcome.halted = outcome.interrupted = True
        outcome.reason = f"interrupted (Ctrl-C) during the batch {', '.join(group)}: it was rolled back"
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def rollback(inventory: str, limit: list[str] | None = None, window: float = 1200, ttl: int = lock.DEFAULT_TTL,
             log=print, gateway_drain: bool = True) -> Outcome:
    """Return hosts, one at a time, to the release kept before their current one (each drained at
    the gateway meanwhile, when the inventory has one)."""
    hosts = driver.serving_hosts(inventory, limit)
    units = driver.group_units(inventory, hosts)
    outcome = Outcome()
    gw = gateway.Gateways(inventory, hosts, log, use=gateway_drain)
    with lock.with_lock(inventory, hosts, f"rollback by {driver.operator()}", ttl, log=log), gw:
        gw.check(hosts)
        for unit in units:  # a serving group's members together, then its head gated first
            t0 = time.time()
            gw.drain(unit)
            done = [HostResult(h, old=(read_state(inventory, h) or HostState(None, None)).release) for h in unit]
            with ThreadPoolExecutor(max_workers=len(unit)) as pool:
                back = list(pool.map(lambda h: rollback_host(inventory, h, window=window), unit))
            for res, (ok, text) in zip(done, back):
                good, detail = gate(inventory, res.host, window, log=log) if all(o for o, _ in back) else (False, text)
                res.new = (read_state(inventory, res.host) or HostState(None, None)).release
                res.result, res.detail, res.seconds = ("ok" if good else "failed"), detail, time.time() - t0
                audit(inventory, res.host, "rollback", f"{res.old or 'none'} -> {res.new or 'none'}: {res.result}")
                outcome.results.append(res)
            gw.ready(unit)
    outcome.halted = any(r.result != "ok" for r in outcome.results)
    return outcome
