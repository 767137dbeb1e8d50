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


def serving_groups(namespace: dict) -> str | None:
    """Apply the inventory's `serving_groups = {name: [head, worker, ...]}` (multi-node serving
    groups, nemofleet.multinode) to its hosts' data: each member gets `serving_group` and
    `serving_group_members` (the rank order). One sentence when the mapping is wrong."""
    import re

    from .settings import GROUP_NAME

    groups = namespace.get("serving_groups")
    if groups is None:
        return None
    if not isinstance(groups, dict):
        return "serving_groups must be a mapping {group name: [head host, worker host, ...]}"
    found = _groups(namespace)
    known = {h for hosts in found.values() for h in hosts}
    owner: dict = {}
    for gname, members in groups.items():
        if not isinstance(gname, str) or not re.fullmatch(GROUP_NAME, gname):
            return f"serving group name {gname!r} must be lower-case letters, digits and '-' (at most 31)"
        if not isinstance(members, (list, tuple)) or len(members) < 2 or not all(isinstance(m, str) for m in members):
            return f"serving group {gname} must list at least two host names, the head first"
        if len(set(members)) != len(members):
            return f"serving group {gname} lists a host twice"
        for m in members:
            if m not in known:
                return f"serving group {gname} names {m}, which is not a host of this inventory"
            if m in owner:
                return f"{m} is in serving groups {owner[m]} and {gname}: a host serves in one group"
            owner[m] = gname
    for value in (namespace[g] for g in found if isinstance(namespace[g], list)):
        for k, entry in enumerate(value):
            name = entry[0] if isinstance(entry, tuple) else entry
            if name not in owner:
                continue
            data = dict(entry[1]) if isinstance(entry, tuple) and len(entry) > 1 and isinstance(entry[1], dict) else {}
            data.update(serving_group=owner[name], serving_group_members=list(groups[owner[name]]))
            value[k] = (name, data)
    return None


def checked(namespace: dict) -> None:
    # the serving groups are applied on every load; the host checks only under the pyinfra command
    why = serving_groups(namespace) or (problem(namespace, sys.argv, os.path.relpath(
        namespace.get("__file__") or "the inventory")) if _under_pyinfra(sys.argv) else None)
    if why:
        raise SystemExit(f"nemofleet: {why}")


# ---------------------------------------------------------------- the nemofleet commands' inventory argument

MAX_INVENTORY_BYTES = 4 << 20  # an inventory is a short Python file; more is a wrong path


def names_a_file(inventory: str) -> bool:
    """Whether the argument is meant as an inventory file (pyinfra also takes host names and
    connectors such as `web1,web2` or `@docker/...`): a name ending in .py, a path, or a file."""
    return inventory.endswith(".py") or os.sep in inventory or os.path.lexists(inventory)


def file_problem(inventory: str) -> str | None:
    """One sentence when the inventory file cannot be read as Python source, None when it can (or
    when the argument names hosts rather than a file). Never blocks: a FIFO or a device is
    refused from its stat, before any read."""
    import stat

    if not names_a_file(inventory):
        return None
    try:
        st = os.stat(inventory)
    except FileNotFoundError:
        return f"{inventory}: no such file (an inventory is a Python file, e.g. inventories/testbed.py)"
    except OSError as exc:
        return f"cannot read the inventory {inventory}: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return f"the inventory {inventory} is a directory: name the inventory's Python file in it"
    if not stat.S_ISREG(st.st_mode):
        return f"the inventory {inventory} is not a regular file: name the inventory's Python file"
    if st.st_size > MAX_INVENTORY_BYTES:
        return (f"the inventory {inventory} is {st.st_size} bytes, more than the {MAX_INVENTORY_BYTES >> 20} MiB "
                "an inventory file may be: is it the right file?")
    try:
        with open(inventory, "rb") as f:
            raw = f.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        return f"cannot read the inventory {inventory}: {exc.strerror}"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        return f"the inventory {inventory} is not UTF-8 text (line {line}): save it as UTF-8"
    if b"\0" in raw:
        return f"the inventory {inventory} holds a NUL byte: it is not a Python file"
    return unapplied_groups(raw.decode("utf-8"), inventory)


def unapplied_groups(source: str, where: str) -> str | None:
    """One sentence when an inventory sets `serving_groups` at its top level and no top-level
    `checked(globals())` follows: only checked() applies the groups to the hosts' data, so pyinfra
    alone would plan each member as a host of its own."""
    import ast

    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError):
        return None  # its load says why (load_problem)
    sets = [i for i, n in enumerate(body) if any(isinstance(t, ast.Name) and t.id == "serving_groups" for t in (
        n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []))]
    calls = [i for i, n in enumerate(body) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and getattr(n.value.func, "id", getattr(n.value.func, "attr", None)) == "checked"]
    if sets and not any(c > sets[-1] for c in calls):
        return (f"the inventory {where} sets serving_groups but does not end with `checked(globals())`, which "
                "applies them (without it each member would be planned alone): add `from nemofleet.inventory "
                "import checked` and `checked(globals())` as its last line")
    return None


def argv_problem(argv: list[str]) -> str | None:
    """file_problem of each Python file on a pyinfra command line (the inventory among them), for
    the deploy: a plain `pyinfra INVENTORY deploys/nemotron.py` is no nemofleet command."""
    return next(filter(None, (file_problem(a) for a in argv[1:] if a.endswith(".py") and os.path.isfile(a))), None)


def load_problem(inventory: str, exc: BaseException) -> str:
    """One sentence for an exception raised while pyinfra loaded the inventory and its group data
    (pyinfra runs both as Python): the file, the line and the error, never a traceback."""
    filename = getattr(exc, "filename", None)  # pyinfra_cli's UnexpectedExternalError: (exception, file)
    inner = getattr(exc, "exception", None)
    if isinstance(inner, BaseException) and isinstance(filename, str):
        exc = inner
    else:
        filename = inventory
    where = os.path.relpath(filename) if os.path.isabs(filename) else filename
    line = None
    if isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
        where = os.path.relpath(exc.filename) if exc.filename and os.path.isabs(exc.filename) else where
    tb = exc.__traceback__ or getattr(exc, "_traceback", None)
    while tb is not None:  # the last frame in that file: the line that raised
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(filename):
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        text = str(exc)
    except Exception:  # an exception whose str() itself raises
        text = "(its message cannot be shown)"
    text = " ".join(text.split())[:300]
    what = "group data" if os.sep + "group_data" + os.sep in os.sep + where else "inventory"
    return (f"the {what} {where}{f' line {line}' if line else ''} raised {type(exc).__name__}"
            f"{': ' + text if text else ''}; fix that file")
