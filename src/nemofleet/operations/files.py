"""Managed files: many files checked with one remote command, written atomically."""

from __future__ import annotations

import hashlib
import posixpath
from .. import shell  # the one quoting boundary

from pyinfra import host, logger, state
from pyinfra.api import StringCommand, operation
from pyinfra.operations.util.files import generate_color_diff

from ..facts.files import FilesDigest, FileText
from ..facts.prefetch import fact
from . import atomic_put, cmd, fail_command, predicts, reads_with


def reads(files: dict, dirs: dict | None = None) -> tuple:
    """The fact managed() reads (deploy.py reads it ahead with every other, in one command)."""
    return FilesDigest, {"paths": tuple(sorted(files) + sorted(dirs or {}))}


def differences(files: dict[str, tuple[str, str]], dirs: dict[str, str] | None, current: dict) -> tuple[list, list]:
    """What managed() changes, from its FilesDigest fact: ([(dir, mode)] to create or re-mode,
    [(path, content, mode, current)] to write). The one comparison of wanted and present."""
    bad_dirs = [(d, m) for d, m in sorted((dirs or {}).items()) if current.get(d) != (oct(int(m, 8))[2:], "dir")]
    todo = []
    for path, (content, mode) in sorted(files.items()):
        want = (oct(int(mode, 8))[2:], hashlib.sha256(content.encode()).hexdigest())
        if current.get(path) != want:
            todo.append((path, content, mode, current.get(path)))
    return bad_dirs, todo


@predicts(lambda files, dirs=None, **_: set(files))
def will_change(files: dict[str, tuple[str, str]], dirs: dict[str, str] | None = None) -> set[str]:
    """The paths of `files` that managed(files=..., dirs=...) will write, from the same fact (read
    ahead): what the deploy decides a dependent operation from (a reload after a unit file)."""
    return {path for path, *_ in differences(files, dirs, fact(*reads(files, dirs)))[1]}


@reads_with(lambda files, dirs=None, **_: reads(files, dirs))
@operation(is_idempotent=True)
def managed(files: dict[str, tuple[str, str]], secret: bool = False, dirs: dict[str, str] | None = None):
    """Make each path hold exactly `content` with `mode` ({path: (content, "0644")}).

    will_change() says beforehand which paths differ. With `secret`, contents are never shown in
    --diff output. `dirs` ({dir: mode}) are created first.
    """
    dirs = dirs or {}
    bad_dirs, todo = differences(files, dirs, fact(*reads(files, dirs)))
    if not todo and not bad_dirs:
        host.noop(f"{len(files)} file(s) up to date")
        return
    for d, mode in bad_dirs:
        yield cmd("install", "-d", "-m", mode, "--", d)
    for path, content, mode, cur in todo:
        if state.config.DIFF:
            host.log(f"Will {'modify' if cur else 'create'} {path}", logger.info)
            # a 0600 file is kept from other users because it may hold a secret (the dockerd proxy
            # drop-in's credentials): its contents are never shown, whatever the caller said
            if secret or int(mode, 8) & 0o077 == 0:
                logger.info("  (secret contents not shown)")
            else:
                old = host.get_fact(FileText, path=path).splitlines(True) if cur else []
                for line in generate_color_diff(old, content.splitlines(True)):
                    logger.info("  %s", line)
        yield from atomic_put(content, path, mode)


def absent_reads(paths) -> tuple:
    """The fact absent() reads (read ahead by deploy.py)."""
    return FilesDigest, {"paths": tuple(sorted(paths))}


@reads_with(lambda paths, **_: absent_reads(paths) if paths else None)
@operation(is_idempotent=True)
def absent(paths: list[str]):
    """Remove files that should no longer exist."""
    current = fact(*absent_reads(paths)) if paths else {}
    gone = [p for p in sorted(paths) if current.get(p) is not None]
    if not gone:
        host.noop("nothing to remove")
        return
    yield cmd("rm", "-f", "--", *gone)


def key_reads(path: str) -> tuple:
    """The fact authorized_key() reads (read ahead by deploy.py)."""
    return FileText, {"path": path}


@reads_with(lambda path, **_: key_reads(path))
@operation(is_idempotent=True)
def authorized_key(path: str, line: str, key: str):
    """`line` is the only line of `path` (an authorized_keys file) for public key `key`.

    A missing line is appended; a line for the same key with other options (an older
    restriction) is replaced, every other line kept as it is. One fact, read ahead with the rest.
    """
    words = key.split() if isinstance(key, str) else []  # "ssh-ed25519 AAAA... comment" (secret.SshPublicKey.line)
    if len(words) < 2:
        yield fail_command(f"the fleet seed public key is not one key (TYPE BASE64); nothing was written to {path}")
        return
    lines = [ln for ln in fact(*key_reads(path)).splitlines() if ln.strip()]
    blob = words[1]  # the key itself, whatever the options of a line
    mine = [ln for ln in lines if blob in ln.split()]
    if mine == [line]:
        host.noop(f"{path} authorizes the key once, as wanted")
        return
    if not mine:
        yield StringCommand("sh", "-c", shell.quote(
            f"umask 077; mkdir -p {shell.quote(posixpath.dirname(path))}; "
            f"printf '%s\\n' {shell.quote(line)} >> {shell.quote(path)}"))
        return
    yield from atomic_put("".join(ln + "\n" for ln in lines if ln not in mine) + line + "\n", path, "0600")
