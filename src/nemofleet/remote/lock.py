"""nemofleet-lock: the deploy lock of one host (nemofleet.hostcmd builds its commands).

    python3 -I -S lock.py LOCK acquire HOLDER DIGEST TTL MESSAGE
    python3 -I -S lock.py LOCK release DIGEST|- [force]
    python3 -I -S lock.py LOCK refresh DIGEST TTL
    python3 -I -S lock.py LOCK status

LOCK is the lock's path (a directory; its temporary siblings are LOCK.new.PID, LOCK.expired.PID
and LOCK.released.PID). LOCK/info holds `holder=`, `token_sha256=`, `since=`, `expires=` (Unix
time) and `message=` lines. DIGEST is the SHA-256 (64 hex digits) of the holder's token: the token
itself never leaves the controller, and `-` (release without a token) matches no lock.

Prints `key=value` lines the controller parses (nemofleet.lock.info.parse): `state=` (ACQUIRED,
OWNED, HELD, RELEASED, FREE, NOT_HOLDER, REFRESHED, LOST), the holder's info (prefixed with
`expired_` for a lock taken over, `released_` for one broken with force) and `now=`, the host's
clock (an expiry is judged against the host that wrote it).

The info file is read as input that may be wrong (an older nemofleet, a hand edit, a disk error):
only the five keys are printed, each value as one printable line of at most VALUE_LIMIT
characters; a file that is missing, a symlink, a directory, a FIFO, not UTF-8 or larger than
INFO_LIMIT reads as `holder=unknown`; an `expires=` that is not a number of at most 12 digits reads
as no expiry. A lock without a readable expiry expires NO_INFO_TTL after it was made (its mtime).

Standard library only, and only modules a bare python start loads anyway (os, stat, sys, time: the
deploy's facts run `status` on every host of every run; `re` alone would add a third to its start);
a bad argument is one sentence on stderr (exit 2), never a traceback.
"""

import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

NO_INFO_TTL = 2 * 3600  # the default TTL of nemofleet.lock.fleet (hostcmd.NO_INFO_TTL: a test keeps them equal)
STALE = 3600  # a temporary directory this old is a leftover of a controller killed mid-step
INFO_LIMIT = 64 * 1024
VALUE_LIMIT = 1000
KEYS = ("holder", "token_sha256", "since", "expires", "message")
HEX = frozenset("0123456789abcdef")
# what would end a line for the controller (str.splitlines splits on more than \n): each a space
LINE_BREAKS = dict.fromkeys([*range(0x20), *range(0x7f, 0xa0), 0x2028, 0x2029], " ")


class Usage(Exception):
    pass


def one_line(text):
    """Free text as one printable line of at most VALUE_LIMIT characters."""
    return text.translate(LINE_BREAKS).strip()[:VALUE_LIMIT]


def is_digest(text):
    return len(text) == 64 and set(text) <= HEX


def read_info(lock):
    """{key: value} of LOCK/info's known keys, or None when it cannot be read. A key given twice
    is dropped (nemofleet writes each once)."""
    try:
        if not stat.S_ISDIR(os.lstat(lock).st_mode):
            return None
    except (OSError, ValueError):
        return None
    data = read_file(os.path.join(lock, "info"), INFO_LIMIT + 1)
    if data is None or len(data) > INFO_LIMIT:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    info, seen = {}, set()  # type: dict[str, str], set[str]
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if not sep or key not in KEYS:
            continue
        if key in seen:
            info.pop(key, None)
        # an expires= that is not a Unix time as lockinfo.parse reads one (1 to 12 ASCII digits): no expiry
        elif key != "expires" or (0 < len(value) <= 12 and value.isascii() and value.isdigit()):
            info[key] = one_line(value)
        seen.add(key)
    return info


def show(info, prefix=""):
    """Print the holder's info, or `holder=unknown` when there is none to show."""
    shown = [k for k in KEYS if info and k in info]
    for key in shown:
        print(f"{prefix}{key}={info[key]}")
    if not shown:
        print(f"{prefix}holder=unknown")


def mtime(path):
    try:
        return int(os.lstat(path).st_mtime)
    except OSError:
        return 0


def expiry(path):
    """The lock's expiry: its info's expires=, else its mtime + NO_INFO_TTL."""
    info = read_info(path)
    if info and "expires" in info:
        return int(info["expires"])
    return mtime(path) + NO_INFO_TTL


def owned(lock, digest):
    info = read_info(lock)
    return bool(info) and is_digest(digest) and info.get("token_sha256") == digest


def write_info(lock, fields):
    """LOCK/info replaced whole (write_file: a temporary file and a rename)."""
    write_file(os.path.join(lock, "info"), "".join(f"{k}={fields[k]}\n" for k in KEYS if k in fields).encode())


def sweep(lock):
    """Remove leftover temporary directories (LOCK.*.*) older than STALE."""
    state, base = os.path.dirname(lock) or ".", os.path.basename(lock) + "."
    try:
        names = os.listdir(state)
    except OSError:
        return
    for name in names:
        if name.startswith(base) and "." in name[len(base):] and NOW - mtime(os.path.join(state, name)) > STALE:
            remove_tree(os.path.join(state, name))


def acquire(lock, holder, digest, ttl, message):
    state = os.path.dirname(lock) or "."
    os.makedirs(state, exist_ok=True)
    if owned(lock, digest):
        print("state=OWNED")
        return
    sweep(lock)
    if os.path.lexists(lock):
        exp = expiry(lock)
        if exp <= NOW:
            # take the expired lock over: move it away, then make sure what moved is the expired
            # lock (not one another controller took meanwhile), else put it back
            moved = f"{lock}.expired.{os.getpid()}"
            remove_tree(moved)
            try:
                os.rename(lock, moved)
                took = True
            except OSError:
                took = False
            if took:
                if expiry(moved) == exp:
                    show(read_info(moved), "expired_")
                    remove_tree(moved)
                else:
                    try:
                        os.rename(moved, lock)
                    except OSError:
                        pass
    # the lock appears with its info in one rename: a controller killed at any point leaves no lock
    # or a complete one (a leftover temporary directory is not the lock; sweep removes it later)
    new = f"{lock}.new.{os.getpid()}"
    remove_tree(new)
    fields = {"holder": one_line(holder), "token_sha256": digest,
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW)), "expires": NOW + ttl,
              "message": one_line(message)}
    try:
        os.mkdir(new, 0o755)
        write_info(new, fields)
        # rename(2) replaces an empty directory: the check keeps one an older nemofleet just made
        if os.path.lexists(lock):
            raise FileExistsError(lock)
        os.rename(new, lock)
    except OSError:
        remove_tree(new)
        print("state=HELD")
        show(read_info(lock))
        return
    print("state=ACQUIRED")


def release(lock, digest, force):
    if not os.path.lexists(lock):
        print("state=FREE")
        return
    info = read_info(lock)
    if not (force or owned(lock, digest)):
        print("state=NOT_HOLDER")
        show(info)
        return
    gone = f"{lock}.released.{os.getpid()}"
    remove_tree(gone)
    try:
        os.rename(lock, gone)
    except FileNotFoundError:
        print("state=FREE")  # released by another meanwhile
        return
    if force:
        show(info, "released_")
    remove_tree(gone)
    print("state=RELEASED")


def refresh(lock, digest, ttl):
    info = read_info(lock)
    if owned(lock, digest):
        info["expires"] = NOW + ttl
        write_info(lock, info)
        print("state=REFRESHED")
        return
    print("state=LOST")
    if os.path.lexists(lock):
        show(info)


def status(lock):
    if os.path.lexists(lock):
        print("state=HELD")
        show(read_info(lock))
    else:
        print("state=FREE")


def number(text, what):
    digits = text[1:] if text.startswith("-") else text
    if not (0 < len(digits) <= 10 and digits.isascii() and digits.isdigit()):
        raise Usage(f"the {what} {text[:40]!r} is not a whole number of seconds")
    return int(text)


def digest_arg(text, allow_none=False):
    if is_digest(text) or (allow_none and text == "-"):
        return text
    raise Usage("the token digest is not 64 lowercase hex digits (the SHA-256 of the token)")


def main(argv):
    if len(argv) < 3 or not argv[1].startswith("/"):
        raise Usage("usage: lock.py /ABSOLUTE/LOCK acquire|release|refresh|status ...")
    lock, action, args = argv[1].rstrip("/"), argv[2], argv[3:]
    if action == "acquire" and len(args) == 4:
        acquire(lock, args[0], digest_arg(args[1]), number(args[2], "ttl"), args[3])
    elif action == "release" and len(args) in (1, 2) and args[1:] in ([], ["force"]):
        release(lock, digest_arg(args[0], allow_none=True), args[1:] == ["force"])
    elif action == "refresh" and len(args) == 2:
        refresh(lock, digest_arg(args[0]), number(args[1], "ttl"))
        return  # refresh prints no now= (its answer is REFRESHED or LOST)
    elif action == "status" and not args:
        status(lock)
    else:
        raise Usage(f"lock.py: unknown action or wrong arguments: {action[:40]!r}")
    if action != "release":
        print(f"now={NOW}")


NOW = int(time.time())

if __name__ == "__main__":
    try:
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # a TextIOWrapper
        main([a.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for a in sys.argv])
    except Usage as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # a state directory that cannot be written: one sentence, never a traceback
        print(f"the deploy lock could not be changed: {exc.strerror or exc} ({exc.filename or ''})", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - never a traceback on a host
        print(f"the deploy lock program failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        sys.exit(1)
