"""pyinfra operations nemofleet adds: each reads its own live fact and yields nothing when
the host already matches, so a converged host reports zero changes."""

from __future__ import annotations

import io
import posixpath
from typing import Iterator

from pyinfra.api import FileUploadCommand, StringCommand

from .. import shell


def cmd(*argv) -> StringCommand:
    """A host command from an argument list, every word quoted once (shell.join): pyinfra's
    StringCommand("rm", "-rf", path) joins its words unquoted."""
    return StringCommand(shell.join(argv))


def reads_with(fn):
    """Declare, next to an operation, the fact it reads: `fn` takes the operation's keyword
    arguments and returns (fact class, fact kwargs) -- the pair the operation itself passes to
    prefetch.fact(). deploy.fact_reads() walks the stages and collects these, so the batched read
    ahead is derived from the operations the stages call, never listed again by hand."""
    def attach(op):
        op.reads = fn
        return op
    return attach


def predicts(unknown):
    """Declare a decision helper of an operation module: a pure function of the operation's own
    fact that says, before the operation is added, what it will change (which files managed()
    writes, whether running() starts a unit). The deploy adds an operation that depends on another
    (a daemon-reload after a unit file, Docker's restart after its proxy drop-in) only when the
    helper says it will run, so `pyinfra --dry` and the confirmation prompt list no "conditional"
    change that never happens (issue 39). The helper and its operation share one comparison.

    `unknown` takes the same keyword arguments and answers what to assume before any fact is
    read: deploy.fact_reads() walks the stages with a recorder to learn what to read ahead, and
    then every dependent operation must be walked (the answer that adds the most operations)."""
    def attach(fn):
        fn.unknown = unknown
        return fn
    return attach


def fail_command(sentence: str) -> StringCommand:
    """A command that fails only this host with `sentence` on stderr: pyinfra marks a host whose
    command exits non-zero as failed and carries on with the others."""
    return StringCommand("sh", "-c", shell.quote(f"printf '%s\\n' {shell.quote(sentence)} >&2; exit 1"))


def temp_path(path: str) -> str:
    """The upload target beside `path`: same directory, so the final `mv` is a rename(2) on one
    filesystem (atomic: readers see the old file or the new one, never half of it)."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.nemofleet-tmp")


def atomic_put(content: str | bytes, path: str, mode: str, validate: str = "", before: str = "",
               after: str = "") -> Iterator[StringCommand | FileUploadCommand]:
    """Commands that make `path` hold `content` with `mode`, atomically.

    The parent is created with `mkdir -p` (never `install -d`, which resets an existing
    directory's mode), the content goes to `temp_path(path)`, then `chmod` + `mv -f`.
    Optional shell snippets, each ending in `; ` when given: `validate` checks the temp file and
    must remove it and exit non-zero to refuse it; `before` runs just before the move (a
    backup); `after` right after it (a reload). With any of them the last step is one
    `sh -c 'set -e; ...'`.
    """
    data = content.encode() if isinstance(content, str) else content
    tmp = temp_path(path)
    q = shell.quote
    if str(mode)[-2:] == "00":  # a mode that gives group and others nothing (0600, 0400, 0700)
        # the upload writes into an existing file and keeps its mode (SFTP opens it O_TRUNC, and
        # the sudo path cp's onto it): create it empty and 0600 first, so a secret is never in a
        # file others can read, not even between the upload and the chmod
        yield StringCommand("sh", "-c", q(f"mkdir -p {q(posixpath.dirname(path))} && umask 077 && "
                                          f"rm -f -- {q(tmp)} && : > {q(tmp)}"))
    else:
        yield cmd("mkdir", "-p", posixpath.dirname(path))
    yield FileUploadCommand(io.BytesIO(data), tmp, remote_temp_filename=tmp)
    if not (validate or before or after):
        yield StringCommand(shell.join(["chmod", mode, tmp]), "&&", shell.join(["mv", "-f", tmp, path]))
        return
    yield StringCommand("sh", "-c", q(
        f"set -e; {validate}{before}chmod {mode} {q(tmp)}; mv -f {q(tmp)} {q(path)}; {after}".rstrip("; ")))
