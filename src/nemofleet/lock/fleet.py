"""The deploy lock: `with_lock(...)`, the one way rollout, rollback, rebuild and `nemofleet lock`
take it.

On every host a directory that appears with its info file in one atomic rename
(commands.lock_acquire): holder (operator@machine), the SHA-256 of a random token, since, expiry
(default 2 h, at most 7 days) and a message.
Only the token's holder releases it (`--force` breaks an abandoned lock); an expired lock is
taken over, and the takeover is reported. The token goes to the pyinfra deploys the holder
runs as NEMOFLEET_LOCK_TOKEN, so the deploy's preflight (lock/fact.py) lets them through and
refuses a foreign plain deploy. A token already in the environment (printed by
`nemofleet lock acquire`, shown once to its holder) is reused: the rollout then runs under that
lock and leaves it held. A token is always 128 random bits: one given from outside that is not
(an operator's name, the digest `lock status` shows) is refused, so nobody but the holder can
release a lock or run under it. A plain `pyinfra ... deploys/nemotron.py` takes the same lock
itself (nemofleet.lock.run).
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import hostcmd as commands
from . import info as lockinfo
from ..fleet import driver
from ..fleet.driver import LOCK_TOKEN_ENV, FleetError

DEFAULT_TTL = commands.NO_INFO_TTL  # 2 h
MAX_TTL = 7 * 86400  # --lock-ttl's maximum: a killed controller's lock blocks the hosts at most this long
TOKEN_HEX = 32  # a lock token: 128 random bits as hex, shown only to its holder
LOCK_TIMEOUT = 120  # seconds for one lock command on all hosts


class LockHeld(FleetError):
    """Another holder has the lock on a host (the sentence names them)."""


def parse_ttl(text: str) -> int:
    """'7200', '90m', '2h', '1d' -> seconds (at least a minute, at most MAX_TTL)."""
    m = re.fullmatch(r"\s*([0-9]{1,12})\s*([smhd]?)\s*", str(text))
    if not m:
        raise FleetError(f"--lock-ttl {text!r} must be seconds or N followed by s, m, h or d (e.g. 2h)")
    seconds = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if seconds < 60:
        raise FleetError(f"--lock-ttl {text} is under a minute; a rollout would lose its lock mid-batch")
    if seconds > MAX_TTL:
        raise FleetError(f"--lock-ttl {text.strip()} is over {MAX_TTL // 86400} days; a lock left by a killed "
                         "controller would block the fleet that long (a rollout refreshes its lock every batch)")
    return seconds


def _ask(inventory: str, hosts: list[str], script: str) -> dict[str, tuple[driver.Exec, dict]]:
    """One lock command on every host at once: {host: (its answer, its `key=value` lines parsed)}."""
    return {h: (e, lockinfo.parse(e.lines())) for h, e in driver.exec_all(inventory, hosts, script, LOCK_TIMEOUT).items()}


def check_token(token: str) -> str:
    """A lock token given from outside (NEMOFLEET_LOCK_TOKEN) must be one nemofleet made: a
    random secret of TOKEN_HEX hex digits. A guessable one (an operator's name) would let anyone
    who can read `lock status` release the lock or deploy under it."""
    if not re.fullmatch(r"[0-9a-f]{%d}" % TOKEN_HEX, token or ""):
        raise FleetError(f"{LOCK_TOKEN_ENV} is not a lock token nemofleet made ({TOKEN_HEX} hex digits, printed "
                         "once by `nemofleet lock acquire`); unset it to take a new lock")
    return token


@dataclass
class Held:
    """A lock this process took (`acquired`) or runs under (`owned`: taken earlier with the same token)."""
    inventory: str
    token: str
    ttl: int
    acquired: list[str] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return self.acquired + self.owned

    def env(self) -> dict:
        """Environment for the pyinfra runs made under this lock."""
        return {LOCK_TOKEN_ENV: self.token}

    def refresh(self) -> list[str]:
        """Push the expiry out on every host; one sentence per host where the lock was lost."""
        lost = []
        for h, (e, out) in _ask(self.inventory, self.hosts, commands.lock_refresh(self.token, self.ttl)).items():
            if out.get("state") != "REFRESHED" and e.reachable:
                info = lockinfo.holder_info(out)
                lost.append(f"the lock on {h} was lost" + (f" to {lockinfo.describe(info)}" if info else
                                                           " (released by someone else)"))
        return lost


def acquire(inventory: str, hosts: list[str], message: str, ttl: int = DEFAULT_TTL,
            token: str | None = None, log=print) -> Held:
    """Take the lock on every host at once; on any refusal give back what was taken and raise."""
    given = token or os.environ.get(LOCK_TOKEN_ENV)
    held = Held(inventory, check_token(given) if given else secrets.token_hex(TOKEN_HEX // 2), ttl)
    answers = _ask(inventory, hosts, commands.lock_acquire(driver.operator(), held.token, ttl, message))
    problems = []
    for h in hosts:
        e, out = answers[h]
        state = out.get("state")
        if state == "ACQUIRED":
            held.acquired.append(h)
            old = lockinfo.holder_info(out, "expired_")
            if old:
                log(f"{h}: the lock of {lockinfo.describe(old)} had expired; taken over")
        elif state == "OWNED":
            held.owned.append(h)
        elif state == "HELD":
            problems.append(f"{h} is locked by {lockinfo.describe(lockinfo.holder_info(out) or {})}; wait for it "
                            "(`nemofleet lock status`) or, if it is abandoned, break it with `nemofleet lock release --force`")
        else:
            problems.append(f"could not take the deploy lock on {h}: {lockinfo.said(e.text)}")
    if problems:
        release(held)
        raise LockHeld("; ".join(problems))
    return held


def release(held: Held, log=print) -> None:
    """Give back the hosts this process locked (a lock it only ran under stays with its holder)."""
    for h, (e, out) in _ask(held.inventory, held.acquired, commands.lock_release(held.token)).items():
        state = out.get("state")
        if state not in ("RELEASED", "FREE"):
            log(f"warning: could not release the lock on {h} ({lockinfo.said(state or e.text)}); "
                "`nemofleet lock status` shows it")
    held.acquired = []


@contextmanager
def with_lock(inventory: str, hosts: list[str], message: str, ttl: int = DEFAULT_TTL, log=print):
    """`with with_lock(inv, hosts, "rollout ...") as held:` -- held.env() goes to every pyinfra run."""
    held = acquire(inventory, hosts, message, ttl, log=log)
    try:
        yield held
    finally:
        release(held, log=log)


def status(inventory: str, hosts: list[str]) -> dict[str, dict | None]:
    """{host: info (with `now`, the host's clock) or None when free}; unreachable hosts answer
    {"error": sentence}."""
    out: dict[str, dict | None] = {}
    for h, (e, parsed) in _ask(inventory, hosts, commands.lock_status()).items():
        if not e.reachable or "state" not in parsed:
            out[h] = {"error": lockinfo.said(e.text)}
        elif parsed["state"] == "HELD":
            out[h] = {**(lockinfo.holder_info(parsed) or {}), "now": parsed.get("now")}
        else:
            out[h] = None
    return out


def release_hosts(inventory: str, hosts: list[str], token: str | None, force: bool) -> dict[str, str]:
    """`nemofleet lock release`: {host: sentence} for each host; a sentence starts with "NOT
    released: unreachable" for a host that did not answer, "NOT released: held by" for one whose
    lock is someone else's."""
    out = {}
    for h, (e, parsed) in _ask(inventory, hosts, commands.lock_release(token, force)).items():
        state = parsed.get("state")
        if state == "RELEASED":
            broken = lockinfo.holder_info(parsed, "released_")
            out[h] = f"released (broke the lock of {lockinfo.describe(broken)})" if force and broken else "released"
        elif state == "FREE":
            out[h] = "was not locked"
        elif not e.reachable:
            out[h] = f"NOT released: unreachable ({lockinfo.said(e.text)})"
        elif state == "NOT_HOLDER":
            out[h] = (f"NOT released: held by {lockinfo.describe(lockinfo.holder_info(parsed) or {})}; only its "
                      f"holder's token ({LOCK_TOKEN_ENV}) releases it, or --force if it is abandoned")
        else:
            out[h] = f"NOT released: {lockinfo.said(e.text)}"
    return out
