"""daemon.json keys nemofleet wants, checked before any host is touched (pure: no pyinfra).

The decision (desired.py) validates the keys it will merge here; the applier
(operations/daemon_json.py) merges them into the host's file and reloads or restarts dockerd.
"""

from __future__ import annotations

import re

from .valuetypes import shown

NEVER = frozenset({"hosts"})  # the unit passes -H fd://; setting it in the file breaks dockerd


class DaemonJsonError(ValueError):
    pass


# the keys of a host's daemon.json that nemofleet reads or merges into, and the JSON type each
# must have there: dockerd refuses a file where they have another (dockerd(8) daemon.json)
READ_KEYS = {"runtimes": dict, "features": dict, "log-opts": dict, "exec-opts": list, "registry-mirrors": list,
             "insecure-registries": list, "default-runtime": str, "log-driver": str}
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string"}


def host_file_problem(data) -> str | None:
    """The tail of a sentence when a host's daemon.json (its JSON object; None: not one, said
    elsewhere) has a key nemofleet reads or merges of another type: the decision and the merge
    then read only what they expect (factmodel.DaemonJson types `data` with it)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        return "is not a JSON object"
    for key, kind in READ_KEYS.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            why = f"{key!r} {shown(value)}, not {_JSON_NAMES[kind]}"
        elif key == "runtimes" and not all(isinstance(v, dict) for v in value.values()):
            why = f"a runtimes entry that is not an object ({shown(value)})"
        elif kind is list and not all(isinstance(v, str) for v in value):
            why = f"{key!r} {shown(value)}, with an entry that is not a string"
        else:
            continue
        return f"has {why} (dockerd refuses the file too): fix /etc/docker/daemon.json"
    return None


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
