"""nemofleet-release: a host's release for the fleet layer (nemofleet.hostcmd builds its commands).

    python3 -I -S release.py read RELEASE UNIT_DIR UNIT_PREFIX
    python3 -I -S release.py keep RELEASE UNIT_DIR UNIT_PREFIX PREVIOUS
    python3 -I -S release.py rollback RELEASE UNIT_DIR UNIT_PREFIX PREVIOUS DRAIN HEALTH_LOCK EXPECT READY_TIMEOUT
    python3 -I -S release.py audit AUDIT_LOG OPERATOR EVENT DETAIL

read: the release record's lines (`id=`, `image=`, ...) and `units_sha256=`, a digest of the unit
files (UNIT_DIR/UNIT_PREFIX*.service): a rollout reads both before and after the deploy to know
whether it touched the host at all.

keep: the release being replaced (its units and record) copied to PREVIOUS, so a rollback can
return to it (a new copy replaces the old one whole).

rollback: the kept release put back: its units replace the current ones (units it does not have are
stopped and removed), its record becomes the release. With EXPECT (empty: any), refuse unless the
kept release is that id. With a front door (DRAIN executable, haproxy active, the instance known to
it) each instance restarts through it, one at a time (drained, restarted, ready within
READY_TIMEOUT seconds, back in) under HEALTH_LOCK; one not ready in time is named and left to the
front door's health checks. Without one they restart at once. Every systemctl and drain call has
its own time limit (TIMEOUTS). Prints `rolled back to ID` last; a refusal or a failed step is one
sentence on stderr and exit 1.

audit: one line appended to AUDIT_LOG, `<UTC time> <operator> <event> <detail>`, the text made one
printable line (a newline in it would forge a line of the log).

The host's files are read and written by the prelude's rules: only regular files are read (a link or
a FIFO where a record, a unit or the audit log should be is refused, never followed or waited on),
and each file is replaced through a new temporary file and a rename, never written through a link.

Every value is an argument (names read from the unit directory are arguments of the commands run,
never shell words). Standard library only; never a traceback.
"""

import hashlib
import os
import re
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

# seconds each call may take (the shell script before this program used the same figures)
TIMEOUTS = {"disable": 300, "daemon-reload": 120, "enable": 60, "restart": 60, "is-active": 10, "drain-state": 30}
FLOCK_WAIT = 60  # the health program's lock, shared with its cron runs
READ_LIMIT = 1 << 20
LINE_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class Refused(Exception):
    """A sentence for stderr, exit 1."""


def one_line(text, limit=4000):
    return LINE_BREAKS.sub(" ", text).strip()[:limit]


def units(unit_dir, prefix):
    """The unit files UNIT_DIR/PREFIX*.service, sorted by name."""
    try:
        names = os.listdir(unit_dir)
    except OSError:
        return []
    return sorted(os.path.join(unit_dir, n) for n in names if n.startswith(prefix) and n.endswith(".service"))


def read_text(path, limit=READ_LIMIT):
    data = read_file(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def kept_id(record):
    """The id= of a release record's text ('' when it has none)."""
    for line in (record or "").splitlines():
        if line.startswith("id="):
            return one_line(line[3:], 200)
    return ""


def do_read(release, unit_dir, prefix):
    record = read_text(release)
    for line in (record or "").splitlines():
        print(one_line(line))
    h = hashlib.sha256()
    for u in units(unit_dir, prefix):
        h.update(read_file(u, READ_LIMIT) or b"")
    print(f"units_sha256={h.hexdigest()[:16]}")


def copy(src, dst):
    """dst replaced whole by the bytes of the regular file src (write_file: never half-written,
    never written through a link)."""
    data = read_file(src, READ_LIMIT + 1)
    if data is None or len(data) > READ_LIMIT:
        raise Refused(f"{src} is not a regular file of at most {READ_LIMIT} bytes: not copied")
    write_file(dst, data)


def do_keep(release, unit_dir, prefix, previous):
    if file_size(release) is None:
        raise Refused(f"no release record at {release} to keep")
    new = previous.rstrip("/") + ".new"
    remove_tree(new)
    os.makedirs(new)
    for u in units(unit_dir, prefix):
        try:
            copy(u, os.path.join(new, os.path.basename(u)))
        except (OSError, Refused):
            pass  # a unit that vanished meanwhile is not kept, as `cp` of a glob would skip it
    copy(release, os.path.join(new, "release"))
    remove_tree(previous)
    os.rename(new, previous)


def call(argv, seconds, env=None, quiet=False):
    """Run argv under `timeout` (which ends the command's whole process group) and a limit of our
    own; its exit status (124 when it ran out of time)."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = subprocess.DEVNULL if quiet else None
    try:
        return subprocess.run(["timeout", str(seconds), *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                              env=env, timeout=seconds + 15).returncode
    except subprocess.TimeoutExpired:
        return 124
    except OSError:
        return 127


def must(argv, seconds):
    rc = call(argv, seconds)
    if rc != 0:
        raise Refused(f"rollback stopped: `{' '.join(argv)}` failed (exit {rc}"
                      + (f", no answer in {seconds} s)" if rc == 124 else ")"))


def do_rollback(release, unit_dir, prefix, previous, drain, health_lock, expect, ready):
    kept = read_text(os.path.join(previous, "release"))
    if kept is None:
        raise Refused("no previous release kept on this host")
    if expect and kept_id(kept) != expect:
        raise Refused(f"the kept release is {kept_id(kept)}, not {one_line(expect)}: not rolling back")
    kept_units = units(previous, prefix)
    if not kept_units:
        raise Refused(f"the kept release in {previous} has no unit files: not rolling back")
    keep_names = {os.path.basename(u) for u in kept_units}
    for u in units(unit_dir, prefix):
        n = os.path.basename(u)
        if n not in keep_names:
            must(["systemctl", "disable", "--now", "--", n], TIMEOUTS["disable"])
            try:
                os.unlink(u)
            except FileNotFoundError:
                pass
    for u in kept_units:
        copy(u, os.path.join(unit_dir, os.path.basename(u)))
    try:
        copy(release, release + ".rolled-back")
    except (OSError, Refused):
        pass
    copy(os.path.join(previous, "release"), release)
    must(["systemctl", "daemon-reload"], TIMEOUTS["daemon-reload"])
    front_door = os.path.isfile(drain) and os.access(drain, os.X_OK)
    for u in kept_units:
        n = os.path.basename(u)
        instance = n[len(prefix):-len(".service")]
        must(["systemctl", "enable", "-q", "--", n], TIMEOUTS["enable"])
        if (front_door and call(["systemctl", "is-active", "-q", "haproxy"], TIMEOUTS["is-active"]) == 0
                and call([drain, "state", instance], TIMEOUTS["drain-state"], quiet=True) == 0):
            env = dict(os.environ, READY_TIMEOUT=str(ready))
            if call(["flock", "-w", str(FLOCK_WAIT), health_lock, drain, "restart", instance], ready + 120, env=env):
                print(f"instance {instance}: not ready through the front door yet")
        else:
            must(["systemctl", "restart", "--no-block", "--", n], TIMEOUTS["restart"])
    print(f"rolled back to {kept_id(read_text(release))}")


def do_audit(log, operator, event, detail):
    line = one_line(f"{operator} {event} {detail}")
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    append_file(log, f"{stamp} {line}\n".encode("utf-8", "replace"))


def main(argv):
    action, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if action == "read" and len(args) == 3:
        do_read(*args)
    elif action == "keep" and len(args) == 4:
        do_keep(*args)
    elif action == "rollback" and len(args) == 8 and re.fullmatch(r"[0-9]{1,5}", args[7]):
        do_rollback(*args[:7], int(args[7]))  # type: ignore[call-arg]  # seven strings, counted above
    elif action == "audit" and len(args) == 4:
        do_audit(*args)
    else:
        print(f"release.py: unknown action or wrong arguments: {action[:40]!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # a TextIOWrapper
        sys.stderr.reconfigure(errors="replace")  # type: ignore[union-attr]  # a TextIOWrapper
        rc = main([a.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for a in sys.argv])
    except Refused as exc:
        print(exc, file=sys.stderr)
        rc = 1
    except OSError as exc:
        print(f"{sys.argv[1] if len(sys.argv) > 1 else 'release.py'} failed: {exc.strerror or exc}"
              f"{' (' + str(exc.filename) + ')' if exc.filename else ''}", file=sys.stderr)
        rc = 1
    except Exception as exc:  # noqa: BLE001 - never a traceback on a host
        print(f"release.py failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        rc = 1
    sys.exit(rc)
