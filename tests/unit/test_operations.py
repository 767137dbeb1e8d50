"""Every nemofleet operation against JSON fixtures, as pyinfra tests its own operations.

tests/operations/<module>.<op>/<case>.json holds:
  kwargs            the operation's arguments (["set:", ...] is a set)
  facts             {FactClass: value} or {FactClass: {"k=v, ...": value}} (see opharness)
  host              optional {"name", "data", "connector"} ("local" for @local)
  diff              optional: run as with --diff
  commands          what the operation yields (StringCommand text, ["upload", dest, content],
                    ["function", name, args, kwargs])
  noop_description  required when commands is empty
  after             optional {kwarg: value}: what the op put into a set it was given
  exception         optional {"name", "message"}: the op raises this
  logs              optional: substrings its host.log lines must contain

NEMOFLEET_REGEN_OPS=1 rewrites commands/noop_description/after from the code (then read the
diff: a fixture is a statement of behaviour, not a snapshot to refresh blindly).
"""

from __future__ import annotations

import json
import os
from importlib import import_module
from pathlib import Path

import pytest

from opharness import as_json, run

ROOT = Path(__file__).resolve().parents[1] / "operations"
CASES = sorted(ROOT.glob("*.*/*.json"))
# declared is_idempotent=False: always a change, run only under _if= (so no no-op case)
ALWAYS_CHANGE = {"units.daemon_reload", "reboot.reboot_and_wait"}


def load_op(dirname: str):
    module, op = dirname.split(".")
    return getattr(import_module(f"nemofleet.operations.{module}"), op)


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_operation(path: Path):
    case = json.loads(path.read_text())
    op = load_op(path.parent.name)
    h = case.get("host", {})
    args = dict(kwargs=case.get("kwargs", {}), facts=case.get("facts", {}), host_name=h.get("name", "testhost"),
                data=h.get("data"), connector=h.get("connector", "ssh"), diff=case.get("diff", False))
    if "exception" in case:
        with pytest.raises(Exception) as exc:
            run(op, **args)
        assert type(exc.value).__name__ == case["exception"]["name"]
        assert str(exc.value) == case["exception"]["message"]
        return
    result = run(op, **args)
    after = {k: as_json(result.kwargs[k]) for k in case.get("after", {})}
    if os.environ.get("NEMOFLEET_REGEN_OPS"):
        case.update(commands=result.commands, noop_description=result.noop_description)
        if after:
            case["after"] = after
        path.write_text(json.dumps(case, indent=4) + "\n")
    assert result.commands == case["commands"]
    assert result.noop_description == case.get("noop_description")
    if not result.commands:
        assert result.noop_description, "an operation that changes nothing must say why (host.noop)"
    assert after == case.get("after", {})
    for want in case.get("logs", []):
        assert any(want in line for line in result.logs), f"no log line contains {want!r}: {result.logs}"


def test_every_operation_has_a_no_op_and_a_change_case():
    from nemofleet import operations

    pkg = Path(operations.__file__).parent
    have: dict[str, set] = {}
    for p in CASES:
        case = json.loads(p.read_text())
        have.setdefault(p.parent.name, set()).add("noop" if not case.get("commands") else "change")
    ops = []
    for mod in sorted(pkg.glob("*.py")):
        if mod.stem == "__init__":
            continue
        m = import_module(f"nemofleet.operations.{mod.stem}")
        ops += [f"{mod.stem}.{n}" for n, f in vars(m).items() if hasattr(f, "_inner") and f.__module__ == m.__name__]
    missing = [o for o in ops if ({"change"} if o in ALWAYS_CHANGE else {"noop", "change"}) - have.get(o, set())]
    assert not missing, f"operations without a no-op and a change fixture: {missing}"
