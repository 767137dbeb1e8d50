"""systemd units of the vLLM instances: enabled and running; restart only what changed."""

from __future__ import annotations

from typing import NamedTuple

from pyinfra import host
from pyinfra.api import StringCommand, operation

from .. import shell
from ..paths import UNIT_DIR
from ..facts.units import UnitStates
from ..facts.prefetch import fact
from . import cmd, predicts, reads_with

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


def running_reads(units) -> tuple:
    """The fact running() and enabled_and_active() read (deploy.py reads it ahead)."""
    return UnitStates, {"units": tuple(units)}


class RunningPlan(NamedTuple):
    """What running() does, decided from its UnitStates fact (running_plan())."""
    stale: list[str]  # nemofleet units no longer planned: stopped, disabled, removed
    enable: list[str]
    start: list[str]
    restart: list[str]  # running, unit file changed, no front door: restarted together
    deferred: list[str]  # running, unit file changed, a front door: the deploy drains and restarts each

    def changes(self) -> bool:
        """Whether running() yields a command (the deferred restarts are not its own)."""
        return bool(self.stale or self.enable or self.start or self.restart)


def _plan(st: dict, units: list[str], changed, front_door: bool) -> RunningPlan:
    # names read from the unit directory: only files of our own shape are stopped and removed
    stale = sorted(set(shell.own_names(st["files"], UNIT_NAME)) - set(units))
    enable, start, restart = [], [], []
    for u in units:
        s = st["units"].get(u, {"enabled": False, "active": False})
        if not s["enabled"]:
            enable.append(u)
        if not s["active"]:
            start.append(u)
        elif changed and f"{UNIT_DIR}/{u}" in changed:
            restart.append(u)
    return RunningPlan(stale, enable, start, [] if front_door else restart, restart if front_door else [])


def _before_facts(units: list[str], deferred: set | None = None, **_) -> RunningPlan:
    """running_plan() while the recorder walks the stages: every unit enabled and (with a front
    door) drain-restarted, so every operation that may follow is walked."""
    return RunningPlan([], list(units), [], [], list(units) if deferred is not None else [])


@predicts(_before_facts)
def running_plan(units: list[str], changed: set | None = None, deferred: set | None = None) -> RunningPlan:
    """What running(units=..., changed=..., deferred=...) will do, from the same fact (read ahead):
    the deploy adds the ready wait only when it starts or restarts something, and a front door's
    drain restart only for a unit that runs now and whose file changes."""
    return _plan(fact(*running_reads(units)), units, changed, deferred is not None)


@reads_with(lambda units, **_: running_reads(units))
@operation(is_idempotent=True)
def running(units: list[str], changed: set | None = None, deferred: set | None = None):
    """Every unit enabled and active; a unit whose file changed (`changed`: the unit paths this
    run writes, files.will_change()) is restarted (only that one); nemofleet units no longer in
    the plan are stopped, disabled and removed. With `deferred` (a front door), a running unit
    whose file changed is not restarted here but added to the set: the deploy restarts it through
    the front door's drain, one at a time (running_plan() tells the deploy which, beforehand)."""
    p = running_plan(units, changed, deferred)
    if deferred is not None:
        deferred.update(p.deferred)
    if not p.changes():
        host.noop(f"{len(units)} vLLM unit(s) enabled and active")
        return
    if p.stale:
        yield cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "disable", "--now", "--", *p.stale)
        yield cmd("rm", "-f", "--", *[f"{UNIT_DIR}/{u}" for u in p.stale])
        yield cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "daemon-reload")
    for u in units:
        if u in p.enable:
            yield cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "enable", "--", u)
        if u in p.start:
            yield cmd("timeout", SYSTEMCTL_TIMEOUT, "systemctl", "start", "--no-block", "--", u)
    if p.restart:
        yield StringCommand("sh", "-c", shell.quote(RESTART_SCRIPT), "restart", *p.restart)


@operation(is_idempotent=False)
def daemon_reload():
    """`systemctl daemon-reload`: always a change, so the deploy adds it only when a file it
    reloads for will change (files.will_change())."""
    yield "systemctl daemon-reload"


def _unit_state(unit: str) -> dict:
    return fact(*running_reads([unit]))["units"].get(unit, {"enabled": False, "active": False})


# unknown: "already running", so the recorder also walks the reload the deploy adds then
@predicts(lambda unit, **_: False)
def will_enable_or_start(unit: str) -> bool:
    """Whether enabled_and_active(unit=...) will enable or start it (from the same fact)."""
    return _needs_change(_unit_state(unit))


def _needs_change(s: dict) -> bool:
    return not (s["enabled"] and s["active"])


@reads_with(lambda unit, **_: running_reads([unit]))
@operation(is_idempotent=True)
def enabled_and_active(unit: str):
    """One system unit (e.g. haproxy.service) enabled and running; a change only when it was not.
    Its fact is the same UnitStates the vLLM units use, read ahead with the rest."""
    s = _unit_state(unit)
    if not _needs_change(s):
        host.noop(f"{unit} enabled and active")
        return
    if not s["enabled"]:
        yield cmd("timeout", 60, "systemctl", "enable", "--", unit)
    if not s["active"]:
        yield cmd("timeout", 120, "systemctl", "start", "--", unit)
