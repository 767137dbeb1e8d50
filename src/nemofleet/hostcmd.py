"""The commands the fleet layer runs on a host, as pure functions (no I/O).

Like Kamal's lib/kamal/commands/*.rb: every remote step is built here, as an argument list joined
by shell.join (the one quoting boundary). The steps themselves are remote programs, real Python
files run with `python3 -I -S` (remote/lock.py, remote/release.py, remote/gpu_return.py,
remote/host_status.py; remote/__init__.py says how they travel): every value they need (a holder,
a message, a token's digest, an expected release id, a path) is one of their arguments, never text
inside a shell line or a program. They print `key=value` lines the controller parses (see
`nemofleet.lock.info.parse`) and bound every wait they contain (`flock -w`, `timeout`).
tests/unit/test_fleet_commands.py and test_remote_lock.py run them against a temporary state
directory.

Lock layout: `paths.LOCK` is a directory that appears with its info file in one atomic rename
(whoever renames theirs into place holds the lock; see lock_acquire); `LOCK/info` holds `holder=`,
`token_sha256=`, `since=`, `expires=` (Unix time) and `message=`. Only the SHA-256 of the holder's
token is stored, and only it reaches the host: reading the info file (lock status, the deploy's
DeployLock fact) never reveals a token that would release the lock.
"""

from __future__ import annotations

import hashlib
import re

from . import paths, remote
from . import shell  # the one quoting boundary

# control characters and what str.splitlines() also ends a line at (\x85, \u2028, \u2029)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def one_line(text: str) -> str:
    """Free text (a lock message, an audit detail) as one printable line: a newline in it would
    forge a key of the info file or a line of the audit log."""
    return _CONTROL.sub(" ", text).strip()


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _lock(*args) -> str:
    return shell.join(remote.argv("lock", paths.LOCK, *args))


# a lock dir without a readable expiry (an older nemofleet that died between its `mkdir` and its
# info file) expires this long after it was made (its mtime): the default TTL of nemofleet.lock.fleet
# (remote/lock.py has the same figure; tests/unit/test_remote_lock.py keeps them equal)
NO_INFO_TTL = 2 * 3600


def lock_acquire(holder: str, token: str, ttl: int, message: str) -> str:
    """Take the deploy lock (remote/lock.py acquire). Prints `state=ACQUIRED` (ours now),
    `state=OWNED` (already held with this token: a rollout run under `nemofleet lock acquire`'s
    token) or `state=HELD` and the holder's info.

    The lock appears in one atomic step: its info file is written into a fresh temporary
    directory, which is then renamed onto `paths.LOCK` (rename(2), which fails while the lock
    exists with its info; a check just before it keeps an empty lock directory an older nemofleet
    may have just made from being replaced). A controller killed at any point leaves either no
    lock or a lock with its expiry, never a lock without one (a leftover temporary directory is not
    the lock, and is removed an hour later by the next acquire).

    An expired lock is taken over first (`expired_*=` lines name the old holder); the takeover
    renames the old directory away and re-checks that it moved the expired lock (not a fresh one
    taken meanwhile by another controller), else puts it back. A lock without info (made by an
    older nemofleet) expires NO_INFO_TTL after it was made. Only the token's SHA-256 reaches the
    host."""
    return _lock("acquire", one_line(holder), token_digest(token), int(ttl), one_line(message))


def lock_release(token: str | None, force: bool = False) -> str:
    """Release the lock: only with the holder's token, or `force` (a lock whose holder is gone).
    Prints `state=RELEASED` (with the released holder's info when forced), `state=FREE` (no lock)
    or `state=NOT_HOLDER` and the holder's info."""
    return _lock("release", token_digest(token) if token else "-", *(["force"] if force else []))


def lock_refresh(token: str, ttl: int) -> str:
    """Push the holder's expiry to now + ttl (a rollout does this before every batch, so a long
    rollout is not taken over). Prints `state=REFRESHED`, or `state=LOST` and the info of
    whoever holds it now (ours expired and was taken over, or was force-released)."""
    return _lock("refresh", token_digest(token), int(ttl))


def lock_status() -> str:
    """Read the lock: `state=FREE`, or `state=HELD` and its info; `now=` is the host's clock (an
    expiry is judged against the host that wrote it). Always exits 0 (the DeployLock fact).

    The DeployLock fact reads this in every deploy's facts, on every host: the program (a python
    start, about 10 ms of a host's CPU) runs only when something is at the lock's path; a host
    without a lock, a converged no-op's usual case, answers from `test` and `date` alone. Only
    constant words are in the shell line."""
    there = f"[ -e {shell.quote(paths.LOCK)} ] || [ -L {shell.quote(paths.LOCK)} ]"
    return f"if {there}; then {_lock('status')}; else echo state=FREE; echo now=$(date +%s); fi"


def _release(action: str, *args) -> str:
    return shell.join(remote.argv("release", action, *args))


def release_read() -> str:
    """The release record (`id=`, `image=`, ...) and a digest of the unit files: a rollout compares
    both before and after the deploy to know whether it touched the host at all."""
    return _release("read", paths.RELEASE, paths.UNIT_DIR, paths.UNIT_PREFIX)


def keep_previous() -> str:
    """Keep the release being replaced (units + record) so a rollback can return to it."""
    return _release("keep", paths.RELEASE, paths.UNIT_DIR, paths.UNIT_PREFIX, paths.PREVIOUS)


def rollback(expect: str | None = None, ready_timeout: int = 60) -> str:
    """Put the kept release back: its units replace the current ones (units it does not have are
    stopped and removed), its record becomes the release. With `expect`, refuse unless the kept
    release is that id: a rollout rolls a host back only to the release it replaced on it.
    On a host with a front door the instances restart one at a time through it (drained, restarted,
    ready within `ready_timeout`, back in), so the host keeps serving; one that is not ready in time
    is left to the front door's health checks (and the health cron puts it back), never blocking the
    others. Without a front door they restart at once. Every systemctl and drain call is bounded
    (remote/release.py)."""
    return _release("rollback", paths.RELEASE, paths.UNIT_DIR, paths.UNIT_PREFIX, paths.PREVIOUS,
                    paths.DRAIN_SCRIPT, paths.HEALTH_LOCK, expect or "", int(ready_timeout))


def audit_command(operator: str, event: str, detail: str) -> str:
    """One line appended to the host's audit log: `<UTC time> <operator> <event> <detail>`.
    The only audit writer (rollout, rollback, rebuild, and the deploy's release change)."""
    return _release("audit", paths.AUDIT_LOG, one_line(operator), one_line(event), one_line(detail))


def gate() -> str:
    """One readiness check of every instance: the health script the deploy installed (/health
    200, the model listed, the optional probe), serialised with its cron runs by the same lock.
    FAIL_RESTART=0: the gate only looks; it never self-heal-restarts an instance it waits for."""
    return "FAIL_RESTART=0 " + shell.join(["timeout", 180, "flock", "-w", 60, paths.HEALTH_LOCK, paths.HEALTH_SCRIPT])


def gpu_returns(returning: dict[str, list[str]], front_door: bool) -> list[str]:
    """Per GPU the health script drained that the plan serves on again (gpuhealth.returning): its
    marker removed and its instances back in the front door (remote/gpu_return.py), under the
    health script's lock."""
    return [shell.join(["flock", "-w", 900, paths.HEALTH_LOCK,
                        *remote.argv("gpu_return", paths.HEALTH_STATE, paths.DRAIN_SCRIPT, int(front_door), uuid,
                                     *names)])
            for uuid, names in returning.items()]


def status(models_root: str, prom_dir: str) -> str:
    """What `nemofleet status` shows of a host (remote/host_status.py): release record, units
    (state and description, which names the GPUs and model), health metrics, drained GPUs, weights
    on disk, downloads in progress and the last canary verdict of the audit log. One line ending
    in a newline, so the status command can append more."""
    argv = remote.argv("host_status", paths.RELEASE, paths.UNIT_DIR, paths.UNIT_PREFIX,
                       f"{prom_dir.rstrip('/')}/nemofleet.prom", paths.HEALTH_STATE, models_root.rstrip("/") or "/",
                       paths.WEIGHTS_MARKER, paths.AUDIT_LOG)
    return shell.join(["timeout", 150, *argv]) + "\n"
