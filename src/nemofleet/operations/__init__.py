"""pyinfra operations nemofleet adds: each reads its own live fact and yields nothing when
the host already matches, so a converged host reports zero changes."""

import shlex

from pyinfra.api import StringCommand


def fail_command(sentence: str) -> StringCommand:
    """A command that fails only this host with `sentence` on stderr (reference §1.2)."""
    return StringCommand("sh", "-c", shlex.quote(f"printf '%s\\n' {shlex.quote(sentence)} >&2; exit 1"))
