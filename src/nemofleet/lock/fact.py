"""The deploy lock as a pyinfra fact, for the deploy's preflight.

    info = host.get_fact(DeployLock)
    why = lock_refusal(info, runlock.token(), time.time())

A rollout exports its lock token to the deploys it runs (NEMOFLEET_LOCK_TOKEN), so its own
deploy goes on while a plain `pyinfra ... deploys/nemotron.py` of someone else is refused with
the holder's name. This is the early check, before anything is decided; a plain run then takes
the lock itself with its first change (nemofleet.lock.run), which settles a race between two runs
that both passed this check. The lock itself: nemofleet.hostcmd (layout) and
nemofleet.lock.fleet.
"""

from __future__ import annotations

from ..facts import Fact
from .. import hostcmd as commands
from . import info as lockinfo
from .info import lock_refusal

__all__ = ["DeployLock", "lock_refusal"]


class DeployLock(Fact, part="lock"):
    """The lock's info {holder, token_sha256, since, expires, message, now} or None when free.
    `now` is the host's clock, the one `expires` was written with; a time that is none is left
    out (lockinfo.parse), so the part's type (factmodel.Lock) holds only what lockinfo can read."""

    def command(self) -> str:
        return commands.lock_status()  # always exits 0

    def parse(self, output):
        out = lockinfo.parse(output)
        if out.get("state") != "HELD":
            return None
        info = lockinfo.holder_info(out) or {"holder": "unknown"}
        return {**info, "now": out["now"]} if "now" in out else info
