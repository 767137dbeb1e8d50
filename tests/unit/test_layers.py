"""The layers point one way (docs/architecture.md, Layers): no import circle in src/nemofleet (imports inside
functions count too), and nothing below the stages imports the fleet layer, the stages or the CLI."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "nemofleet"
# the stages and the CLI on top, and the fleet layer beside them; everything else is below
TOP = ("nemofleet.cli", "nemofleet.deploy", "nemofleet.lock.run", "nemofleet.lock.fleet", "nemofleet.fleet")


def _graph() -> dict[str, set[str]]:
    mods: dict[str, set[str]] = {}
    for f in ROOT.rglob("*.py"):
        parts = ("nemofleet",) + f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        base = name.split(".") + (["x"] if f.name == "__init__.py" else [])
        deps = set()
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom):
                mod = (".".join(base[: len(base) - n.level] + ([n.module] if n.module else []))
                       if n.level else (n.module or ""))
                deps.add(mod)
                deps |= {f"{mod}.{a.name}" for a in n.names}
            elif isinstance(n, ast.Import):
                deps |= {a.name for a in n.names}
        mods[name] = deps
    return {m: {d for d in ds if d in mods and d != m} for m, ds in mods.items()}


def _on_top(mod: str) -> bool:
    return any(mod == t or mod.startswith(t + ".") for t in TOP)


def test_no_import_circle():
    graph, circles = _graph(), []

    def visit(m, stack, seen):
        if m in stack:
            circles.append(" -> ".join(stack[stack.index(m):] + [m]))
            return
        if m in seen:
            return
        seen.add(m)
        for d in sorted(graph[m]):
            visit(d, stack + [m], seen)

    seen: set = set()
    for m in sorted(graph):
        visit(m, [], seen)
    assert not circles, circles


def test_nothing_below_the_stages_imports_them_or_the_fleet_layer():
    graph = _graph()
    wrong = sorted(f"{m} imports {d}" for m, ds in graph.items() if not _on_top(m) for d in ds if _on_top(d))
    assert not wrong, wrong


# The edge and the decision: pure, so plan, status, the deploy, rollout, rebuild and the gateway can
# share them and a test can run them without pyinfra (issue 35). inputs is the gatherer's pure half.
PURE = ("nemofleet.settings", "nemofleet.valuetypes", "nemofleet.gateway", "nemofleet.gpu_classes", "nemofleet.secret", "nemofleet.spec", "nemofleet.inputs", "nemofleet.desired",
        "nemofleet.plan", "nemofleet.render", "nemofleet.preflight", "nemofleet.memory", "nemofleet.recipes",
        "nemofleet.multinode", "nemofleet.gpus", "nemofleet.gpuhealth", "nemofleet.models",
        "nemofleet.nvsmi", "nemofleet.dockerconf", "nemofleet.vllm_flags", "nemofleet.flagtable",
        "nemofleet.plan_types", "nemofleet.layout", "nemofleet.plan_prose", "nemofleet.gpuaccess", "nemofleet.factmodel")


def test_the_decision_modules_import_no_pyinfra_operations_facts_or_fleet():
    import subprocess
    import sys

    code = ("import importlib, sys\n"
            f"for m in {PURE!r}: importlib.import_module(m)\n"
            "bad = sorted(k for k in sys.modules if k == 'pyinfra' or k.startswith(('pyinfra.', 'nemofleet.operations',"
            " 'nemofleet.facts', 'nemofleet.fleet', 'nemofleet.deploy', 'nemofleet.cli')))\n"
            "print(' '.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"the decision layer loads: {out}"


def test_only_the_shell_boundary_quotes():
    """shell.py is the one module that imports shlex: every other module builds argument lists and
    joins them there (shell.join / shell.quote), so quoting has one implementation to review. (The
    testbed, a simulated world and not the product, is a package of its own under testbed/.)"""
    quoting = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "shell.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if "shlex" in names:
                quoting.append(rel)
    assert quoting == [], f"modules that quote outside shell.py: {quoting}"


def _calls(name: str) -> dict[str, list[int]]:
    """{module file: lines} of every call of a function or method called `name` in src/nemofleet."""
    import ast

    out: dict[str, list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if called == name:
                    out.setdefault(str(path.relative_to(ROOT)), []).append(node.lineno)
    return out


def test_settings_are_parsed_in_one_module_and_inputs_built_by_one_gatherer():
    """The edge reads host data once (spec.py, the only caller of settings.parse); every command's
    HostInputs comes from inputs.gather; HostInputs carries no raw host data, and no module writes
    the fan-out's sources into host data (issue 47)."""
    import dataclasses

    from nemofleet import inputs

    parsers = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                     if any(c in p.read_text() for c in ("settings.parse(", "settings_mod.parse(", "settings import parse")))
    assert parsers == ["spec.py"], parsers
    built = {f for f, _ in _calls("HostInputs").items()}
    assert built == {"inputs.py"}, built
    callers = set(_calls("of")) | set(_calls("gather"))
    assert {"deploy.py", "cli.py", "fleet/status.py"} <= callers, callers
    assert not {f.name for f in dataclasses.fields(inputs.HostInputs)} & {"data", "peer_data"}
    writes = [f for f in ROOT.rglob("*.py") if '"weights_seed_from": seeds' in f.read_text()]
    assert not writes, writes


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest import chain (both ends counted): the import graph has no circle (above)."""
    memo: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in memo:
            memo[m] = [m] + max((chain(d) for d in graph[m] if d != "nemofleet"), key=len, default=[])
        return memo[m]

    return max((chain(m) for m in graph), key=len)


def test_the_import_tower_is_at_most_eleven_modules_high():
    # issue 47: it was 13 (cli -> fleet.status -> desired -> preflight -> planning -> multinode -> plan ->
    # plan_prose -> layout -> plan_types -> factmodel -> nvsmi -> valuetypes); preflight no longer imports
    # the planner, the planner takes Settings (no parser below the spec) and plan_types no facts
    chain = longest_chain(_graph())
    assert len(chain) <= 11, " -> ".join(chain)


def test_the_type_checker_passes_over_the_package():
    """mypy over src/nemofleet with check_untyped_defs (pyproject.toml [tool.mypy]), no section of it
    ignored: the declared Settings, the frozen Desired and every call between them are checked."""
    import subprocess
    import sys
    import tomllib

    conf = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())["tool"]["mypy"]
    assert conf["check_untyped_defs"] is True and "overrides" not in conf and "ignore_errors" not in conf
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT.parents[1], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
