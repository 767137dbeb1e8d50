"""The deploy lock inside a plain pyinfra run (`pyinfra INVENTORY deploys/nemotron.py` with no
NEMOFLEET_LOCK_TOKEN): taken on a host right before the first command that changes it, given
back when pyinfra disconnects from the host at the end of the run.

What was chosen, and why:

- **Take: with the first command that changes the host.** At the end of the deploy file, guard()
  wraps the command generator pyinfra keeps for each operation of the host. The wrapper lets
  the operation decide first (its `_if`, its facts); only when it yields a command, and the
  lock is not this run's yet, a FunctionCommand that takes the lock (the atomic acquire script,
  nemofleet.hostcmd.lock_acquire) runs before that command. Hence:
  * a converged host never takes the lock: its operations yield nothing, so it still reports
    zero changes and its remote commands stay those of its fact reads (2 per host);
  * the take is one more command of an operation that changes the host anyway: it is never a
    change of its own (an operation that always ran would be one on every converged host);
  * `--dry` never executes operations, so it takes nothing;
  * the take runs after preflight and before the first change, bootstrap's driver install
    included (also an operation of this deploy);
  * the take is atomic on the host: two plain deploys that both passed preflight (which
    already refuses a host that someone else holds, lock/fact.py) cannot both hold it; the
    second one's operation fails before its first command, with the holder's name, and pyinfra
    skips that host's remaining operations.
- **Release: when pyinfra disconnects from the host.** The pyinfra CLI disconnects from every
  host it connected to in a `finally` after the run: when the host converged, when it failed
  part way (its remaining operations skipped), and when the run stopped on an error (too many
  failed hosts, an exception). guard() wraps that host's `disconnect` so that it first releases
  the lock it took (one remote command), while the connection is still open; a disconnect from
  within an operation (the reconnect after a reboot) keeps it. pyinfra's state
  callbacks do not do: `host_disconnect` fires after the connection is closed, and
  `operation_host_error` misses a run that stops on an error.
- **A killed controller** (SIGKILL, power loss) cannot release: the lock carries its expiry
  from the moment it appears (commands.lock_acquire), DEFAULT_TTL or NEMOFLEET_LOCK_TTL (same
  syntax and limits as `--lock-ttl`) after the take; the next deploy or `nemofleet lock acquire`
  takes an expired lock over and says whose it was. While the run goes on, an operation that
  starts more than a quarter of the TTL after the take (or the last refresh) refreshes it first,
  so a long run keeps its lock.
- **Under a token** (NEMOFLEET_LOCK_TOKEN: a rollout, rollback or rebuild, or an operator's
  `nemofleet lock acquire`) nothing here runs: the token's holder holds the lock for the
  deploy, as before, and preflight lets the deploy through only when the lock is that token's.

Only the SHA-256 of this run's token is ever sent to a host (the scripts compare digests).
"""

from __future__ import annotations

import os
import secrets
import time

from pyinfra import logger
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

from .. import hostcmd as commands
from . import info as lockinfo
from ..fleet.driver import LOCK_TOKEN_ENV, FleetError, operator
from .fleet import DEFAULT_TTL, parse_ttl

TTL_ENV = "NEMOFLEET_LOCK_TTL"
RUN_TOKEN = secrets.token_hex(16)  # this controller process's token (never leaves it)
MESSAGE = "plain pyinfra deploy"
TIMEOUT = 60  # seconds for one lock command
_WRAPPED = "_nemofleet_runlock"
_TAKEN: dict[str, float] = {}  # host name -> time.monotonic() of the take or last refresh
_EXEMPT: set[str] = set()  # operation hashes that never take the lock


def token() -> str:
    """The token this run's preflight judges the lock with: the rollout's (or operator's) when one
    is exported, else this run's own (so a host this run already locked passes its preflight)."""
    return os.environ.get(LOCK_TOKEN_ENV) or RUN_TOKEN


def ttl() -> int:
    """This run's lock TTL in seconds; FleetError (one sentence) for a bad NEMOFLEET_LOCK_TTL."""
    text = os.environ.get(TTL_ENV)
    if not text:
        return DEFAULT_TTL
    try:
        return parse_ttl(text)
    except FleetError as exc:
        raise FleetError(str(exc).replace("--lock-ttl", TTL_ENV, 1)) from None


def exempt(op_meta) -> None:
    """An operation that never needs the lock (the preflight verdict: its only command fails the
    host it refuses)."""
    _EXEMPT.add(op_meta._hash)


def guard(state=None, host=None) -> None:
    """Make this host's operations (those added so far) take the lock before their first command,
    and this host's disconnect give it back. Call at the end of a deploy that may change a host.
    Does nothing under a token (the lock is its holder's)."""
    if os.environ.get(LOCK_TOKEN_ENV):
        return
    host = host or ctx_host.get()
    state = state or ctx_state.get() or host.state
    for op_hash, op_data in (state.ops.get(host) or {}).items():
        if op_hash not in _EXEMPT and not getattr(op_data.command_generator, _WRAPPED, False):
            op_data.command_generator = _wrap(state, host, op_data.command_generator)
    if not getattr(host.disconnect, _WRAPPED, False):
        host.disconnect = _releasing(host, host.disconnect)


def _wrap(state, host, generator):
    def commands_under_lock():
        if not state.is_executing:  # change detection (a run without -y): look, take nothing
            yield from generator()
            return
        it = generator()
        first = next(it, None)  # the operation decides (its _if, its facts) before the lock is taken
        if first is None:
            return
        taken = _TAKEN.get(host.name)
        if taken is None:
            yield FunctionCommand(take, (), {})
        elif time.monotonic() - taken > _ttl_or_default() / 4:
            yield FunctionCommand(refresh, (), {})
        yield first
        yield from it

    setattr(commands_under_lock, _WRAPPED, True)
    return commands_under_lock


def _releasing(host, disconnect):
    def disconnect_after_release(*args, **kwargs):
        # a disconnect inside an operation (operations/reboot.py reconnects after its reboot) is
        # not the end of the run: the lock stays (on disk) across the reboot
        if getattr(host, "executing_op_hash", None) is None:
            release(host)  # never raises
        return disconnect(*args, **kwargs)

    setattr(disconnect_after_release, _WRAPPED, True)
    return disconnect_after_release


def _ttl_or_default() -> int:
    try:
        return ttl()
    except FleetError:
        return DEFAULT_TTL


def _connector_args(state, host) -> dict:
    """The host's connection settings as pyinfra runs its facts with them (sudo, su, ...)."""
    args, _ = pop_global_arguments(state, host, {})
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS}


def _run(state, host, script: str) -> tuple[dict, str]:
    """Run a lock script on `host`: ({key: value} of its output, its last output line for an
    error sentence). Never raises."""
    try:
        _, output = host.run_shell_command(StringCommand(script), **{**_connector_args(state, host),
                                                                     "_timeout": TIMEOUT})
    except Exception as exc:  # an SSH error or a timeout: a sentence, never a traceback
        return {}, lockinfo.said((str(exc).strip().splitlines() or [type(exc).__name__])[-1])
    lines = [line.line for line in output]
    return lockinfo.parse(output.stdout_lines), lockinfo.said(lines[-1] if lines else "")


def take(state, host) -> bool:
    """The FunctionCommand before a host's first change: True when this run holds the lock now;
    False (the operation fails, pyinfra skips the host's remaining operations) with one sentence
    when someone else holds it or the host did not answer."""
    try:
        seconds = ttl()
    except FleetError as exc:
        host.log(f"nemofleet refused {host.name}: {exc}", logger.error)
        return False
    out, last = _run(state, host, commands.lock_acquire(operator(), RUN_TOKEN, seconds, MESSAGE))
    st = out.get("state")
    if st in ("ACQUIRED", "OWNED"):
        _TAKEN[host.name] = time.monotonic()
        old = lockinfo.holder_info(out, "expired_")
        if old:
            host.log(f"the deploy lock of {lockinfo.describe(old)} had expired; taken over", logger.warning)
        return True
    if st == "HELD":
        info = lockinfo.holder_info(out) or {"holder": "unknown"}
        why = lockinfo.lock_refusal(info, None, out.get("now") or time.time())
        host.log(f"nemofleet refused {host.name}: {why or 'this host is locked by ' + lockinfo.describe(info)}",
                 logger.error)
    else:
        host.log(f"nemofleet refused {host.name}: could not take the deploy lock ({last})", logger.error)
    return False


def refresh(state, host) -> bool:
    """Push this run's expiry out before a later change; False (the host stops) when the lock was
    lost meanwhile (it expired and was taken over, or was broken with --force)."""
    out, last = _run(state, host, commands.lock_refresh(RUN_TOKEN, _ttl_or_default()))
    if out.get("state") == "REFRESHED":
        _TAKEN[host.name] = time.monotonic()
        return True
    _TAKEN.pop(host.name, None)  # not ours any more: never released by this run
    info = lockinfo.holder_info(out)
    host.log(f"nemofleet stopped {host.name}: its deploy lock was lost"
             + (f" to {lockinfo.describe(info)}" if info else f" ({last})") + "; nothing more changes here",
             logger.error)
    return False


def release(host) -> None:
    """Give back the lock this run took on `host` (nothing when it took none). Never raises: a
    lock it cannot release is named, and expires by its TTL."""
    if _TAKEN.pop(host.name, None) is None:
        return
    out, last = _run(host.state, host, commands.lock_release(RUN_TOKEN))
    if out.get("state") in ("RELEASED", "FREE"):
        host.log("deploy lock released", logger.info)
    else:
        host.log(f"warning: could not release the deploy lock on {host.name} ({out.get('state') or last}); it "
                 "expires by its TTL, and `nemofleet lock status` shows it", logger.warning)
