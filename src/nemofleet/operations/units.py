"""systemd units of the vLLM instances: enabled and running; restart only what changed."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from ..facts.units import UnitStates
from ..facts.prefetch import fact

UNIT_GLOB = "/etc/systemd/system/nemofleet-vllm-*.service"


def running_reads(units) -> tuple:
    """The fact running() and enabled_and_active() read (deploy.py reads it ahead)."""
    return UnitStates, {"units": tuple(units)}


@operation(is_idempotent=True)
def running(units: list[str], changed: set | None = None, unit_dir: str = "/etc/systemd/system",
            deferred: set | None = None):
    """Every unit enabled and active; a unit whose file changed is restarted (only that one);
    nemofleet units no longer in the plan are stopped, disabled and removed. With `deferred` (a
    front door), a running unit whose file changed is not restarted here but added to the set:
    the deploy restarts it through the front door's drain, one at a time."""
    st = fact(*running_reads(units))
    stale = sorted(set(st["files"]) - set(units))
    cmds = []
    if stale:
        cmds.append(StringCommand("systemctl", "disable", "--now", *stale))
        cmds.append(StringCommand("rm", "-f", *[f"{unit_dir}/{u}" for u in stale]))
        cmds.append(StringCommand("systemctl", "daemon-reload"))
    for u in units:
        s = st["units"].get(u, {"enabled": False, "active": False})
        if not s["enabled"]:
            cmds.append(StringCommand("systemctl", "enable", u))
        if not s["active"]:
            cmds.append(StringCommand("systemctl", "start", "--no-block", u))
        elif changed and f"{unit_dir}/{u}" in changed:
            if deferred is not None:
                deferred.add(u)
            else:
                cmds.append(StringCommand("systemctl", "restart", "--no-block", u))
    if not cmds:
        host.noop(f"{len(units)} vLLM unit(s) enabled and active")
        return
    yield from cmds


@operation(is_idempotent=False)
def daemon_reload():
    """`systemctl daemon-reload`: always a change, so gate it with _if= on what changed."""
    yield "systemctl daemon-reload"


@operation(is_idempotent=True)
def enabled_and_active(unit: str):
    """One system unit (e.g. haproxy.service) enabled and running; a change only when it was not.
    Its fact is the same UnitStates the vLLM units use, read ahead with the rest."""
    s = fact(*running_reads([unit]))["units"].get(unit, {"enabled": False, "active": False})
    if s["enabled"] and s["active"]:
        host.noop(f"{unit} enabled and active")
        return
    if not s["enabled"]:
        yield StringCommand("timeout", "60", "systemctl", "enable", unit)
    if not s["active"]:
        yield StringCommand("timeout", "120", "systemctl", "start", unit)
