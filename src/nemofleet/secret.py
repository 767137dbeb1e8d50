"""Secrets are a type: a value that never shows itself.

`Secret(value)` holds an API key, a token, a private key or a webhook URL read at the edge
(inputs.read_secrets). Its repr, str and format are "<secret>", so a secret that slips into a
refusal sentence, a log line, `plan --json` or pyinfra's `--debug` output shows as that word and
not as its value; `reveal()` is the one way to the value, called only where the value is written
into a 0600 file (desired.secret_files) or compared. It cannot be pickled or copied into JSON.

`SshPublicKey` is the fleet seed key's public half, parsed from its file: exactly one key of a
known type whose blob names that type; nemofleet writes the authorized_keys line itself from it
(never the file's own options or a second line).

Pure: no pyinfra.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import struct
from dataclasses import dataclass


class Secret:
    """A secret value; shown as "<secret>" everywhere but `reveal()`."""

    __slots__ = ("_value",)
    _value: str

    def __init__(self, value: str):
        if not isinstance(value, str):
            raise TypeError("a secret is a string")
        object.__setattr__(self, "_value", value)

    def __setattr__(self, name, value):
        raise AttributeError("a Secret is immutable")

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "<secret>"

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other) -> bool:
        if isinstance(other, Secret):
            return hmac.compare_digest(self._value.encode(), other._value.encode())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("secret", self._value))

    def __reduce__(self):
        raise TypeError("a Secret cannot be pickled")


def reveal(value) -> str | None:
    """The value of a Secret (None stays None)."""
    return value.reveal() if isinstance(value, Secret) else value


# OpenSSH public key types (ssh-keygen -t: ed25519, rsa, ecdsa, and the FIDO "sk" variants)
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
_BLOB = re.compile(r"[A-Za-z0-9+/]{16,16384}={0,2}")


@dataclass(frozen=True)
class SshPublicKey:
    kind: str
    blob: str

    def line(self) -> str:
        """The key as authorized_keys takes it, without options or the file's comment."""
        return f"{self.kind} {self.blob}"


def parse_public_key(text: str) -> SshPublicKey | str:
    """The one public key of a `.pub` file, or one sentence why not. Blank lines and # comments
    are ignored; anything else on a second line (a second key, options) is refused: the line
    nemofleet authorises is built from this key alone, restricted."""
    if not isinstance(text, str):
        return "is not text"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) != 1:
        return (f"holds {len(lines)} keys; it must hold exactly one public key (ssh-keygen -y -f KEY > KEY.pub)"
                if lines else "holds no public key")
    words = lines[0].split()
    if len(words) < 2 or words[0] not in KEY_TYPES:
        return ("is not one OpenSSH public key of a known type (" + ", ".join(KEY_TYPES[:3]) +
                "...): options or another format are not taken; nemofleet writes the restricted line itself")
    kind, blob = words[0], words[1]
    if not _BLOB.fullmatch(blob):
        return f"has a {kind} key whose key text is not base64"
    try:
        raw = base64.b64decode(blob, validate=True)
        (n,) = struct.unpack(">I", raw[:4])
        named = raw[4:4 + n].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError, ValueError):
        return f"has a {kind} key whose key text does not decode"
    if named != kind:
        return f"says {kind} but its key is {named[:40]!r}"
    return SshPublicKey(kind, blob)
