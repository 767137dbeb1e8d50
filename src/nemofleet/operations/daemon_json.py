"""/etc/docker/daemon.json with one owner: merge, validate, then reload or restart Docker.

nemofleet owns only the keys it is given; every other key (data-root, bip, ...) is kept.
The file is written only when the parsed JSON differs (reference §3.1, §4, §10).
"""

from __future__ import annotations

import copy
import io
import json
import re

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.operations.util.files import generate_color_diff

from ..facts.docker import DaemonJson, DockerInfo
from . import fail_command

# reference §4: keys dockerd applies on SIGHUP; everything else needs a restart.
RELOADABLE = frozenset({
    "debug", "labels", "live-restore", "max-concurrent-downloads", "max-concurrent-uploads",
    "max-download-attempts", "default-runtime", "runtimes", "authorization-plugin",
    "insecure-registries", "registry-mirrors", "shutdown-timeout", "features",
})
NEVER = frozenset({"hosts"})  # the unit passes -H fd://; setting it in the file breaks dockerd
MERGED_MAPS = frozenset({"runtimes", "features"})  # nemofleet owns entries, not the whole map


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
        raise DaemonJsonError("docker exec-opts must be a list of strings")


def merge(current: dict, desired: dict) -> dict:
    out = copy.deepcopy(current)
    for key, value in desired.items():
        if value is None:
            out.pop(key, None)
        elif key in MERGED_MAPS and isinstance(value, dict):
            section = dict(out.get(key) or {})
            for k, v in value.items():
                if v is None:
                    section.pop(k, None)
                else:
                    section[k] = v
            if section:
                out[key] = section
            else:
                out.pop(key, None)
        else:
            out[key] = value
    return out


def needs_restart(before: dict, after: dict) -> list[str]:
    keys = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    restart = sorted(k for k in keys if k not in RELOADABLE)
    b, a = (before.get("features") or {}), (after.get("features") or {})
    if a.get("cdi") and not b.get("cdi"):
        restart.append("features.cdi (enabling CDI)")
    return restart


def render(data: dict) -> str:
    return json.dumps(data, indent=4, sort_keys=True) + "\n"


@operation(is_idempotent=True)
def configured(desired: dict, path: str = "/etc/docker/daemon.json", changed: set | None = None):
    """Merge `desired` into daemon.json; reload Docker for reloadable keys, restart otherwise.
    The keys that changed are added to `changed` (read later by the GPU access probe)."""
    try:
        validate_settings(desired)
    except DaemonJsonError as exc:
        yield fail_command(str(exc))
        return
    current = host.get_fact(DaemonJson, path=path)
    if current["data"] is None:
        yield fail_command(
            f"{path} on {host.name} is {current['error']}; nemofleet leaves it untouched: fix or remove it, then re-run")
        return
    merged = merge(current["data"], desired)
    if merged == current["data"]:
        host.noop(f"{path} already holds nemofleet's keys")
        return
    restart = needs_restart(current["data"], merged)
    if changed is not None:
        changed.update(k for k in set(merged) | set(current["data"]) if merged.get(k) != current["data"].get(k))
    action = "restart" if restart else "reload"
    text = render(merged)
    if state.config.DIFF:
        host.log(f"Will {'modify' if current['exists'] else 'create'} {path} (then {action} docker"
                 f"{': ' + ', '.join(restart) if restart else ''})", logger.info)
        old = render(current["data"]).splitlines(True) if current["exists"] else []
        for line in generate_color_diff(old, text.splitlines(True)):
            logger.info("  %s", line)
    tmp = f"{path}.nemofleet-tmp"
    yield StringCommand("install", "-d", "-m", "0755", path.rsplit("/", 1)[0])
    yield FileUploadCommand(io.StringIO(text), tmp, remote_temp_filename=tmp)
    docker = host.get_fact(DockerInfo)
    # dockerd --validate exists from Docker 23 (reference §4); older engines had the schema check above
    major = int((docker.get("server") or "0").split(".")[0] or 0)
    validate = (f"dockerd --validate --config-file={tmp} >/dev/null 2>&1 || "
                f"{{ rm -f {tmp}; echo 'dockerd --validate rejected the merged {path}; nothing was changed' >&2; exit 1; }}; "
                if major >= 23 else "")
    apply = ""
    if docker.get("running"):
        apply = (f"if ! systemctl {action} docker; then cp -f {path}.nemofleet-prev {path} 2>/dev/null || rm -f {path}; "
                 f"systemctl restart docker; echo 'docker failed to {action} with the new {path}; the previous file was restored' >&2; exit 1; fi")
    yield StringCommand("sh", "-c", _q(
        f"set -e; {validate}if [ -f {path} ]; then cp -f {path} {path}.nemofleet-prev; fi; "
        f"chmod 0644 {tmp}; mv -f {tmp} {path}; {apply}"))


def _q(s: str) -> str:
    import shlex
    return shlex.quote(s)
