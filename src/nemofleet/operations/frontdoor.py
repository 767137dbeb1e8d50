"""The front door's HAProxy config: checked with `haproxy -c` on the host before it goes live."""

from __future__ import annotations

import hashlib
from .. import shell  # the one quoting boundary

from pyinfra import host
from pyinfra.api import operation

from ..facts.files import FilesDigest
from ..facts.prefetch import fact
from . import atomic_put, predicts, reads_with, temp_path


def refusal(host_name: str, path: str, role: str = "front door") -> tuple[str, str]:
    """The sentence for a config haproxy -c refuses, as the text before and after haproxy's own
    line (printed as text: never a printf format, so a % in the host name is a %)."""
    return (f"the {role} config of {host_name} fails haproxy -c (",
            f"); {path} and the running proxy are left as they were")


def reads(path: str) -> tuple:
    """The fact configured() reads (deploy.py reads it ahead with every other, in one command)."""
    return FilesDigest, {"paths": (path,)}


@predicts(lambda path, content, **_: True)
def will_change(path: str, content: str) -> bool:
    """Whether configured(path=..., content=...) will write the config (from its fact, read ahead):
    the deploy adds HAProxy's reload only then."""
    return fact(*reads(path)).get(path) != ("644", hashlib.sha256(content.encode()).hexdigest())


@reads_with(lambda path, **_: reads(path))
@operation(is_idempotent=True)
def configured(path: str, content: str, role: str = "front door"):
    """`path` holds `content` (0644), but only a config that `haproxy -c` accepts replaces the
    live one: a refused config is removed and the host fails with one sentence (HAProxy's first
    ALERT line in it); the live file and the running proxy are untouched. `role`: what the
    sentence calls it (the host's "front door", or the fleet "gateway")."""
    if not will_change(path, content):
        host.noop("front door config up to date")
        return
    q, tmp = shell.quote, temp_path(path)
    before, after = refusal(host.name, path, role)
    validate = (f"if ! out=$(timeout 30 haproxy -c -q -f {q(tmp)} 2>&1); then rm -f {q(tmp)}; "
                f"why=$(printf '%s\\n' \"$out\" | grep -m1 -E 'ALERT|rror' | tr -d '\\r' | cut -c1-300); "
                f"printf '%s%s%s\\n' {q(before)} \"${{why:-exit status non-zero}}\" {q(after)} >&2; exit 1; fi; ")
    yield from atomic_put(content, path, "0644", validate=validate)
