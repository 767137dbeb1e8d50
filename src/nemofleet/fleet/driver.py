"""The only code that runs pyinfra for the fleet commands.

pyinfra is run as `sys.executable -m pyinfra` (the interpreter nemofleet runs under, so a
package on PYTHONPATH works without a `pyinfra` script beside it), one process per step,
`--limit` per host. Every call is bounded by a timeout and answers a result object, never an
exception: a timed-out deploy still lets the rollout roll back, print its summary and audit.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from .. import shell  # the one quoting boundary
from ..lock.info import operator  # noqa: F401  (the one operator(): fleet commands read it from here)
from ..valuetypes import host_number
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

RC_MARK = "@@nemofleet-rc="
TIMEOUT_RC = 124
LOCK_TOKEN_ENV = "NEMOFLEET_LOCK_TOKEN"


class FleetError(Exception):
    """A command that cannot start (bad options, no such host, lock held): one sentence; exit 2."""


@dataclass
class Result:
    """One pyinfra run: its exit status (124 on timeout), stdout and stderr as text."""
    rc: int
    stdout: str
    stderr: str = ""
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def out(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Exec:
    """A shell snippet's answer from one host: its exit status and output lines (stdout and
    stderr, interleaved as pyinfra prints them). rc 255 when pyinfra could not connect."""
    host: str
    rc: int
    text: str
    reachable: bool = True

    def lines(self) -> list[str]:
        return self.text.splitlines()


def _text(value) -> str:
    # TimeoutExpired carries bytes even when text=True was asked for (CPython gh-87597)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def argv(inventory: str, hosts: list[str], args: list[str], data: dict | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pyinfra", "-y", inventory]
    for h in hosts:
        cmd += ["--limit", h]
    for k, v in (data or {}).items():
        cmd += ["--data", f"{k}={v}"]
    return cmd + list(args)


def run(inventory: str, hosts: list[str], *args: str, data: dict | None = None, timeout: float = 600,
        env: dict | None = None, beat: "Heartbeat | None" = None) -> Result:
    """Run pyinfra on `hosts`; never raises for a failure or a timeout of the run itself. With a
    heartbeat, pyinfra's output is read as it comes and its stages go to the heartbeat."""
    cmd = argv(inventory, hosts, list(args), data)
    full_env = dict(os.environ, PYINFRA_PROGRESS="off", **(env or {}))
    t0 = time.time()
    try:
        if beat is None:
            p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout,
                               stdin=subprocess.DEVNULL)
            return Result(p.returncode, p.stdout, p.stderr, seconds=time.time() - t0)
        streamed = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                                    stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired as exc:
        return Result(TIMEOUT_RC, _text(exc.stdout), _text(exc.stderr) + f"\npyinfra timed out after {timeout:.0f}s",
                      timed_out=True, seconds=time.time() - t0)
    except OSError as exc:
        return Result(127, "", f"could not run {' '.join(cmd[:3])}: {exc}", seconds=time.time() - t0)
    return _streamed(streamed, t0, timeout, beat)


def _host_said(out: str, host: str, what: str = r"\S.*") -> str | None:
    """The first line pyinfra printed about `host` that is `what` (`    [host] Could not resolve hostname ...`)."""
    m = re.search(rf"^\s*\[{re.escape(host)}\]\s+({what})$", out, re.M)
    return m.group(1).strip() if m else None


def connected(out: str, host: str) -> bool:
    return _host_said(out, host, r"Connected\s*") is not None


def _connect_error(r: Result, host: str) -> str:
    return _host_said(r.out, host, "Could not connect.*") or (
        "timed out before connecting" if r.timed_out else f"no answer: {r.out.strip()[-200:]}")


def _host_lines(out: str, host: str) -> list[str]:
    """Command output of `host`: pyinfra prints it at column 0 as `[host] text` (its own status
    lines are indented)."""
    prefix = f"[{host}]"
    return [line[len(prefix):].strip() for line in out.splitlines() if line.startswith(prefix + " ")
            or line == prefix]


def exec_all(inventory: str, hosts: list[str], script: str, timeout: float = 120,
             env: dict | None = None) -> dict[str, Exec]:
    """Run a shell snippet on every host in one pyinfra process (in parallel); {host: Exec}.
    The snippet's own exit status comes back in a marker line, so one failing host does not
    hide the others' answers."""
    if not hosts:
        return {}
    command = f"sh -c {shell.quote(script)}; echo {RC_MARK}$?"
    r = run(inventory, hosts, "exec", "--", command, timeout=timeout, env=env)
    out = {}
    for h in hosts:
        if not connected(r.out, h):
            out[h] = Exec(h, 255, _connect_error(r, h), reachable=False)
            continue
        lines = _host_lines(r.out, h)
        marks = [ln for ln in lines if ln.startswith(RC_MARK)]
        rc = host_number(marks[-1][len(RC_MARK):], 0, 255) if marks else (TIMEOUT_RC if r.timed_out else 1)
        rc = 1 if rc is None else rc  # a mark that is no exit status: the snippet's own output forged it
        out[h] = Exec(h, rc, "\n".join(ln for ln in lines if not ln.startswith(RC_MARK)))
    return out


def on_host(inventory: str, host: str, script: str, timeout: float = 120, env: dict | None = None) -> Exec:
    return exec_all(inventory, [host], script, timeout, env)[host]


def _inventory(inventory: str):
    from pyinfra.api import Config, State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    state = State(check_for_changes=False)
    with ctx_state.use(state):
        inv = make_inventory(inventory, cwd=os.getcwd())
    state.init(inv, Config())
    return inv


def _select(inventory: str, limit: list[str] | None) -> list:
    """Hosts matching `--limit` the way pyinfra matches it (a group name, else a glob on host
    names), in inventory order. An empty inventory or a pattern that matches nothing is an error:
    a rollout of nothing must not succeed silently."""
    everyone = list(_inventory(inventory))
    if not everyone:
        raise FleetError(f"{inventory} has no hosts")
    if not limit:
        return everyone
    chosen: set[str] = set()
    for pattern in limit:
        group = [h for h in everyone if pattern in (h.groups or [])]
        hits = group or [h for h in everyone if fnmatch.fnmatch(h.name, pattern)]
        if not hits:
            raise FleetError(f"--limit {pattern} matches no host or group of {inventory} "
                             f"(hosts: {', '.join(h.name for h in everyone[:10])}{' ...' if len(everyone) > 10 else ''})")
        chosen.update(h.name for h in hits)
    return [h for h in everyone if h.name in chosen]


def _merged(h) -> dict:
    """A pyinfra host's merged data (group data, then the host's own)."""
    from pyinfra.api.host import extract_callable_datas

    merged: dict = {}
    for layer in reversed(list(extract_callable_datas(h.data.datas))):
        merged.update(layer)
    return merged


def host_data(inventory: str, limit: list[str] | None = None) -> dict[str, dict]:
    """Merged host data per host (group data, then the host's own), in inventory order."""
    return {h.name: _merged(h) for h in _select(inventory, limit)}


def host_groups(inventory: str, limit: list[str] | None = None) -> dict[str, list[str]]:
    """The inventory groups of each host, as pyinfra lists them (a host listed twice in one group
    appears there twice)."""
    return {h.name: list(h.groups or []) for h in _select(inventory, limit)}


from .. import inputs, spec  # noqa: E402
from ..spec import GATEWAY_GROUP  # noqa: E402  fleet gateways serve no model: rollouts and status skip them


def host_specs(inventory: str, limit: list[str] | None = None) -> dict:
    """{host: spec.HostSpec} of the selected hosts, read once (the edge: data and secrets typed)."""
    hosts = _select(inventory, limit)
    return spec.read_all({h.name: _merged(h) for h in hosts}, {h.name: list(h.groups or []) for h in hosts})


def serving_hosts(inventory: str, limit: list[str] | None = None) -> list[str]:
    """The selected hosts that serve a model (gateway hosts left out); none is an error."""
    groups = host_groups(inventory, limit)
    out = [h for h, g in groups.items() if GATEWAY_GROUP not in g]
    if not out:
        raise FleetError(f"the hosts selected in {inventory} are all in the {GATEWAY_GROUP} group: they serve no "
                         "model (deploy them with deploys/gateway.py)")
    return out


def group_units(inventory: str, hosts: list[str]) -> list[list[str]]:
    """`hosts` as deploy units, in order: a member of a multi-node serving group brings its whole
    group (its members in rank order, the head first: one model, restarted, gated and rolled back
    together); any other host is a unit of its own. A selection that takes part of a group is
    refused: deploying half a group would leave its members running different releases."""
    data = host_data(inventory)
    out: list = []
    seen: set = set()
    for h in hosts:
        if h in seen:
            continue
        group, members = inputs.group_of(data.get(h))
        if members:
            missing = [m for m in members if m not in hosts]
            if missing:
                raise FleetError(f"the selection takes {h} but not {', '.join(missing)} of serving group "
                                 f"{group}: a group deploys, restarts and rolls back as one unit; select "
                                 f"all its members (--limit {','.join(members)})")
            out.append(list(members))
            seen.update(members)
        else:
            out.append([h])
            seen.add(h)
    return out


def hosts(inventory: str, limit: list[str] | None = None) -> list[str]:
    return list(host_data(inventory, limit))


def gather_facts(inventory: str, limit: list[str] | None = None, timeout: float = 600) -> dict:
    """HostFacts of every host, read-only (pyinfra's `fact` command); {host: facts} for the hosts
    that answered (an unreachable host is absent)."""
    names = hosts(inventory, limit)
    r = run(inventory, list(limit or []), "--json", "fact", "nemofleet.facts.host.HostFacts", timeout=timeout)
    try:
        data = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    except ValueError:
        said = {h: (_host_said(r.out, h) or "")[:300] for h in names}
        if any(said.values()):  # no host answered: one sentence per host, as pyinfra said it
            raise FleetError(f"no host of {inventory} answered:" + "".join(
                f"\n  {h}: {why or 'no answer'}" for h, why in said.items())) from None
        raise FleetError(f"could not read facts from {inventory}: {r.out.strip()[-500:]}") from None
    data = data.get("nemofleet.facts.host.HostFacts", data) if isinstance(data, dict) else None
    if not isinstance(data, dict):
        raise FleetError(f"could not read facts from {inventory}: pyinfra's answer is not an object of hosts")
    # a host whose answer is not an object of parts is one that did not answer (inputs.make types the rest)
    return {h: data[h] for h in names if isinstance(data.get(h), dict)}


def resolve_commits(inventory: str, wanted: dict) -> dict:
    """{host: {(endpoint, repo, revision): {"sha"} | {"error"}}} for the unpinned revisions of each
    host ({host: [(endpoint, repo, revision), ...]}), asked from the host the way the deploy's
    HubCommit fact asks (the host, not the controller, reaches the mirror); hosts with nothing to
    resolve are not contacted."""
    from ..facts.weights import hub_commits_script, parse_hub_commits

    by_script: dict = {}
    for h, items in wanted.items():
        if items:
            by_script.setdefault(hub_commits_script(items), []).append((h, items))
    out: dict = {}
    for script, hosts in by_script.items():
        answers = exec_all(inventory, [h for h, _ in hosts], script, timeout=60)
        for h, items in hosts:
            e = answers[h]
            out[h] = (parse_hub_commits(items, e.lines()) if e.reachable else
                      {tuple(i): {"error": f"{h} is unreachable ({e.text[:120]})"} for i in items})
    return out


# ---------------------------------------------------------------------------- kept connections

class Session:
    """One kept SSH connection per host through pyinfra's Python API, for what a rollout asks
    every few seconds (the health gate's polls, the bake's metrics reads): no new pyinfra process
    and no new SSH handshake per poll. run() answers an Exec like on_host (rc 255 and
    reachable=False when the host cannot be reached; one reconnect is tried after a lost
    connection). Calls on different hosts may run in parallel; one host's calls are serialised."""

    def __init__(self, inventory: str, hosts: list[str]):
        inv = _inventory(inventory)
        self.hosts = {h.name: h for h in inv if h.name in set(hosts)}
        missing = [h for h in hosts if h not in self.hosts]
        if missing:
            raise FleetError(f"{', '.join(missing)} not found in {inventory}")
        self.locks = {name: threading.Lock() for name in self.hosts}

    def _once(self, h, script: str, timeout: float):
        from pyinfra.api.command import StringCommand

        if not h.connected:
            h.connect(raise_exceptions=True)
        args = {k: h.data.get(k) for k in ("_sudo", "_sudo_user", "_su_user") if h.data.get(k)}
        return h.run_shell_command(StringCommand(f"bash -c {shell.quote(script)}"), _timeout=int(timeout), **args)

    def run(self, host: str, script: str, timeout: float = 60) -> Exec:
        h = self.hosts.get(host)
        if h is None:
            return Exec(host, 255, f"{host} is not in this session", reachable=False)
        with self.locks[host]:
            for attempt in (1, 2):
                try:
                    ok, out = self._once(h, script, timeout)
                except Exception as exc:  # noqa: BLE001 - any connector failure is the host's answer
                    try:
                        h.disconnect()
                    except Exception:  # noqa: BLE001
                        pass
                    h.connected = False
                    if attempt == 2:
                        return Exec(host, 255, f"no answer over the kept connection: {str(exc)[:200]}",
                                    reachable=False)
                    continue
                rc = 0 if ok else (getattr(out, "exit_code", None) or 1)
                return Exec(host, rc, "\n".join(out.stdout_lines + out.stderr_lines))
        raise AssertionError("unreachable")

    def close(self) -> None:
        for h in self.hosts.values():
            try:
                if h.connected:
                    h.disconnect()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


# ---------------------------------------------------------------------------- progress

class Heartbeat:
    """Progress of a long step: a line when its stage changes, and at least every `every` seconds
    while it runs ("never silent over 10 s", issue 38). `clock` is injectable (tests use a fake)."""

    def __init__(self, log, label: str, stage: str = "starting", every: float = 10.0, clock=time.monotonic):
        self.log, self.label, self.every, self.clock = log, label, every, clock
        self.t0 = self.last = clock()
        self.stage = stage
        self.lines = 0

    def _emit(self) -> None:
        self.last = self.clock()
        self.lines += 1
        self.log(f"  {self.label}: {self.stage} ({self.last - self.t0:.0f}s)")

    def set(self, stage: str) -> None:
        if stage and stage != self.stage:
            self.stage = stage
            self._emit()

    def beat(self) -> None:
        if self.clock() - self.last >= self.every:
            self._emit()


def stage_of(line: str) -> str | None:
    """The stage a pyinfra output line announces, or None (`--> Starting operation: X`, the
    deploy's own `nemofleet ...` notes)."""
    s = line.strip()
    m = re.match(r"--> Starting (?:operation|deploy): (.*)", s)
    if m:
        return m.group(1).split(" | ")[0][:120]
    if s.startswith("--> "):
        return s[4:][:120]
    return None


def _streamed(p: subprocess.Popen, t0: float, timeout: float, beat: Heartbeat) -> Result:
    """run(), with pyinfra's output read as it comes: each stage it announces goes to `beat`,
    which also ticks every second (stdout and stderr are one stream here)."""
    lines: list[str] = []

    def read():
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            st = stage_of(line)
            if st:
                beat.set(st)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    while p.poll() is None:
        if time.time() - t0 > timeout:
            p.kill()
            timed_out = True
            break
        beat.beat()
        time.sleep(1)
    p.wait()
    reader.join(timeout=5)
    out = "".join(lines)
    if timed_out:
        return Result(TIMEOUT_RC, out, f"\npyinfra timed out after {timeout:.0f}s", timed_out=True,
                      seconds=time.time() - t0)
    return Result(p.returncode, out, "", seconds=time.time() - t0)
