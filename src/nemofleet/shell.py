"""The one boundary where a value becomes part of a host's shell line.

Host commands are built as argument lists and quoted here, once: `join(argv)` for a command,
`say(message)` for a sentence on stderr (never `echo '...{value}...'`, which a quote in the value
ends), `fail(message)` for a `{ ...; exit 1; }` block. Names read from disk are checked against
the shape nemofleet gives them before any command names them (`own_names`).

Pure functions (no pyinfra): desired.py builds its command strings here, and operations wrap
them in pyinfra's StringCommand (operations.cmd).
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable


def quote(word) -> str:
    return shlex.quote(str(word))


def join(argv: Iterable) -> str:
    """argv -> one shell command line, every word quoted (ints and paths alike)."""
    return " ".join(quote(w) for w in argv)


def say(message: str, err: bool = True) -> str:
    """A command that prints `message` as it is (printf '%s\\n', so `%`, `\\` and quotes are text)."""
    return f"printf '%s\\n' {quote(message)}" + (" >&2" if err else "")


def fail(message: str) -> str:
    """A brace group that prints `message` on stderr and exits 1 (for `cmd || <this>`)."""
    return f"{{ {say(message)}; exit 1; }}"


def own_names(names: Iterable, pattern: str) -> list[str]:
    """The names (read from a directory listing) that have the shape nemofleet gives its own
    files or directories (`pattern`, a full match): anything else -- an operator's directory, or a
    hostile name such as `$(touch x)` or `*` -- is never named in a command."""
    rx = re.compile(pattern)
    return [n for n in names if isinstance(n, str) and rx.fullmatch(n)]


def sha256_ok(path: str, sha256: str) -> str:
    """A shell condition: `path` (on the host) has this SHA-256."""
    return f"echo {quote(sha256 + '  ' + path)} | timeout 3600 sha256sum -c --quiet >/dev/null 2>&1"


def sha256_check(path: str, sha256: str, what: str) -> str:
    """`path` (on the host) has this SHA-256, else it is removed and the command fails saying so
    (a part of a signed bundle, checked on arrival)."""
    return (f"{sha256_ok(path, sha256)} || "
            f"{{ rm -f {quote(path)}; {say(f'{what} arrived changed: its SHA-256 does not match the signed manifest')}; exit 1; }}")
