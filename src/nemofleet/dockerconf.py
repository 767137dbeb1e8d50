"""daemon.json keys nemofleet wants, checked before any host is touched (pure: no pyinfra).

The decision (desired.py) validates the keys it will merge here; the applier
(operations/daemon_json.py) merges them into the host's file and reloads or restarts dockerd.
"""

from __future__ import annotations

import re

NEVER = frozenset({"hosts"})  # the unit passes -H fd://; setting it in the file breaks dockerd


class DaemonJsonError(ValueError):
    pass


def validate_settings(desired: dict) -> None:
    """Schema checks nemofleet can make before touching a host; raise with one sentence."""
    for key in desired:
        if key in NEVER:
            raise DaemonJsonError(f"daemon.json key {key!r} must not be set: the docker unit passes -H fd:// and dockerd would refuse to start")
    for url in desired.get("registry-mirrors") or []:
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise DaemonJsonError(f"registry mirror {url!r} needs a scheme, e.g. https://{url}")
    for reg in desired.get("insecure-registries") or []:
        if not isinstance(reg, str) or "://" in reg:
            raise DaemonJsonError(f"insecure registry {reg!r} must be host:port or a CIDR, without a scheme")
    opts = desired.get("log-opts")
    if opts is not None:
        if not isinstance(opts, dict):
            raise DaemonJsonError("docker log-opts must be a mapping of strings")
        bad = [k for k, v in opts.items() if not isinstance(v, str)]
        if bad:
            raise DaemonJsonError(
                f"docker log-opts values must be strings (dockerd refuses {', '.join(f'{k}={opts[k]!r}' for k in bad)}); "
                f"quote them, e.g. \"{bad[0]}\": \"{opts[bad[0]]}\"")
    exec_opts = desired.get("exec-opts")
    if exec_opts is not None and not (isinstance(exec_opts, list) and all(isinstance(o, str) for o in exec_opts)):
        raise DaemonJsonError("docker exec-opts must be a list of strings such as native.cgroupdriver=cgroupfs")
    for opt in exec_opts or []:
        if "=" not in opt:
            raise DaemonJsonError(f"docker exec-opts entry {opt!r} must be name=value, e.g. native.cgroupdriver=cgroupfs")
