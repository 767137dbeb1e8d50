"""The deploy lock's info, read back: parsing the `key=value` lines the lock scripts print
(nemofleet.hostcmd) and the sentences that name a holder. Pure; shared by the fleet
commands and the deploy's DeployLock fact."""

from __future__ import annotations

import getpass
import os
import socket
import time

from ..hostcmd import token_digest
from ..valuetypes import UNIX_MAX, host_time, is_number, printable, reads_host



def operator() -> str:
    """Who runs this, for the lock's holder and the audit log (the deploy's own run and every fleet
    command alike): $NEMOFLEET_OPERATOR, else the login, @ this machine."""
    return f"{os.environ.get('NEMOFLEET_OPERATOR') or getpass.getuser()}@{socket.gethostname()}"


@reads_host(lambda why, lines: {})
def parse(lines) -> dict:
    """`key=value` lines -> {key: value}; other lines are ignored. A time (`now`, and `expires`
    under any prefix) is an int read by valuetypes.host_time, or left out when it is none: a
    hostile answer never reaches arithmetic or gmtime() unbounded."""
    out: dict = {}
    for line in lines:
        key, sep, value = str(line).strip().partition("=")
        if sep and key.replace("_", "").isalnum():
            out[key] = value
    for key in [k for k in out if k == "now" or k.endswith("expires")]:
        when = host_time(out.pop(key))
        if when is not None:
            out[key] = when
    return out


def holder_info(out: dict, prefix: str = "") -> dict | None:
    """The holder's fields of a parsed answer (those under `prefix`), or None when there are none."""
    keys = ("holder", "token_sha256", "since", "expires", "message")
    info = {k: out[prefix + k] for k in keys if prefix + k in out}
    return info or None


def _clock(now) -> float:
    """`now` when it is a time (a host's clock, or the controller's), else the controller's clock."""
    return now if is_number(now) and 0 <= now < UNIX_MAX else time.time()


def expired(info: dict, now: float) -> bool:
    exp = host_time(info.get("expires"))
    return exp is not None and exp <= _clock(now)


def describe(info: dict) -> str:
    """'alice@ops-1 since 2026-12-03T09:00:00Z (maintenance)': what the host wrote, printable
    (an escape sequence in a holder's name never reaches a terminal as it is)."""
    text = f"{info.get('holder') or 'unknown'} since {info.get('since') or 'an unknown time'}"
    return printable(text + (f" ({info['message']})" if info.get("message") else ""))


def said(text: str, default: str = "no answer") -> str:
    """The end of what a host printed (its last 200 characters), printable, for a sentence."""
    return printable(text.strip()[-200:]) or default


def until(info: dict, now: float | None = None) -> str:
    exp = host_time(info.get("expires"))
    if exp is None:
        return "no expiry recorded"
    left = exp - _clock(now)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
    return f"expired at {when}" if left <= 0 else f"expires {when} (in {left / 60:.0f} min)"


def lock_refusal(info: dict | None, token: str | None, now: float) -> str | None:
    """The sentence a deploy's preflight refuses with while another holds the lock, or None when
    it may go on: no lock, the lock is ours (the rollout that holds it exported its token as
    NEMOFLEET_LOCK_TOKEN, or this plain run took it: nemofleet.lock.run), or it expired (the next
    take, a rollout's or a plain run's first change, takes such a lock over and says whose)."""
    if not info or expired(info, now):
        return None
    # ours: the info file keeps the token's SHA-256 (`token_sha256`); a dict built by hand may carry the token itself
    if token and (info.get("token_sha256") == token_digest(token) or info.get("token") == token):
        return None
    return (f"this host is locked by {describe(info)}, {until(info, now)}; wait for it "
            "(`nemofleet lock status`) or, if it is abandoned, `nemofleet lock release --force`")
