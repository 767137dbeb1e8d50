"""systemd units of the vLLM instances: enabled and running; restart only what changed."""

from __future__ import annotations


from pyinfra import host
from pyinfra.api import StringCommand, operation

from .. import shell
from ..facts.units import UnitStates
from ..facts.prefetch import fact
from . import cmd, reads_with

UNIT_GLOB = "/etc/systemd/system/nemofleet-vllm-*.service"
# the unit files nemofleet writes (paths.unit_path): the only names of the listing it acts on
UNIT_NAME = r"nemofleet-vllm-[A-Za-z0-9_.-]{1,64}\.service"
# systemctl talks to PID 1 over D-Bus; a wedged systemd must not hang the run
SYSTEMCTL_TIMEOUT = 120

# Restart the units without waiting for each start (they load in parallel), but return only once
# every one of them has left its old process: a readiness check right after must not be answered
# by the old server, still up until systemd's stop reaches it (at most RESTART_WAIT s).
RESTART_WAIT = 180
RESTART_SCRIPT = (
    'old=""; for u in "$@"; do old="$old $(systemctl show -p MainPID --value "$u")"; done; '
    'systemctl restart --no-block "$@" || exit 1; end=$(( $(date +%s) + ' + str(RESTART_WAIT) + ' )); '
    'for u in "$@"; do set -- $old; p=$1; shift; old="$*"; '
    'while [ "$p" != 0 ] && [ "$(systemctl show -p MainPID --value "$u")" = "$p" ]; do '
    '[ $(date +%s) -lt $end ] || { echo "$u still runs its old process $p after ' + str(RESTART_WAIT) + ' s" >&2; exit 1; }; '
    'sleep 0.5; done; done')


def restart_command(units: list[str]) -> StringCommand:
    """`systemctl restart --no-block UNITS`, returning once each has left its old main process."""
    return StringCommand("sh", "-c", shell.quote(RESTART_SCRIPT), "restart", *units)


def running_reads(units) -> tuple:
    """The fact running() and enabled_and_active() read (deploy.py reads it ahead)."""
    return UnitStates, {"units": tuple(units)}


@reads_with(lambda units, **_: running_reads(units))
@operation(is_idempotent=True)
def running(units: list[str], changed: set | None = None, unit_dir: str = "/etc/systemd/system",
            deferred: set | None = None):
    """Every unit enabled and active; a unit whose file changed is restarted (only that one);
    nemofleet units no longer in the plan are stopped, disabled and removed. With `deferred` (a
    front door), a running unit whose file changed is not restarted here but added to the set:
    the deploy restarts it through the front door's drain, one at a time."""
    st = fact(*running_reads(units))
    # names read from the unit directory: only files of our own shape are stopped and removed
    stale = sorted(set(shell.own_names(st["files"], UNIT_NAME)) - set(units))
    cmds, restart = [], []
    if stale:
        cmds.append(cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "disable", "--now", "--", *stale))
        cmds.append(cmd("rm", "-f", "--", *[f"{unit_dir}/{u}" for u in stale]))
        cmds.append(cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "daemon-reload"))
    for u in units:
        s = st["units"].get(u, {"enabled": False, "active": False})
        if not s["enabled"]:
            cmds.append(cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "enable", "--", u))
        if not s["active"]:
            cmds.append(cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "start", "--no-block", "--", u))
        elif changed and f"{unit_dir}/{u}" in changed:
            if deferred is not None:
                deferred.add(u)
            else:
                restart.append(u)
    if restart:
        cmds.append(restart_command(restart))
    if not cmds:
        host.noop(f"{len(units)} vLLM unit(s) enabled and active")
        return
    yield from cmds


@operation(is_idempotent=False)
def daemon_reload():
    """`systemctl daemon-reload`: always a change, so gate it with _if= on what changed."""
    yield "systemctl daemon-reload"


@reads_with(lambda unit, **_: running_reads([unit]))
@operation(is_idempotent=True)
def enabled_and_active(unit: str):
    """One system unit (e.g. haproxy.service) enabled and running; a change only when it was not.
    Its fact is the same UnitStates the vLLM units use, read ahead with the rest."""
    s = fact(*running_reads([unit]))["units"].get(unit, {"enabled": False, "active": False})
    if s["enabled"] and s["active"]:
        host.noop(f"{unit} enabled and active")
        return
    if not s["enabled"]:
        yield cmd("timeout", 60, "systemctl", "enable", "--", unit)
    if not s["active"]:
        yield cmd("timeout", 120, "systemctl", "start", "--", unit)
