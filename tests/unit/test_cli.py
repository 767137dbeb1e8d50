"""The command line explains itself: --version, every command listed with a line, every option with
help and its default; a bad inventory or facts file is one sentence and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import io
import json
import os

import pytest

from nemofleet import cli

COMMANDS = ["plan", "status", "smoke", "rollout", "rollback", "lock", "rebuild", "bundle", "settings", "models", "testbed"]


def run(capsys, *argv):
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own exits (--help, --version, usage errors)
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_version(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.startswith("nemofleet ") and out.split()[1][0].isdigit()


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_alone_and_help_list_every_command_with_a_line(capsys, argv):
    rc, out, _ = run(capsys, *argv)
    assert rc == (2 if not argv else 0)
    listed = [line.split()[0] for line in out.split("commands:")[1].splitlines()
              if line.startswith("    ") and not line.startswith("      ")]
    assert listed == COMMANDS


def test_every_option_has_help_and_shows_its_default():
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == sorted(COMMANDS)
    for name, p in sub.choices.items():
        fmt = p._get_formatter()
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest} has no help"
            text = fmt._get_help_string(action)
            flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            if action.option_strings and not flag:
                assert "default" in text, f"{name} {action.option_strings[0]}: {text!r} shows no default"


def test_a_missing_inventory_file(capsys, tmp_path):
    rc, _, err = run(capsys, "status", str(tmp_path / "nope.py"))
    assert rc == 2
    assert err == f"nemofleet: {tmp_path / 'nope.py'}: no such file (an inventory is a Python file, e.g. " \
                  "inventories/testbed.py)\n"


def test_an_inventory_that_is_a_directory_or_not_utf8(capsys, tmp_path):
    (tmp_path / "d.py").mkdir()
    rc, _, err = run(capsys, "plan", str(tmp_path / "d.py"))
    assert rc == 2 and "is a directory" in err and len(err.splitlines()) == 1
    (tmp_path / "l.py").write_bytes(b"hosts = ['a']\n# caf\xe9\n")
    rc, _, err = run(capsys, "smoke", str(tmp_path / "l.py"))
    assert rc == 2 and err.endswith("is not UTF-8 text (line 2): save it as UTF-8\n")
    os.mkfifo(tmp_path / "f.py")
    rc, _, err = run(capsys, "lock", "status", str(tmp_path / "f.py"))  # must not block
    assert rc == 2 and "not a regular file" in err


def test_an_inventory_or_its_group_data_that_raises(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.py").write_text("hosts = [('h1', {'ssh_hostname': '127.0.0.1'})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("x = 1\ny = {}['missing']\n")
    rc, _, err = run(capsys, "status", "inv.py")
    assert rc == 2
    assert err == "nemofleet: the group data group_data/all.py line 2 raised KeyError: 'missing'; fix that file\n"
    (tmp_path / "group_data" / "all.py").unlink()
    (tmp_path / "bad.py").write_text("hosts = [\n")
    rc, _, err = run(capsys, "plan", "bad.py")
    assert rc == 2 and err.startswith("nemofleet: the inventory bad.py line 1 raised SyntaxError") and \
        len(err.splitlines()) == 1
    (tmp_path / "stops.py").write_text("raise SystemExit('the testbed is not up: run make demo')\n")
    rc, _, err = run(capsys, "plan", "stops.py")
    assert (rc, err) == (2, "nemofleet: the testbed is not up: run make demo\n")


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.py").write_text("hosts = [('h1', {'ssh_hostname': '127.0.0.1'})]\n")
    return "inv.py"


def test_facts_files_are_bounded(capsys, tmp_path, inv, monkeypatch):
    monkeypatch.setattr(cli, "MAX_FACTS_BYTES", 300000)
    cases = {"fifo": None, "dir": None, "deep.json": "[" * 100000 + "]" * 100000, "nested.json": "[" * 65 + "]" * 65,
             "big.json": " " * 300001 + "{}", "latin.json": b'{"h1": "\xe9"}', "notjson.json": "{", "list.json": "[]",
             "inner.json": '{"nemofleet.facts.host.HostFacts": 3}'}
    expect = {"fifo": "is not a regular file", "dir": "is not a regular file", "deep.json": "nests deeper than 64",
              "nested.json": "nests deeper than 64", "big.json": "is 300003 bytes, more than the 300000", "latin.json": "is not UTF-8",
              "notjson.json": "is not JSON", "list.json": "must map host names", "inner.json": "must map host names",
              "missing.json": "no such file"}
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    for name, want in expect.items():
        rc, _, err = run(capsys, "plan", inv, "--facts", name)
        assert rc == 2, name
        assert err.startswith(f"nemofleet: cannot read the facts file {name}: it ") and want in err and len(err.splitlines()) == 1, err


def test_an_unexpected_error_is_one_sentence(capsys, inv, monkeypatch):
    def boom(a):
        raise TypeError("unhashable type: 'dict'")

    monkeypatch.setattr(cli, "cmd_status", boom)
    rc, _, err = run(capsys, "status", inv)
    assert rc == 2
    assert err == ("nemofleet status: unexpected TypeError: unhashable type: 'dict' (a bug: please report it with the "
                   "command that caused it)\n")


def test_testbed_up_without_its_tools_says_so_first(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    rc, _, err = run(capsys, "testbed", "up")
    assert rc == 2
    assert err.startswith("nemofleet: the testbed needs docker, debootstrap, ssh") and "scripts/prereqs.sh" in err


def test_smoke_prints_a_line_per_host_and_fails_when_one_fails(capsys, inv, monkeypatch):
    from nemofleet.fleet import smoke

    seen = {}

    def fake(inventory, limit, prompt, max_tokens):
        seen.update(inventory=inventory, limit=limit, prompt=prompt, max_tokens=max_tokens)
        return [smoke.Answer("h1", True, via="instance 127.0.0.1:8000", words="391.", completion_tokens=68,
                             seconds=0.2),
                smoke.Answer("h2", False, error="HTTP 401 from instance 127.0.0.1:8000: Unauthorized")]

    monkeypatch.setattr(smoke, "smoke", fake)
    rc, out, err = run(capsys, "smoke", inv, "--limit", "h1", "--prompt", "hi")
    assert rc == 1
    assert seen == {"inventory": inv, "limit": ["h1"], "prompt": "hi", "max_tokens": 512}
    assert out.splitlines() == ['h1    ok     0.20 s    68 tokens  instance 127.0.0.1:8000: "391."',
                                "h2    FAIL  HTTP 401 from instance 127.0.0.1:8000: Unauthorized"]
    assert err == "smoke: 1 of 2 host(s) did not answer: h2\n"
    rc, out, _ = run(capsys, "smoke", inv, "--json")
    assert rc == 1 and json.loads(out)[0]["words"] == "391."


def test_data_values_are_one_sentence_and_exit_2(capsys, inv, monkeypatch):
    from nemofleet.fleet import rollout

    monkeypatch.setattr(rollout, "rollout", lambda *a, **k: pytest.fail("must not run"))
    rc, _, err = run(capsys, "rollout", inv, "--data", "novalue")
    assert rc == 2 and err.startswith("nemofleet: --data 'novalue' must be KEY=VALUE") and len(err.splitlines()) == 1
    rc, _, err = run(capsys, "rollout", inv, "--data", "vllm_api_key=sk-secret")
    assert rc == 2 and "would put a secret on pyinfra's command line" in err and "sk-secret" not in err
    # pyinfra's own passwords and a URL holding credentials are never passed on either
    for pair in ("ssh_password=pw-Zq9", "sudo_password=pw-Zq9", "_sudo_password=pw-Zq9", "ssh_key_password=pw-Zq9",
                 "http_proxy=http://u:pw-Zq9@proxy.internal:3128", "https_proxy=user:pw-Zq9@proxy:3128",
                 "hf_endpoint=http://u:pw-Zq9@mirror.internal"):
        for argv in (["rollout", inv], ["rebuild", inv, "h1"]):
            rc, out, err = run(capsys, *argv, "--data", pair)
            assert rc == 2 and "pw-Zq9" not in out + err and len(err.splitlines()) == 1, (pair, err)


@pytest.mark.parametrize("argv, words", [
    (["smoke", "{inv}", "--max-tokens", "-1"], "'-1' must be from 1 to 1000000 tokens"),
    (["smoke", "{inv}", "--max-tokens", "1e9"], "'1e9' is not a whole number of tokens"),
    (["rebuild", "{inv}", "h1", "--expect-host-key", "abc"], "'abc' is not a fingerprint as ssh-keygen -lf prints it"),
    (["rollout", "{inv}", "--wait", "1e999"], "'1e999' must be a finite number of seconds from 1 to 86400"),
])
def test_option_values_are_checked_before_any_host_is_asked(capsys, inv, argv, words):
    rc, _, err = run(capsys, *[a.format(inv=inv) for a in argv])
    assert rc == 2 and words in err, err


# ---------------------------------------------------------------------------- the CLI's contract (issue 48)
SUBCOMMANDS = COMMANDS


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_commands_help_lists_its_exit_codes(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0 and "exit codes: 0 " in out and "2 refused before anything ran" in out and "130 interrupted" in out
    assert cli.EXIT_CODES[command] in " ".join(out.split())


def _fleet_error(*a, **k):
    from nemofleet.fleet.driver import FleetError

    raise FleetError("h1 is locked by alice@ops since 2026-12-07T09:00:00Z")


def _interrupted(*a, **k):
    raise KeyboardInterrupt


LONG = "x" * 70000
REFUSALS = [  # (argv, {module attribute: replacement}), each refused (or interrupted) with --json
    (["rollout", "nope.py"], {}),
    (["rollout", "{inv}", "--wait", "nan"], {}),
    (["rollout", "{inv}", "--data", "vllm_api_key=sk-Zq9"], {}),
    (["rollout", "{inv}", "--data", "novalue"], {}),
    (["rollout", "{inv}", "--message", LONG[:1001]], {}),
    (["rollout", "{inv}", "--pause-after-canary"], {}),
    (["rollout", "{inv}", "--bake", "0.5"], {}),
    (["rollout", "{inv}", "--slo-error-rate", "nan"], {}),
    (["rollout", "{inv}", "--lock-ttl", "5s"], {}),
    (["rollout", "{inv}"], {"nemofleet.fleet.rollout.rollout": _fleet_error}),
    (["rollout", "{inv}"], {"nemofleet.fleet.rollout.rollout": _interrupted}),
    (["rollout", "{inv}"], {"nemofleet.fleet.rollout.rollout": lambda *a, **k: 1 / 0}),
    (["plan", "nope.py"], {}),
    (["plan", "{inv}", "--facts", "missing.json"], {}),
    (["plan", "{inv}", "--limit"], {}),
    (["plan", "{inv}"], {"nemofleet.fleet.driver.gather_facts": _fleet_error}),
    (["plan", "{inv}"], {"nemofleet.fleet.driver.host_specs": _fleet_error}),
    (["plan", "{inv}"], {"nemofleet.cli.cmd_plan": _interrupted}),
    (["smoke", "nope.py"], {}),
    (["smoke", "{inv}", "--prompt", LONG], {}),
    (["smoke", "{inv}", "--prompt-file", "missing.txt"], {}),
    (["smoke", "{inv}", "--prompt-file", "long.txt"], {}),
    (["smoke", "{inv}", "--prompt", "a", "--prompt-file", "long.txt"], {}),
    (["smoke", "{inv}", "--max-tokens", "-1"], {}),
    (["smoke", "{inv}"], {"nemofleet.fleet.smoke.smoke": _fleet_error}),
    (["smoke", "{inv}"], {"nemofleet.fleet.smoke.smoke": lambda *a, **k: {}[0]}),
]


@pytest.mark.parametrize("argv, patches", REFUSALS)
def test_every_refusal_with_json_is_one_json_document_on_stdout(capsys, inv, monkeypatch, argv, patches):
    from nemofleet.fleet import driver

    with open("long.txt", "w") as f:  # in the inventory's directory (the fixture's cwd)
        f.write(LONG)
    monkeypatch.setattr(driver, "exec_all", lambda *a, **k: pytest.fail("no host may be asked"))
    for where, fake in patches.items():
        monkeypatch.setattr(where, fake)
    rc, out, err = run(capsys, *[a.format(inv=inv) for a in argv], "--json")
    doc = json.loads(out)  # exactly one document: json.loads refuses anything after it
    assert rc in (2, 130) and doc["result"] in ("refused", "interrupted", "halted") and doc.get("code", rc) == rc, (argv, out)
    said = doc.get("problems") or [doc.get("reason")]
    assert said and all(isinstance(p, str) and p for p in said) and "Traceback" not in err, (argv, doc, err)
    if doc["result"] == "refused":
        assert "sk-Zq9" not in out + err and said[-1].split(": ")[-1] in err


def test_a_long_prompt_travels_by_file_or_stdin(capsys, inv, monkeypatch, tmp_path):
    from nemofleet.fleet import smoke

    seen = []
    monkeypatch.setattr(smoke, "smoke", lambda inventory, limit, prompt, max_tokens: seen.append(prompt) or [])
    text = "é" * 20000  # 120,000 bytes on a command line as JSON escapes: over the limit as --prompt
    (tmp_path / "p.txt").write_text(text[:5000])
    assert run(capsys, "smoke", inv, "--prompt-file", "p.txt")[0] == 0 and seen == [text[:5000]]
    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin\n"))
    assert run(capsys, "smoke", inv, "--prompt-file", "-")[0] == 0 and seen[-1] == "from stdin\n"
    rc, _, err = run(capsys, "smoke", inv, "--prompt", text)
    assert rc == 2 and f"at most {smoke.MAX_BODY} travel on the SSH command line" in err and len(seen) == 2


# what a host printed, read back, never reaches a terminal as it is (valuetypes.printable)
RAW = ("\x1b[31m", "\u2028", "\x85", "\u202e", "\r")


def test_host_data_read_back_is_escaped_wherever_it_is_shown(capsys, inv, monkeypatch):
    from nemofleet import valuetypes
    from nemofleet.lock import info as lockinfo
    from nemofleet.fleet import driver, smoke, status
    from nemofleet.lock import fleet as lock

    evil = "ev\x1b[31mil\u2028x\x85y\u202ez\r"
    holder = {"holder": evil, "since": evil, "message": evil, "expires": 2**31}
    assert not any(c in lockinfo.describe(holder) + lockinfo.said(evil) for c in RAW)
    assert "ev\\x1b[31mil\\u2028x\\x85y\\u202ez\\r" in lockinfo.describe(holder)

    class Sly:
        def __repr__(self):
            return evil
    assert not any(c in valuetypes.shown(Sly()) + valuetypes.shown(evil) for c in RAW)
    monkeypatch.setattr(driver, "hosts", lambda *a: ["h1"])
    monkeypatch.setattr(lock, "status", lambda *a: {"h1": holder})
    row = status.HostStatus(f"h{evil}", release=evil, planned=evil,
                            lines=status.unit_lines([f"unit nemofleet-vllm-{evil}.service active {evil}"], 0))
    monkeypatch.setattr(status, "status", lambda *a: [row])
    monkeypatch.setattr(smoke, "smoke", lambda *a: [smoke.Answer(evil, True, via=evil, words=evil, seconds=1.0),
                                                    smoke.Answer(evil, False, error=evil)])
    for argv in (["lock", "status", inv], ["status", inv], ["smoke", inv]):
        rc, out, err = run(capsys, *argv)
        assert "ev\\x1b[31mil" in out and not any(c in out + err for c in RAW), (argv, out, err)
