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
# declared is_idempotent=False: always a change, run only under _if= or when the deploy decided it
# changes something (a bundle's parts this host takes), so no no-op case
ALWAYS_CHANGE = {"units.daemon_reload", "reboot.reboot_and_wait", "weights.bundle_received"}


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


def test_restart_returns_only_once_the_old_processes_are_gone(tmp_path):
    """units.running's restart: a readiness check after it cannot be answered by the old server.
    A stub systemctl whose units change MainPID a second after the restart (one was not running)."""
    import os
    import subprocess
    import time

    from nemofleet.operations.units import RESTART_SCRIPT

    stub = tmp_path / "systemctl"
    stub.write_text(f"""#!/bin/sh
d={tmp_path}
case "$1" in
  show) cat "$d/$5" ;;
  restart) shift 2; for u in "$@"; do ( sleep 1; echo 9$u > "$d/$u" ) & done ;;
esac
""")
    stub.chmod(0o755)
    (tmp_path / "a").write_text("11\n")
    (tmp_path / "b").write_text("0\n")
    t0 = time.time()
    r = subprocess.run(["sh", "-c", RESTART_SCRIPT, "restart", "a", "b"], env=dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert time.time() - t0 >= 0.9 and (tmp_path / "a").read_text().strip() == "9a"


def _asked(op, case) -> list[tuple]:
    """Every (fact class, kwargs) the operation asks for in a fixture case, in order."""
    from opharness import FakeHost, parse_value

    asked = []
    real = FakeHost.get_fact

    def recording(self, cls, **kwargs):
        asked.append((cls, kwargs))
        return real(self, cls, **kwargs)

    h = case.get("host", {})
    FakeHost.get_fact = recording
    try:
        run(op, kwargs=case.get("kwargs", {}), facts=case.get("facts", {}), host_name=h.get("name", "testhost"),
            data=h.get("data"), connector=h.get("connector", "ssh"), diff=case.get("diff", False))
    except Exception:  # noqa: BLE001 - the reads before a raise are what matters here
        pass
    finally:
        FakeHost.get_fact = real
    return asked


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_the_read_an_operation_declares_is_the_first_it_asks(path: Path):
    """deploy.fact_reads() reads ahead what each operation declares with operations.reads_with:
    the declaration must be exactly the fact the operation asks for first (then the batch answers
    it and the operation costs no remote command); an operation that asks for a fact through
    prefetch.fact() must declare it."""
    from opharness import parse_value

    from nemofleet.facts import prefetch

    case = json.loads(path.read_text())
    op = load_op(path.parent.name)
    asked = _asked(op, case)
    declared = getattr(op, "reads", None)
    source = Path(op._inner.__code__.co_filename).read_text()
    body = source.split(f"def {op._inner.__name__}(", 1)[1].split("\n@", 1)[0].split("\ndef ", 1)[0]
    if declared is None:
        assert " fact(" not in body, f"{path.parent.name} reads a fact through prefetch.fact() but declares none"
        return
    want = declared(**parse_value(case.get("kwargs", {})))
    if want is None:  # nothing to read for these arguments
        return
    if not asked:  # refused its arguments before reading anything (a failing command, no fact)
        assert case.get("commands") or case.get("exception"), path
        return
    assert prefetch.key(*asked[0]) == prefetch.key(*want), (asked[:1], want)


# what an operation's decision helper (operations.predicts) says it will do, for each fixture
# case of that operation: the deploy adds the operations that follow from it on this answer
def uploaded(r) -> dict:
    """{temp file: content} of what an operation uploaded (atomic_put uploads to temp_path(path))."""
    return {c[1]: c[2] for c in r.commands if isinstance(c, list) and c[0] == "upload"}


def written_paths(kw, r) -> set:
    """The paths of files.managed's `files` that the operation wrote."""
    from nemofleet.operations import temp_path
    return {p for p in kw["files"] if temp_path(p) in uploaded(r)}


def written_keys(kw, r, facts) -> set:
    """The daemon.json keys that differ between the fixture's file and the one the operation wrote."""
    from nemofleet.operations import daemon_json, temp_path
    path = kw.get("path", daemon_json.DAEMON_JSON)
    text = uploaded(r).get(temp_path(path))
    if text is None:
        return set()
    return daemon_json.differing_keys(facts["DaemonJson"][f"path={path}"]["data"], json.loads(text))


PREDICTS = {
    "files.managed": ("will_change", lambda kw, r, got, facts: got == written_paths(kw, r)),
    "daemon_json.configured": ("changed_keys", lambda kw, r, got, facts: got == written_keys(kw, r, facts)),
    "units.running": ("running_plan", lambda kw, r, got, facts: got.changes() == bool(r.commands)
                      and set(got.deferred) == (r.kwargs.get("deferred") or set())),
    "units.enabled_and_active": ("will_enable_or_start", lambda kw, r, got, facts: got == bool(r.commands)),
    "frontdoor.configured": ("will_change", lambda kw, r, got, facts: got == bool(r.commands)),
    "packages.installed": ("will_install", lambda kw, r, got, facts: bool(got) == bool(r.commands)),
}
PREDICTED = [p for p in CASES if p.parent.name in PREDICTS]


@pytest.mark.parametrize("path", PREDICTED, ids=[f"{p.parent.name}/{p.stem}" for p in PREDICTED])
def test_a_decision_helper_says_what_its_operation_does(path: Path):
    """One comparison decides: the helper the deploy asks before adding the operations that
    follow (a reload after a changed file, the ready wait after a start) answers, from the same
    fixture facts, exactly what the operation then does (issue 39: an honest dry run)."""
    import inspect

    from opharness import call

    case = json.loads(path.read_text())
    module, name = path.parent.name.split(".")
    helper = getattr(import_module(f"nemofleet.operations.{module}"), PREDICTS[path.parent.name][0])
    assert hasattr(helper, "unknown"), "declared with operations.predicts (the recorder answers it before facts)"
    op = load_op(path.parent.name)
    kwargs = dict(case.get("kwargs", {}))
    if path.parent.name == "units.running" and "deferred" in kwargs:
        kwargs["deferred"] = ["set:"]
    h = case.get("host", {})
    where = dict(facts=case.get("facts", {}), host_name=h.get("name", "testhost"), data=h.get("data"),
                 connector=h.get("connector", "ssh"))
    result = run(op, kwargs=kwargs, **where)
    accepted = set(inspect.signature(helper).parameters)
    got = call(helper, {k: v for k, v in kwargs.items() if k in accepted}, **where)
    assert PREDICTS[path.parent.name][1](kwargs, result, got, case.get("facts", {})), (got, result.commands, result.kwargs)


def test_an_image_archive_under_home_is_found_on_the_controller(tmp_path, monkeypatch):
    """vllm_image_archive: ~/img.tar is accepted by the setting (HOME_PATH) and found by the
    operation (expanded on the controller, as the key files are), not refused as missing."""
    from nemofleet import settings
    from nemofleet.operations import docker

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "img.tar").write_bytes(b"tar")
    assert settings.parse({"vllm_image_archive": "~/img.tar"}).vllm_image_archive == "~/img.tar"
    facts = {"ImageInfo": {"ref=r/img:1": None}}
    out = run(docker.image, {"ref": "r/img:1", "archive": "~/img.tar"}, facts).commands
    assert out[0][:2] == ["upload", "/var/tmp/nemofleet-image-img.tar"], out
    out = run(docker.image, {"ref": "r/img:1", "archive": "~/nope.tar"}, facts).commands
    assert "does not exist on the controller" in str(out), out


def test_a_seed_key_of_one_word_fails_the_host_in_one_sentence():
    """authorized_key(): a key of one word (or none) fails that host in one sentence, never
    IndexError; a host's own one-word lines are kept as they are."""
    from nemofleet.operations import files

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    for bad in ("ssh-ed25519", "", "AAAA", None):
        out = run(files.authorized_key, {"path": "/root/.ssh/authorized_keys", "line": "x", "key": bad}, {}).commands
        assert len(out) == 1 and "the fleet seed public key" in str(out) and "nothing was written" in str(out), out
    facts = {"FileText": {"path=/root/.ssh/authorized_keys": "oneword\n" + key + "\n"}}
    out = run(files.authorized_key, {"path": "/root/.ssh/authorized_keys", "line": f"restrict {key}", "key": key},
              facts).commands
    assert "oneword" in str(out) and f"restrict {key}" in str(out), out


@pytest.mark.parametrize("body", ["!!!!", "abc", "QUJD\nRA=\n=", "\u00e9\u00e9"])
def test_an_armoured_key_whose_body_is_not_base64_is_one_sentence(tmp_path, body):
    from nemofleet import bootstrap, settings

    key = tmp_path / "key.asc"
    key.write_text(f"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n{body}\n-----END PGP PUBLIC KEY BLOCK-----\n")
    s = settings.parse({"install_container_toolkit": True, "container_toolkit_key_file": str(key)})
    source, why = bootstrap._source(s, "container_toolkit", "https://nvidia.github.io/x/deb", "/k.gpg", "/l.list")
    assert source is None and why == f"container_toolkit_key_file {key} is not an OpenPGP key apt can read: its " \
                                      "armoured body is not base64", why
