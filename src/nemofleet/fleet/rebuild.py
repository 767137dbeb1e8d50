"""Disaster recovery: a reinstalled host back to serving (host key, lock, preflight, converge,
health gate), each stage timed.

A reinstalled host has a new SSH host key, and trusting a new key is exactly what an attacker
in the middle needs, so the key is compared BEFORE it is trusted: with an expected fingerprint
(`--expect-host-key SHA256:...`, or the host's `expected_host_key` setting, read out of band
from the console or the installer's log) the new key must match it; without one the
fingerprint is printed and the rebuild refuses unless the operator confirms with `--yes`.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .. import inputs, spec
from ..lock import fleet as lock
from . import driver, gateway, rollout
from .driver import FleetError

SCAN_TIMEOUT = 20


class RebuildError(RuntimeError):
    """A stage failed (exit 1)."""


@dataclass
class HostKey:
    entry: str  # the known_hosts name: host or [host]:port
    known_hosts: str
    scanned: str  # ssh-keyscan lines
    fingerprint: str  # SHA256:...
    known: bool  # the controller's known_hosts has an entry for the host
    matches: bool  # ... and it is this key


def read_host_key(name: str, port: int, known_hosts: str, host: str) -> HostKey:
    """The host's current keys (ssh-keyscan, every type) at its SSH address and port against the
    controller's known_hosts; the fingerprint shown and compared is the ed25519 key's (what
    `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` prints on the host's console)."""
    entry = f"[{name}]:{port}" if port != 22 else name
    try:
        scan = subprocess.run(["ssh-keyscan", "-T", "10", "-p", str(port), name],
                              capture_output=True, text=True, timeout=SCAN_TIMEOUT)
    except subprocess.TimeoutExpired:
        scan = None
    keys = [ln for ln in (scan.stdout if scan else "").splitlines() if ln.strip() and not ln.startswith("#")]
    if not keys:
        raise RebuildError(f"{host} ({name}:{port}) does not answer on SSH; is it reinstalled and up?")
    main = next((ln for ln in keys if " ssh-ed25519 " in ln), keys[0])
    fp = subprocess.run(["ssh-keygen", "-lf", "-"], input=main + "\n", capture_output=True, text=True,
                        timeout=SCAN_TIMEOUT).stdout.split()
    known = subprocess.run(["ssh-keygen", "-F", entry, "-f", known_hosts], capture_output=True, text=True,
                           timeout=SCAN_TIMEOUT).stdout if Path(known_hosts).exists() else ""
    lines = [ln for ln in known.splitlines() if ln and not ln.startswith("#")]
    blobs = {ln.split()[-1] for ln in keys}
    return HostKey(entry, known_hosts, "\n".join(keys) + "\n", next((w for w in fp if w.startswith("SHA256:")), ""),
                   bool(lines), any(ln.split()[-1] in blobs for ln in lines))


def trust_host_key(hk: HostKey, host: str, accept: bool, expected: str | None, yes: bool) -> str:
    """Decide on the host's key; returns what was done (one line for the output)."""
    if hk.matches:
        return f"host key of {host} unchanged ({hk.fingerprint})"
    if expected and hk.fingerprint != expected:
        raise RebuildError(f"{host}'s SSH host key is {hk.fingerprint}, not the expected {expected}: do not "
                           "trust it; check the host's console for its real fingerprint")
    if hk.known and not accept:
        raise RebuildError(f"{host}'s SSH host key changed (now {hk.fingerprint}; reinstalled?); confirm it with "
                           "--accept-new-host-key --expect-host-key SHA256:... (read on the host's console)")
    if hk.known and not expected and not yes:
        raise RebuildError(f"{host}'s new SSH host key is {hk.fingerprint}; compare it with the host's console, "
                           "then re-run with --expect-host-key " + hk.fingerprint + " (or --yes to trust it as is)")
    subprocess.run(["ssh-keygen", "-q", "-R", hk.entry, "-f", hk.known_hosts], capture_output=True,
                   timeout=SCAN_TIMEOUT)
    Path(hk.known_hosts).parent.mkdir(parents=True, exist_ok=True)
    with open(hk.known_hosts, "a") as f:
        f.write(hk.scanned)
    verdict = "matches the expected fingerprint" if expected else "trusted on --yes" if hk.known else "recorded (new host)"
    return f"host key of {host} replaced: {hk.fingerprint} ({verdict})"


def rebuild(inventory: str, host: str, accept_new_host_key: bool, *, expect_host_key: str | None = None,
            yes: bool = False, window: float = 1200, data: dict | None = None, ttl: int = lock.DEFAULT_TTL,
            log=print, gateway_drain: bool = True) -> dict[str, float]:
    if len(driver.hosts(inventory, [host])) != 1:
        raise FleetError(f"rebuild takes one host; {host} matches several")
    stages: dict[str, float] = {}
    t = time.time()
    d = driver.host_data(inventory, [host])[host]
    s = spec.read(host, d).settings  # None: a bad setting is refused by the preflight stage with its sentence
    # ssh_* are pyinfra's connector data (inputs.ssh_target: with its own defaults)
    hk = read_host_key(*inputs.ssh_target(d, host), host)
    expected = expect_host_key or (s.expected_host_key if s is not None else None)
    log(trust_host_key(hk, host, accept_new_host_key, expected, yes))
    stages["host key"] = time.time() - t
    # a member of a multi-node serving group is planned from every member's facts: the group's
    # other members join the run (they change nothing) and the head is gated before this host
    members = list(inputs.group_of(d)[1]) or [host]
    gw = gateway.Gateways(inventory, members, log, use=gateway_drain)  # drained there while it converges
    with lock.with_lock(inventory, members, f"rebuild by {driver.operator()}", ttl, log=log) as held, gw:
        t = time.time()
        r = driver.run(inventory, members, "deploys/preflight.py", data=data, env=held.env(), timeout=900)
        stages["preflight"] = time.time() - t
        if r.rc:
            raise RebuildError(f"preflight refused {host}:\n" + "\n".join(
                ln for ln in r.out.splitlines() if "refused" in ln or "rror" in ln))
        gw.check(members)
        gw.drain(members)
        t = time.time()
        r = driver.run(inventory, members, rollout.DEPLOY, data={**(data or {}), "wait_ready": "false"},
                       env=held.env(), timeout=window + rollout.DEPLOY_SLACK)
        stages["converge"] = time.time() - t
        if r.rc:
            raise RebuildError(f"converge of {host} failed:\n{r.out[-3000:]}")
        t = time.time()
        for m in [members[0]] + ([host] if host != members[0] else []):
            ok, detail = rollout.gate(inventory, m, window, log=log)
            if not ok:
                break
        stages["health gate"] = time.time() - t
        if not ok:
            raise RebuildError(f"{host} was rebuilt but is not healthy: {detail}")
        rollout.audit(inventory, host, "rebuild", ", ".join(f"{k} {v:.0f}s" for k, v in stages.items()))
    return stages
