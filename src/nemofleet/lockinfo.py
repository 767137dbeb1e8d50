"""The deploy lock's info, read back: parsing the `key=value` lines the lock scripts print
(nemofleet.hostcmd) and the sentences that name a holder. Pure; shared by the fleet
commands and the deploy's DeployLock fact."""

from __future__ import annotations

import re
import time

from .hostcmd import token_digest

NO_EXPIRY = float("inf")
# a time the lock program prints is at most 12 ASCII digits (remote/lock.py reads a longer expires=
# as none); anything else stays text, so a hostile answer never reaches int() or gmtime() unbounded
_TIME = re.compile(r"[0-9]{1,12}")


def parse(lines) -> dict:
    """`key=value` lines -> {key: value}; other lines are ignored. `expires` and `now` become ints
    when they are numbers of at most 12 digits."""
    out: dict = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key.replace("_", "").isalnum():
            out[key] = value
    for key in ("expires", "now", "expired_expires"):
        if _TIME.fullmatch(str(out.get(key, ""))):
            out[key] = int(out[key])
    return out


def holder_info(out: dict, prefix: str = "") -> dict | None:
    """The holder's fields of a parsed answer (those under `prefix`), or None when there are none."""
    keys = ("holder", "token_sha256", "since", "expires", "message")
    info = {k: out[prefix + k] for k in keys if prefix + k in out}
    if prefix and "expires" in info and _TIME.fullmatch(str(info["expires"])):
        info["expires"] = int(info["expires"])
    return info or None


def expired(info: dict, now: float) -> bool:
    exp = info.get("expires")
    return isinstance(exp, int) and exp <= now


def describe(info: dict) -> str:
    """'alice@ops-1 since 2026-12-03T09:00:00Z (maintenance)'."""
    text = f"{info.get('holder') or 'unknown'} since {info.get('since') or 'an unknown time'}"
    return text + (f" ({info['message']})" if info.get("message") else "")


def until(info: dict, now: float | None = None) -> str:
    exp = info.get("expires")
    if not isinstance(exp, int):
        return "no expiry recorded"
    left = exp - (time.time() if now is None else now)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
    return f"expired at {when}" if left <= 0 else f"expires {when} (in {left / 60:.0f} min)"


def holds(info: dict, token: str | None) -> bool:
    """Whether `token` is the lock's: the info file keeps its SHA-256 (`token_sha256`); a dict
    built by hand may carry the token itself."""
    if not token:
        return False
    return info.get("token_sha256") == token_digest(token) or info.get("token") == token


def lock_refusal(info: dict | None, token: str | None, now: float) -> str | None:
    """The sentence a deploy's preflight refuses with while another holds the lock, or None when
    it may go on: no lock, the lock is ours (the rollout that holds it exported its token as
    NEMOFLEET_LOCK_TOKEN, or this plain run took it: nemofleet.runlock), or it expired (the next
    take, a rollout's or a plain run's first change, takes such a lock over and says whose)."""
    if not info or expired(info, now) or holds(info, token):
        return None
    return (f"this host is locked by {describe(info)}, {until(info, now)}; wait for it "
            "(`nemofleet lock status`) or, if it is abandoned, `nemofleet lock release --force`")
