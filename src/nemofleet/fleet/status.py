"""`nemofleet status`: per host the release (and drift from what the inventory plans), units with
health, weights on disk and downloads in progress."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from .. import hostcmd as commands
from .. import inputs, render
from ..spec import to_resolve
from ..valuetypes import host_number, host_time, key_values, reads_host
from . import driver, gateway

_UP = re.compile(r'nemofleet_vllm_up\{instance="([^"]+)".*\} ([01])$')
_LAST = re.compile(r'nemofleet_vllm_last_success_timestamp_seconds\{instance="([^"]+)"\} (\S+)')
# the load figures the health script reads from each instance's /metrics (docs/monitoring.md)
_LOAD = re.compile(r'nemofleet_vllm_(num_requests_running|num_requests_waiting|kv_cache_usage_ratio)'
                   r'\{instance="([^"]+)"\} (\S+)')


@dataclass
class HostStatus:
    host: str
    reachable: bool = True
    release: str | None = None
    planned: str | None = None
    problems: list[str] = field(default_factory=list)  # settings the inventory gets wrong
    lines: list[str] = field(default_factory=list)  # printable lines below the release
    # the host's release record (image=, model=, instances=) and the one the inventory plans
    record: dict = field(default_factory=dict)
    planned_record: dict = field(default_factory=dict)

    @property
    def in_sync(self) -> bool:
        return self.reachable and self.release is not None and self.release == self.planned

    def drift(self) -> str:
        """What differs between what the host serves and what the inventory plans, in words: the
        image, the model and revision, the instances; else the flags or GPUs (the release id covers
        each instance's arguments, which the record does not list)."""
        if self.in_sync:
            return "in sync"
        if self.planned is None:
            return "DRIFT: the inventory's plan for it is refused (nemofleet plan says why)"
        if self.release is None:
            return f"DRIFT: nothing deployed yet; the inventory plans release {self.planned}"
        said = [f"{k} {self.record.get(k) or '(none)'} -> {self.planned_record.get(k) or '(none)'}"
                for k in ("image", "model", "instances") if self.record.get(k) != self.planned_record.get(k)]
        what = "; ".join(said) or "the same image, model and instances, other flags or GPUs"
        return f"DRIFT: {what} (release {self.release} -> {self.planned})"


@reads_host(lambda why, lines: {})
def _record(lines: list[str]) -> dict:
    """`release key=value` lines (the release record as the status script prints it) -> {key: value}."""
    return key_values(lines, "release ")


@reads_host(lambda why, lines: [f"last canary gate: {why}"])
def canary_line(lines: list[str]) -> list[str]:
    """`canary <time> <operator> canary <verdict and figures>` (the last canary verdict a rollout
    wrote in the host's audit log, as remote/host_status.py prints it) -> the status line, if any."""
    for ln in lines:
        parts = ln.split(" ", 4)
        if len(parts) == 5 and parts[0] == "canary" and parts[3] == "canary":
            return [f"last canary gate {parts[1]} by {parts[2]}: {parts[4]}"]
    return []


def _script_for(sp) -> tuple[str, list[str]]:
    """The status command for a host (its HostSpec), and the sentences of its refused settings (the
    defaults then say where to look: what the host has where nemofleet would put it)."""
    from .. import settings

    s = sp.settings or settings.defaults()
    return commands.status(s.models_root, s.prom_dir), [] if sp.settings is not None else list(sp.refusals)


def _figure(text: str | None, fmt: str) -> str:
    value = host_number(text, 0, 2**53, decimal=True)  # NaN, inf, 1e309: no figure either
    return "-" if value is None else format(value, fmt)


def load_text(figures: dict[str, str]) -> str:
    """The load column: `running R waiting W KV P%`; `-` for a figure the textfile lacks (the
    instance's /metrics could not be read at the last health run)."""
    run = _figure(figures.get("num_requests_running"), ".0f")
    wait = _figure(figures.get("num_requests_waiting"), ".0f")
    kv = _figure(figures.get("kv_cache_usage_ratio"), ".1%")
    return f"running {run:>3} waiting {wait:>3} KV {kv:>6}"


@reads_host(lambda why, lines, now: [f"units: {why}"])
def unit_lines(lines: list[str], now: float) -> list[str]:
    """`unit NAME STATE Description` lines and the prom metrics -> one line per instance."""
    ups = {m.group(1): m.group(2) for m in map(_UP.search, lines) if m}
    last = {m.group(1): host_time(m.group(2)) for m in map(_LAST.search, lines) if m}
    load: dict[str, dict[str, str]] = {}
    for m in filter(None, map(_LOAD.search, lines)):
        load.setdefault(m.group(2), {})[m.group(1)] = m.group(3)
    out = []
    for ln in lines:
        if not ln.startswith("unit "):
            continue
        parts = ln.split(" ", 3)
        if len(parts) < 3:
            continue  # not a line of the listing ("unit NAME" without a state)
        unit, state, what = (parts + [""])[1:4]
        name = unit.removeprefix("nemofleet-vllm-").removesuffix(".service")
        seen = last.get(name)
        age = f"{now - seen:.0f}s ago" if seen else "never"
        health = {"1": "healthy", "0": "UNHEALTHY"}.get(ups.get(name, ""), "unknown")
        served = what.split("(", 1)[1].rstrip(")") if "(" in what else what  # "model on GPU 0,1"
        figures = load_text(load.get(name, {}))
        out.append(f"{name:<14} {state:<10} {health:<10} last healthy {age:<10} {figures}  {served}")
    return out


@reads_host(lambda why, lines: [f"GPUs: {why}"])
def gpu_lines(lines: list[str]) -> list[str]:
    """`gpusick UUID SINCE INDEX REASON` (a GPU the health script drained) -> one line each."""
    out = []
    for ln in lines:
        parts = ln.split(None, 4)
        when = host_time(parts[2]) if len(parts) >= 4 and parts[0] == "gpusick" else None
        if when is not None:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
            why = parts[4] if len(parts) > 4 else "(no reason recorded)"
            out.append(f"GPU {parts[3]} ({parts[1]}) SICK since {since}, its instances out of the front door: {why}")
    return out


def status(inventory: str, limit: list[str] | None = None) -> list[HostStatus]:
    """One remote command per host: what the host has (release, units, metrics, weights) and the
    commit an unpinned revision names now (HubCommit's own query); the release the inventory
    plans for it comes from the deploy's own decision (desired.decide over the same HostInputs)."""
    from ..desired import decide
    from ..facts.weights import hub_commits_script, parse_hub_commits

    serving = driver.serving_hosts(inventory, limit)
    specs = driver.host_specs(inventory, limit)
    facts = driver.gather_facts(inventory, limit)
    scripts: dict[str, list[str]] = {}
    result = {h: HostStatus(h) for h in specs if h in serving}
    unpinned = {h: to_resolve(specs[h]) for h in result}
    for h in result:
        script, result[h].problems = _script_for(specs[h])
        scripts.setdefault(script + hub_commits_script(unpinned[h]), []).append(h)
    answers: dict[str, list[str]] = {}
    for script, hosts in scripts.items():
        for h, e in driver.exec_all(inventory, hosts, script, timeout=180).items():
            r = result[h]
            r.reachable = e.reachable
            if not e.reachable:
                continue
            lines = answers[h] = e.lines()
            r.release = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("release id=")), None)
            r.lines = (gpu_lines(lines) + unit_lines(lines, time.time())
                       + [ln for ln in lines if ln.startswith(("weights ", "download "))] + canary_line(lines))
            members = specs[h].members
            if members:
                rank = members.index(h) if h in members else -1
                r.lines.insert(0, f"serving group {specs[h].settings.serving_group}: rank {rank} "
                                  f"({'head' if rank == 0 else 'worker'}) of {', '.join(members)}; the head's "
                                  "health is the group's")
    # the plan each host should hold, from the deploy's own decision over the one gatherer's inputs
    # (the secrets as the deploy reads them: they never enter the release id, but a controller
    # without the API key plans nothing, as its deploy would)
    planned = [h for h in answers if h in facts and not result[h].problems]
    every = inputs.gather(specs, {**facts, **{h: dict(facts[h], lock=None) for h in planned}}, hosts=planned,
                          commits={h: parse_hub_commits(unpinned[h], answers[h]) for h in planned if unpinned[h]})
    for h, i in every.items():
        r, want = result[h], decide(i)
        r.planned = want.release_id if want.ok else None
        r.record = _record(answers[h])
        r.planned_record = _record(["release " + ln for ln in render.release_record(want.plan).splitlines()]
                                   if want.ok and want.plan else [])
    drained = gateway.status_lines(inventory, list(result)) if result else {}  # held out at a gateway (issue 49)
    for h, lines in drained.items():
        result.get(h, next(iter(result.values()))).lines += lines
    return list(result.values())
