"""Fleet rollouts, rollback, deploy lock and disaster-recovery rebuilds, on top of pyinfra.

pyinfra runs each operation across all hosts and has no rolling batches, health gates,
locks or rollback (pyinfra docs: each operation completes on all hosts first). nemofleet drives it per host with --limit, in
inventory order, the way Kamal rolls web apps -- adapted to GPUs, where the new container
cannot start beside the old one: per host stop -> start the new release -> health gate,
and a failed gate puts the previous release back (units and record kept on the host).
"""
from __future__ import annotations

import getpass
import json
import math
import os
import shlex
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import paths

STATE = paths.STATE_DIR
LOCK = paths.LOCK
UNIT_DIR = paths.UNIT_DIR


def operator() -> str:
    return f"{os.environ.get('NEMOFLEET_OPERATOR') or getpass.getuser()}@{socket.gethostname()}"


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def pyinfra(inventory: str, hosts: list[str], *args: str, data: dict | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
    # the interpreter's own pyinfra: works where no `pyinfra` script sits beside it (PYTHONPATH installs)
    cmd = [sys.executable, "-m", "pyinfra", "-y", inventory]
    for h in hosts:
        cmd += ["--limit", h]
    for k, v in (data or {}).items():
        cmd += ["--data", f"{k}={v}"]
    cmd += list(args)
    env = dict(os.environ, PYINFRA_PROGRESS="off")
    if _LOCK_TOKEN:
        env["NEMOFLEET_LOCK_TOKEN"] = _LOCK_TOKEN
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired carries bytes even with text=True: a clean result, so callers still roll
        # back, print their summary and write the audit line
        return subprocess.CompletedProcess(cmd, 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {timeout}s")


UNREACHABLE = "##NEMOFLEET_UNREACHABLE##"


def on_host(inventory: str, host: str, script: str, timeout: float = 120) -> tuple[int, str]:
    """Run a shell snippet on one host through pyinfra (`exec`); (rc, its output lines).
    A host pyinfra could not connect to answers rc 255 and UNREACHABLE."""
    r = pyinfra(inventory, [host], "exec", "--", f"sh -c {shlex.quote(script)}", timeout=timeout)
    out = r.stdout + r.stderr
    if f"[{host}] Connected" not in out:
        return 255, f"{UNREACHABLE} {out.strip()[-300:]}"
    lines = [ln.strip().split("] ", 1)[1] for ln in out.splitlines()
             if ln.strip().startswith(f"[{host}] ") and not ln.strip().endswith("] Connected")]
    return r.returncode, "\n".join(lines)


def unreachable(output: str) -> bool:
    return UNREACHABLE in output or ("Connected" not in output and "Connecting" in output)


def host_data(inventory: str, limit: list[str]) -> dict:
    """Merged host data per host, read the way pyinfra reads the inventory."""
    from pyinfra.api import Config, State
    from pyinfra.api.host import extract_callable_datas
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    state = State(check_for_changes=False)
    with ctx_state.use(state):
        inv = make_inventory(inventory, cwd=os.getcwd())
    state.init(inv, Config())
    out = {}
    for h in inv:
        if limit and h.name not in limit:
            continue
        d: dict = {}
        for layer in reversed(list(extract_callable_datas(h.data.datas))):
            d.update(layer)
        out[h.name] = d
    return out


def inventory_hosts(inventory: str, limit: list[str] | None = None) -> list[str]:
    hosts = list(host_data(inventory, []))
    if not hosts:
        raise ValueError(f"{inventory} defines no host")
    if limit:
        unmatched = [pat for pat in limit if not any(_match(h, pat) for h in hosts)]
        if unmatched:
            raise ValueError(f"--limit {' '.join(unmatched)} matches no host of {inventory}")
        hosts = [h for h in hosts if any(_match(h, pat) for pat in limit)]
    return hosts


def _match(name: str, pattern: str) -> bool:
    import fnmatch
    return fnmatch.fnmatch(name, pattern)


def batches(hosts: list[str], batch: str, canary: int) -> list[list[str]]:
    """Deterministic batches in inventory order: the canary batch first, then `batch` (N or P%)."""
    if canary < 0 or canary >= max(1, len(hosts)) and canary:
        raise ValueError(f"--canary {canary} must be at least 0 and fewer than the {len(hosts)} host(s)")
    pct = batch.endswith("%")
    try:
        n = int(batch[:-1] if pct else batch)
    except ValueError:
        raise ValueError(f"--batch {batch!r} must be a count (N) or a percentage (P%)") from None
    if n < 1 or (pct and n > 100):
        raise ValueError(f"--batch {batch} must be a count of at least 1 or a percentage from 1% to 100%")
    out = []
    rest = list(hosts)
    if canary:
        out.append(rest[:canary])
        rest = rest[canary:]
    size = max(1, math.ceil(len(hosts) * n / 100)) if pct else n
    out += [rest[i:i + size] for i in range(0, len(rest), size)]
    return [b for b in out if b]


# ----------------------------------------------------------------------------- lock

LOCK_TTL = 2 * 3600  # seconds; an older lock may be taken over (a crashed rollout)
_LOCK_TOKEN: str | None = None  # the token of the lock this process holds (given to its pyinfra runs)


def lock_script(action: str, message: str = "", token: str = "", ttl: int = LOCK_TTL, force: bool = False) -> str:
    """Pure shell for the deploy lock: atomic mkdir plus an info file (holder, token, since,
    expires, message). Release only with the holder's token, unless forced."""
    q = shlex.quote
    if action == "acquire":
        now = int(time.time())
        info = json.dumps({"holder": operator(), "token": token, "message": message,
                           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "expires": now + ttl})
        take = f"echo {q(info)} > {LOCK}/info; echo LOCKED"
        return (f"mkdir -p {STATE}; if mkdir {LOCK} 2>/dev/null; then {take}; "
                f"else exp=$(sed -n 's/.*\"expires\": \\([0-9]*\\).*/\\1/p' {LOCK}/info 2>/dev/null); "
                f"if [ -n \"$exp\" ] && [ \"$exp\" -lt $(date +%s) ]; then echo EXPIRED; cat {LOCK}/info; {take}; "
                f"else echo HELD; cat {LOCK}/info; fi; fi")
    if action == "release":
        if force:
            return f"rm -rf {LOCK}; echo RELEASED"
        mine = q('"token": "' + token + '"')
        return (f"if [ ! -d {LOCK} ]; then echo RELEASED; elif grep -qF {mine} {LOCK}/info; "
                f"then rm -rf {LOCK}; echo RELEASED; else echo NOT-HOLDER; cat {LOCK}/info; fi")
    return f"if [ -d {LOCK} ]; then echo HELD; cat {LOCK}/info; else echo FREE; fi"


def lock_status(inventory: str, hosts: list[str]) -> dict[str, dict | None]:
    out = {}
    for h in hosts:
        rc, text = on_host(inventory, h, lock_script("status"))
        out[h] = _lock_info(text) if "HELD" in text else None
    return out


def _lock_info(text: str) -> dict:
    for line in text.splitlines():
        if line.strip().startswith("{"):
            try:
                return json.loads(line.strip())
            except ValueError:
                pass
    return {"holder": "unknown", "since": "unknown", "message": ""}


class LockHeld(RuntimeError):
    pass


def acquire(inventory: str, hosts: list[str], message: str, token: str | None = None) -> str:
    """Take the deploy lock on every host; on any conflict release ours and raise. Returns the token."""
    import secrets

    token = token or secrets.token_hex(8)
    taken = []
    for h in hosts:
        rc, text = on_host(inventory, h, lock_script("acquire", message, token))
        if "LOCKED" in text:
            taken.append(h)
            continue
        for t in taken:
            on_host(inventory, t, lock_script("release", token=token))
        if "HELD" in text:
            info = _lock_info(text)
            raise LockHeld(f"{h} is locked by {info.get('holder')} since {info.get('since')}"
                           f"{' (' + info['message'] + ')' if info.get('message') else ''}; "
                           "wait for it (`nemofleet lock status`) or, if it is abandoned, "
                           "`nemofleet lock release --force`")
        raise LockHeld(f"could not take the deploy lock on {h}: {text.strip()[-300:]}")
    return token


def release_all(inventory: str, hosts: list[str], token: str = "", force: bool = False) -> list[str]:
    """Release the lock on each host; returns the hosts where someone else holds it."""
    refused = []
    for h in hosts:
        rc, text = on_host(inventory, h, lock_script("release", token=token, force=force))
        if "NOT-HOLDER" in text:
            refused.append(h)
    return refused


class with_lock:
    """The one lock helper every mutating path uses (rollout, rollback, rebuild):
    `with with_lock(inventory, hosts, "rollout by ..."):`; the pyinfra runs inside are given the
    token, so the plain deploy they start is this lock's holder."""

    def __init__(self, inventory: str, hosts: list[str], message: str):
        self.inventory, self.hosts, self.message, self.token = inventory, hosts, message, None

    def __enter__(self):
        global _LOCK_TOKEN
        self.token = acquire(self.inventory, self.hosts, self.message)
        _LOCK_TOKEN = self.token
        return self

    def __exit__(self, *exc):
        global _LOCK_TOKEN
        _LOCK_TOKEN = None
        release_all(self.inventory, self.hosts, token=self.token)
        return False


# ----------------------------------------------------------------------------- gate / rollback

def audit(inventory: str, host: str, line: str) -> None:
    from .desired import audit_command  # the one audit-line format (the deploy writes it too)

    on_host(inventory, host, audit_command(operator(), line))


def current_release(inventory: str, host: str) -> str | None:
    rc, text = on_host(inventory, host, f"sed -n 's/^id=//p' {STATE}/release 2>/dev/null")
    ids = [ln.strip() for ln in text.splitlines() if len(ln.strip()) == 12 and ln.strip().isalnum()]
    return ids[-1] if ids else None


def gate(inventory: str, host: str, window: float, poll: float = 5.0, log=print) -> tuple[bool, str]:
    """Ready = every instance passes nemofleet-health (/health 200, model listed, optional probe)."""
    deadline = time.time() + window
    last = ""
    t0 = time.time()
    while True:
        # the gate only looks: FAIL_RESTART=0, so it never restarts an instance it is waiting for
        rc, text = on_host(inventory, host, f"FAIL_RESTART=0 flock -w 60 {paths.HEALTH_LOCK} {paths.HEALTH_SCRIPT}")
        last = " ".join(ln for ln in text.splitlines() if "instance" in ln)[-300:]
        if rc == 0:
            return True, last
        if unreachable(text):
            return False, "host unreachable"
        if time.time() > deadline:
            return False, last or text.strip()[-300:]
        log(f"  {host}: waiting for health ({time.time() - t0:.0f}s of {window:.0f}s): {last or 'no answer'}")
        time.sleep(poll)


ROLLBACK = f"""set -e
p={STATE}/previous
[ -f $p/release ] || {{ echo "no previous release kept on this host" >&2; exit 1; }}
for u in {UNIT_DIR}/nemofleet-vllm-*.service; do
  [ -e "$u" ] || continue; n=$(basename $u)
  if [ ! -e $p/$n ]; then systemctl disable --now $n; rm -f $u; fi
done
cp $p/nemofleet-vllm-*.service {UNIT_DIR}/
cp {STATE}/release {STATE}/release.rolled-back 2>/dev/null || true
cp $p/release {STATE}/release
systemctl daemon-reload
for u in $p/nemofleet-vllm-*.service; do systemctl enable -q $(basename $u); systemctl restart --no-block $(basename $u); done
echo "rolled back to $(sed -n 's/^id=//p' {STATE}/release)"
"""


def rollback_host(inventory: str, host: str) -> tuple[bool, str]:
    rc, text = on_host(inventory, host, ROLLBACK, timeout=300)
    return rc == 0, text.strip().splitlines()[-1] if text.strip() else ""


# ----------------------------------------------------------------------------- rollout

@dataclass
class HostResult:
    host: str
    old: str | None
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


def _deploy_one(inventory: str, host: str, data: dict, window: float, log) -> HostResult:
    t0 = time.time()
    res = HostResult(host, old=current_release(inventory, host))
    r = pyinfra(inventory, [host], "deploys/nemotron.py", data={**data, "wait_ready": "false"}, timeout=window + 900)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        res.seconds = time.time() - t0
        if unreachable(out) and "Connected" not in out:
            res.result, res.detail = "unreachable", "could not connect over SSH"
            return res
        res.result = "failed"
        res.detail = next((ln.strip() for ln in out.splitlines() if "refused" in ln or "rror" in ln), out.strip()[-200:])
    else:
        ok, detail = gate(inventory, host, window, log=log)
        res.new = current_release(inventory, host)
        res.result, res.detail = ("ok", detail) if ok else ("failed", f"health gate: {detail}")
    now = current_release(inventory, host) if res.result == "failed" else None
    if res.result == "failed" and res.old and now == res.old:
        # the new release never replaced the old one (refused by preflight, failed before the
        # record): rolling back would restore previous/, the release *before* this one
        res.detail += "; the host still serves its release, not rolled back"
    elif res.result == "failed" and res.old:
        ok, text = rollback_host(inventory, host)
        back, _ = gate(inventory, host, window, log=log) if ok else (False, "")
        res.result = "rolled back" if ok and back else "failed, rollback failed"
        res.detail += f"; {text}"
        res.new = current_release(inventory, host)
    res.seconds = time.time() - t0
    audit(inventory, host, f"rollout {res.old or 'none'} -> {res.new or 'none'}: {res.result}")
    return res


def rollout(inventory: str, *, batch: str = "1", canary: int = 0, max_failures: int = 0,
            window: float = 1200, limit: list[str] | None = None, data: dict | None = None,
            message: str = "", log=print) -> Outcome:
    hosts = inventory_hosts(inventory, limit)
    if not hosts:
        raise ValueError(f"no host of {inventory} matches --limit {' '.join(limit or [])}")
    plan = batches(hosts, batch, canary)
    outcome = Outcome([HostResult(h, old=None) for h in hosts])
    by_host = {r.host: r for r in outcome.results}
    reachable = []
    for h in hosts:
        rc, text = on_host(inventory, h, "true", timeout=60)
        if rc == 0:
            reachable.append(h)
        else:
            by_host[h].result, by_host[h].detail = "unreachable", "could not connect over SSH"
    failures = sum(1 for r in outcome.results if r.result == "unreachable")
    with with_lock(inventory, reachable, message or f"rollout by {operator()}"):
        _batches(inventory, plan, by_host, outcome, failures, canary, max_failures, data, window, log)
    return outcome


def _batches(inventory, plan, by_host, outcome, failures, canary, max_failures, data, window, log) -> None:
    """Each batch in turn; halts once the failure budget is spent."""
    for n, group in enumerate(plan):
        label = "canary" if canary and n == 0 else f"batch {n + (0 if canary else 1)}"
        todo = [h for h in group if by_host[h].result != "unreachable"]
        log(f"{label}: {', '.join(group)}")
        if failures > max_failures:
            outcome.halted, outcome.reason = True, f"failure budget {max_failures} spent before {label}"
            break
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            for res in pool.map(lambda h: _deploy_one(inventory, h, data or {}, window, log), todo):
                by_host[res.host].__dict__.update(res.__dict__)
                log(f"  {res.host}: {res.result} ({res.old or '-'} -> {res.new or '-'}, {res.seconds:.0f}s) {res.detail}")
                if res.result != "ok":
                    failures += 1
        if failures > max_failures:
            outcome.halted = True
            outcome.reason = f"{failures} failure(s), budget {max_failures}: halted after {label}"
            break


def rollback(inventory: str, limit: list[str] | None = None, window: float = 1200, log=print) -> Outcome:
    outcome = Outcome()
    hosts = inventory_hosts(inventory, limit)
    with with_lock(inventory, hosts, f"rollback by {operator()}"):
        for h in hosts:
            t0 = time.time()
            res = HostResult(h, old=current_release(inventory, h))
            ok, text = rollback_host(inventory, h)
            good, detail = gate(inventory, h, window, log=log) if ok else (False, text)
            res.new, res.result, res.detail = current_release(inventory, h), "ok" if good else "failed", detail
            res.seconds = time.time() - t0
            audit(inventory, h, f"rollback {res.old} -> {res.new}: {res.result}")
            outcome.results.append(res)
    outcome.halted = any(r.result != "ok" for r in outcome.results)
    return outcome


# ----------------------------------------------------------------------------- rebuild

def replace_host_key(inventory: str, host: str, known_hosts: str | None) -> str:
    """A reinstalled host has a new SSH host key. Replace it explicitly (the operator asked for
    it with --accept-new-host-key): remove the old entry, record the new one, print its fingerprint."""
    d = host_data(inventory, [host])[host]
    name, port = d.get("ssh_hostname", host), d.get("ssh_port", 22)
    kh = os.path.expanduser(known_hosts or d.get("ssh_known_hosts_file") or "~/.ssh/known_hosts")
    entry = f"[{name}]:{port}" if int(port) != 22 else name
    subprocess.run(["ssh-keygen", "-q", "-R", entry, "-f", kh], capture_output=True)
    scan = subprocess.run(["ssh-keyscan", "-p", str(port), "-t", "ed25519", name], capture_output=True, text=True)
    if scan.returncode or not scan.stdout.strip():
        raise RuntimeError(f"{host} ({name}:{port}) does not answer on SSH; is it reinstalled and up?")
    Path(kh).parent.mkdir(parents=True, exist_ok=True)
    with open(kh, "a") as f:
        f.write(scan.stdout)
    fp = subprocess.run(["ssh-keygen", "-lf", "-"], input=scan.stdout, capture_output=True, text=True).stdout.strip()
    return fp


def rebuild(inventory: str, host: str, accept_new_host_key: bool, window: float = 1200,
            data: dict | None = None, log=print) -> dict[str, float]:
    stages: dict[str, float] = {}
    t = time.time()
    if accept_new_host_key:
        fp = replace_host_key(inventory, host, None)
        log(f"host key of {host} replaced: {fp}")
    stages["host key"] = time.time() - t
    with with_lock(inventory, [host], f"rebuild by {operator()}"):
        _rebuild_stages(inventory, host, window, data, log, stages)
    return stages


def _rebuild_stages(inventory, host, window, data, log, stages) -> None:
    t = time.time()
    r = pyinfra(inventory, [host], "deploys/preflight.py", data=data)
    stages["preflight"] = time.time() - t
    if r.returncode:
        out = r.stdout + r.stderr
        if "host key" in out.lower():
            raise RuntimeError(f"{host}'s SSH host key changed (reinstalled?); confirm with --accept-new-host-key")
        raise RuntimeError(f"preflight refused {host}:\n" + "\n".join(ln for ln in out.splitlines() if "refused" in ln or "rror" in ln))
    t = time.time()
    r = pyinfra(inventory, [host], "deploys/nemotron.py", data={**(data or {}), "wait_ready": "false"})
    stages["converge"] = time.time() - t
    if r.returncode:
        raise RuntimeError(f"converge of {host} failed:\n{(r.stdout + r.stderr)[-3000:]}")
    t = time.time()
    ok, detail = gate(inventory, host, window, log=log)
    stages["health gate"] = time.time() - t
    if not ok:
        raise RuntimeError(f"{host} was rebuilt but is not healthy: {detail}")
    audit(inventory, host, "rebuild: " + ", ".join(f"{k} {v:.0f}s" for k, v in stages.items()))
