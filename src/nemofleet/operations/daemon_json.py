"""/etc/docker/daemon.json with one owner: merge, validate, then reload or restart Docker.

nemofleet owns only the keys it is given; every other key (data-root, bip, ...) is kept.
The file is written only when the parsed JSON differs; which keys dockerd reloads on SIGHUP is
listed in https://docs.docker.com/reference/cli/dockerd/#configuration-reload-behavior.
"""

from __future__ import annotations

import copy
import json

from pyinfra import host, logger, state
from pyinfra.api import operation
from pyinfra.operations.util.files import generate_color_diff

from .. import shell, versions
from ..facts.docker import DaemonJson, DockerInfo
from ..facts.prefetch import fact
from ..dockerconf import NEVER, DaemonJsonError, validate_settings  # noqa: F401  (checked before any host)
from ..paths import DAEMON_JSON
from . import atomic_put, fail_command, predicts, reads_with, temp_path

# keys dockerd applies on SIGHUP (dockerd docs, configuration reload behavior); the rest need a restart
RELOADABLE = frozenset({
    "debug", "labels", "live-restore", "max-concurrent-downloads", "max-concurrent-uploads",
    "max-download-attempts", "default-runtime", "runtimes", "authorization-plugin",
    "insecure-registries", "registry-mirrors", "shutdown-timeout", "features",
})
MAPS = frozenset({"runtimes", "features"})  # merged entry by entry, never replaced whole
# runtimes entries are only added when missing: an operator's own `nvidia` entry (another path,
# runtimeArgs) is kept, so a converged host is not rewritten and Docker is not reloaded
KEEP_ENTRIES = frozenset({"runtimes"})
# the only exec-opts option nemofleet sets or removes; every other option is the operator's
OWNED_EXEC_OPTS = frozenset({"native.cgroupdriver"})


VALIDATE_TIMEOUT = 30  # dockerd --validate parses the file and exits; 30 s means it hung
# docker.service sets TimeoutStartSec=0 (no limit): bound a reload/restart ourselves. A restart
# stops every container (live-restore off), which can take the containers' stop timeouts.
APPLY_TIMEOUT = 300


def _set_entries(out: dict, key: str, entries: dict, keep_existing: bool) -> None:
    """Merge a map key (runtimes, features) entry by entry; None removes an entry."""
    section = dict(out.get(key) or {})
    for name, value in entries.items():
        if value is None:
            section.pop(name, None)
        elif not (keep_existing and name in section):
            section[name] = copy.deepcopy(value)
    if section:
        out[key] = section
    else:
        out.pop(key, None)


def _opt_name(opt) -> str:
    return str(opt).partition("=")[0].strip()


def merge_exec_opts(current: list | None, wanted: list[str] | None) -> list:
    """exec-opts merged by option name: each wanted option replaces the host's option of that
    name in place (or is appended); an option nemofleet owns (OWNED_EXEC_OPTS) that is not
    wanted is removed; every other option (native.umask=..., ...) stays, in its order."""
    wanted_by_name = {_opt_name(o): o for o in wanted or []}
    out, placed = [], set()
    for opt in current if isinstance(current, list) else []:
        name = _opt_name(opt)
        if name in wanted_by_name:
            if name not in placed:  # a second entry of the same name is dropped
                out.append(wanted_by_name[name])
                placed.add(name)
        elif name not in OWNED_EXEC_OPTS:
            out.append(opt)
    out += [o for n, o in wanted_by_name.items() if n not in placed]
    return out


def merge(current: dict, desired: dict, defaults: dict | None = None) -> dict:
    """The daemon.json that results from `current` with nemofleet's keys (see `configured`)."""
    out = copy.deepcopy(current)
    for key, value in (defaults or {}).items():
        if key in MAPS and isinstance(value, dict):
            _set_entries(out, key, value, keep_existing=True)
        elif key not in out and value is not None:
            out[key] = copy.deepcopy(value)
    for key, value in desired.items():
        if key == "exec-opts":
            opts = merge_exec_opts(out.get(key), value)
            if opts:
                out[key] = opts
            else:
                out.pop(key, None)
        elif value is None:
            out.pop(key, None)
        elif key in MAPS and isinstance(value, dict):
            _set_entries(out, key, value, keep_existing=key in KEEP_ENTRIES)
        else:
            out[key] = copy.deepcopy(value)
    return out


def needs_restart(before: dict, after: dict) -> list[str]:
    restart = sorted(k for k in differing_keys(before, after) if k not in RELOADABLE)
    b, a = (before.get("features") or {}), (after.get("features") or {})
    if a.get("cdi") and not b.get("cdi"):
        restart.append("features.cdi (enabling CDI)")
    return restart


def render(data: dict) -> str:
    return json.dumps(data, indent=4, sort_keys=True) + "\n"


def _validate_snippet(tmp: str, path: str, server: str | None) -> str:
    """`dockerd --validate` on the temp file (Docker >= 23; older engines had only the schema
    check in validate_settings); a refusal removes the temp file and changes nothing."""
    if versions.major(server) < 23:
        return ""
    q = shell.quote
    return (f"timeout {VALIDATE_TIMEOUT} dockerd --validate --config-file={q(tmp)} >/dev/null 2>&1 || "
            f"{{ rm -f {q(tmp)}; {shell.say(f'dockerd --validate rejected the merged {path}; nothing was changed')}; "
            "exit 1; }; ")


def _apply_snippet(path: str, action: str) -> str:
    """Reload or restart a running Docker; on failure put the previous file back and restart."""
    q = shell.quote
    return (f"if ! timeout {APPLY_TIMEOUT} systemctl {action} docker; then "
            f"cp -f {q(path + '.nemofleet-prev')} {q(path)} 2>/dev/null || rm -f {q(path)}; "
            f"timeout {APPLY_TIMEOUT} systemctl restart docker; "
            + shell.say(f"docker failed to {action} within {APPLY_TIMEOUT} s with the new {path}; "
                        "the previous file was restored") + "; exit 1; fi")


def differing_keys(before: dict, after: dict) -> set[str]:
    return {k for k in set(after) | set(before) if after.get(k) != before.get(k)}


@predicts(lambda desired, defaults=None, **_: set(desired) | set(defaults or {}))
def changed_keys(desired: dict, defaults: dict | None = None, path: str = DAEMON_JSON) -> set[str]:
    """The keys configured(desired=..., defaults=..., path=...) will change, from the same fact
    (read ahead): the GPU access probe runs again when one of them decides GPU access. Empty when
    the file cannot be read or the keys are refused (configured() fails the host then)."""
    try:
        validate_settings({**(defaults or {}), **desired})
    except DaemonJsonError:
        return set()
    current = fact(DaemonJson, path=path)["data"]
    return set() if current is None else differing_keys(current, merge(current, desired, defaults))


@reads_with(lambda path=DAEMON_JSON, **_: (DaemonJson, {"path": path}))
@operation(is_idempotent=True)
def configured(desired: dict, defaults: dict | None = None, path: str = DAEMON_JSON):
    """Merge nemofleet's keys into daemon.json; reload Docker for reloadable keys, restart otherwise.

    desired: keys nemofleet owns, set on every run ({key: value}; None removes the key). Two keys
      merge instead of replacing: `runtimes` entries are added only when the host has no entry
      of that name (an operator's own `nvidia` entry is kept), `features` entries are set one by
      one; `exec-opts` is a list of "name=value" options merged by name (merge_exec_opts): only
      native.cgroupdriver is removed when not listed, every other option is kept in its order.
    defaults: keys written only when the file lacks them (e.g. log-driver, log-opts unless a
      setting asks for them explicitly); for `runtimes`/`features`, entries missing from the file.
    Every other key in the file (data-root, bip, ...) is kept. The file is written only when the
    parsed JSON differs, so a host whose file already satisfies this changes nothing and Docker
    (and, through Requires=, every vLLM unit) is not restarted. changed_keys() says beforehand
    which keys change (read by the GPU access probe).
    """
    try:
        validate_settings({**(defaults or {}), **desired})
    except DaemonJsonError as exc:
        yield fail_command(str(exc))
        return
    current = fact(DaemonJson, path=path)
    if current["data"] is None:
        yield fail_command(
            f"{path} on {host.name} is {current['error']}; nemofleet leaves it untouched: fix or remove it, then re-run")
        return
    merged = merge(current["data"], desired, defaults)
    if merged == current["data"]:
        host.noop(f"{path} already holds nemofleet's keys")
        return
    restart = needs_restart(current["data"], merged)
    action = "restart" if restart else "reload"
    text = render(merged)
    if state.config.DIFF:
        host.log(f"Will {'modify' if current['exists'] else 'create'} {path} (then {action} docker"
                 f"{': ' + ', '.join(restart) if restart else ''})", logger.info)
        old = render(current["data"]).splitlines(True) if current["exists"] else []
        for line in generate_color_diff(old, text.splitlines(True)):
            logger.info("  %s", line)
    docker = fact(DockerInfo)
    q = shell.quote
    yield from atomic_put(
        text, path, "0644", validate=_validate_snippet(temp_path(path), path, docker.get("server")),
        before=f"if [ -f {q(path)} ]; then cp -f {q(path)} {q(path + '.nemofleet-prev')}; fi; ",
        after=_apply_snippet(path, action) if docker.get("running") else "")
