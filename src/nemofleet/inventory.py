"""Checks an inventory file runs on itself (its last line: `checked(globals())`).

pyinfra warns and exits 0 when a `--limit` pattern matches nothing, and runs nothing at all for
an inventory without hosts: a typo then looks like a converged fleet. Under the pyinfra command
these stop the run with one sentence instead (`nemofleet rollout/status/lock` check the same in
nemofleet.fleet.driver)."""

from __future__ import annotations

import fnmatch
import os
import sys


def _groups(namespace: dict) -> dict[str, list[str]]:
    """Module-level lists of hosts (names or (name, data) pairs), as pyinfra reads them."""
    out = {}
    for name, value in namespace.items():
        if name.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        hosts = [h[0] if isinstance(h, tuple) and h and isinstance(h[0], str) else h for h in value]
        if all(isinstance(h, str) for h in hosts):
            out[name] = hosts
    return out


def _limits(argv: list[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if arg == "--limit" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--limit="):
            out.append(arg.split("=", 1)[1])
    return out


def _under_pyinfra(argv: list[str]) -> bool:
    first = os.path.basename(argv[0]) if argv else ""
    return first == "pyinfra" or argv[0].endswith(os.path.join("pyinfra", "__main__.py")) if argv else False


def problem(namespace: dict, argv: list[str], where: str) -> str | None:
    """The sentence that stops this run, or None."""
    groups = _groups(namespace)
    hosts = sorted({h for g in groups.values() for h in g})
    if not hosts:
        return f"{where} has no hosts: nothing would be deployed"
    for pattern in _limits(argv):
        if pattern not in groups and not fnmatch.filter(hosts, pattern):
            return (f"--limit {pattern} matches no host or group of {where} "
                    f"(groups: {', '.join(sorted(g for g in groups if groups[g]))})")
    return None


def checked(namespace: dict) -> None:
    if not _under_pyinfra(sys.argv):
        return
    why = problem(namespace, sys.argv, os.path.relpath(namespace.get("__file__") or "the inventory"))
    if why:
        raise SystemExit(f"nemofleet: {why}")
