"""The hostile suite, generated from the typed models: every settings key (settings.KEYS) and every
leaf and container of every HostFacts part (a fixture host's facts) gets the same classes of bad
value (wrong types, huge and non-finite numbers, control characters, non-UTF-8, deep nesting,
very long text), and each case goes through both paths a user has:

- `nemofleet plan INVENTORY --facts FILE` (cli.main, the real inventory loader and facts-file
  reader), with one clean host beside the bad ones: no traceback, no catch-all "could not plan",
  exit 0 or 1, every refusal one line, and the clean host still planned (a bad host is refused
  alone, never the fleet);
- the deploy's decision, `desired.decide(inputs.make(...))` over the facts as HostFacts hands them
  to it (a part that fails its declared type replaced by the part's default and named in
  `errors`, facts/host.read_part): never raises, and a refusal is one line;
- the same facts as they are, into the one gatherer (inputs.make parses them into factmodel.Facts,
  as it does a facts-file entry or a serving group member's facts): a part not of its type
  refuses that host in one sentence naming the part.

Values that can never be right are refused at the edge whatever the key: NaN, infinities, a
number with thousands of digits, a NUL or a line break in a one-line value, a lone surrogate
(a non-UTF-8 byte read back), a list or mapping where one value is wanted (settings.parse).
"""

from __future__ import annotations

import copy
import io
import json
import math
import types

import pytest

from nemofleet import cli, desired, factmodel, inputs, settings
from nemofleet import factmodel as schema
from nemofleet.facts.host import HostFacts
from test_plan import FIXTURES

KEY = "sk-nf-" + "a" * 32
CLEAN = "clean-0"


def _deep(n: int):
    v: object = "x"
    for _ in range(n):
        v = [v]
    return v


# (label, value): the classes of the audit, as Python values an inventory or a facts file can carry
HOSTILE = [
    ("none", None), ("true", True), ("false", False), ("zero", 0), ("negative", -1), ("int64", 2**63),
    ("huge-float", 1e308), ("int-5000-digits", 10**5000), ("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf),
    ("empty", ""), ("space", " "), ("newline", "a\nb"), ("nul", "x\x00y"), ("escape", "\x1b[31mred"),
    ("surrogate", "caf\udce9"), ("digits-5000", "9" * 5000), ("long-text", "A" * 20000),
    ("shell", "$(id)'\";id;`id`"), ("dotdot", "../../etc/passwd"), ("percent", "%n%s%%{x}"),
    ("list", ["a", 1, None]), ("map", {"": ["\n"], "k": {"x": math.nan}}), ("deep-50", _deep(50)),
]
# never right for any key, wherever they go
NEVER = {"nan", "inf", "-inf", "nul", "surrogate", "escape", "int-5000-digits"}


def _never_right(key: settings.Key, label: str) -> bool:
    if label in NEVER:
        return True
    if label == "newline":
        return not key.multiline
    if label == "digits-5000":
        return True  # no setting is 5000 characters long or has 5000 digits
    if label in ("list", "map", "deep-50"):
        return not any(t in (list, dict, tuple) for t in key.types)
    if label in ("true", "false"):
        return bool not in key.types
    return False


def _json(value) -> str | None:
    """JSON text, or None for a value JSON cannot carry (an int of 5000 digits: no facts file holds it,
    test_a_hostile_facts_file_is_one_sentence writes its digits instead)."""
    try:
        return json.dumps(value)
    except ValueError:
        return None


def _py(value) -> str:
    """The value as Python source for the inventory (repr() of an int of 5000 digits raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 10000:
        return "10**5000"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + "".join(_py(v) + ", " for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _plan(tmp_path, monkeypatch, hosts: dict[str, tuple[dict, dict]], facts_text: str | None = None):
    """`nemofleet plan --json` on {host: (facts, host data)}: (rc, {host: result}, stderr)."""
    facts = facts_text if facts_text is not None else "{" + ", ".join(
        f"{json.dumps(h)}: {text}" for h, (f, _) in hosts.items() for text in [_json(f)] if text) + "}"
    (tmp_path / "facts.json").write_text(facts, encoding="utf-8", errors="surrogatepass")
    inv = f"inv_{tmp_path.name.replace('-', '_')}.py"
    # repr() of NaN and infinity is the name nan/inf: the inventory defines them (a float is no group)
    (tmp_path / inv).write_text("from math import inf, nan\nhosts = " + _py([(h, {"vllm_api_key": KEY, **d}) for h, (_, d) in hosts.items()])
                                + "\n", encoding="utf-8", errors="surrogatepass")
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    try:
        rc = cli.main(["plan", inv, "--facts", "facts.json", "--json"])
    except SystemExit as exc:
        rc = exc.code
    text = out.getvalue()
    return rc, (json.loads(text) if text.strip().startswith("{") else {}), err.getvalue()


def _check_plan_run(rc, result, err, bad: list[str]):
    assert "Traceback" not in err, err[-2000:]
    assert rc in (0, 1), (rc, err[-500:])
    assert result.get(CLEAN, {}).get("refused") == [], (result.get(CLEAN), err[-500:])
    for h in bad:
        r = result[h]
        for why in r["refused"] + r["warnings"]:
            assert "could not plan this host" not in why, (h, why)
            assert "\n" not in why and "\x00" not in why, (h, why)
            assert len(why) < 2000, (h, why[:300])


def _decide(name: str, data: dict, facts: dict):
    """What the deploy decides for this host (it never raises: refusals are sentences)."""
    full = {"vllm_api_key": KEY, **data}
    d = desired.decide(inputs.make(name, full, facts, inputs.read_secrets(full)))
    for why in d.refusals + d.warnings:
        assert "\n" not in why and "could not plan" not in why, why
    return d


def _decide_raw(name: str, facts: dict, path: tuple) -> None:
    """The same facts handed to the one gatherer as they are (a facts-file entry, a serving group
    member's facts: inputs.make types them, factmodel.parse): a part not of its type refuses this
    host in one sentence naming the part; as a member's facts, the member is missing with one line."""
    d = _decide(name, DATA, facts)
    part = path[0]
    if schema.part_problem(part, facts[part]):
        said = [r for r in d.refusals if r.startswith("this host's facts hold a value nemofleet cannot use: ")]
        assert said and part in said[0] and d.plan is None, (path, d.refusals)
    peer = factmodel.parse_peer(name, facts)
    if isinstance(peer, factmodel.PeerMissing):
        assert "\n" not in peer.why and len(peer.why) < 400, peer.why


def _base_facts() -> dict:
    f = json.loads((FIXTURES / "gb10" / "hostfacts.json").read_text())
    uuid = f["gpus"]["gpus"][0]["uuid"]
    # the parts the fixture lacks, as HostFacts writes them on a serving host
    f.update({
        "addresses": {"eth0": ["10.0.0.5", "fe80::1"]},
        "image": {"id": "sha256:" + "0" * 64, "env": {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}},
        "release": {"image": "vllm/vllm-openai:v0.32.0", "at": "1700000000"},
        "rdma": [], "gpu_access": "runtime",
        # the daemon.json keys nemofleet reads or merges (dockerconf.READ_KEYS), as a serving host has them
        "daemon_json": {"exists": True, "text": "", "error": None, "data": {
            "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
            "exec-opts": ["native.cgroupdriver=cgroupfs"], "log-driver": "json-file",
            "log-opts": {"max-size": "100m"}, "features": {"cdi": True}, "default-runtime": "runc",
            "registry-mirrors": ["https://mirror.example"], "insecure-registries": ["10.0.0.0/8"]}},
        "health": {"gpus": [{"uuid": uuid, "ecc.mode.current": "Enabled"}], "refused_fields": [], "xids": [],
                   "resets": {}, "drained": {}, "fabric_manager": None, "error": None, "boot_time": 1700000000},
    })
    return f


BASE = _base_facts()
DATA = {"model": "nemotron-3-nano-bf16"}


def _paths(value, at=()):
    """Every path into a facts value: containers first, then their leaves."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, at + (i,))


def _set(facts: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(facts)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _as_deploy_sees(facts: dict) -> dict:
    """The facts a deploy's decision gets: a part that is not of its declared type is the part's
    default, and its sentence is in errors (facts/host.read_part)."""
    out, errors = dict(facts), {}
    for key, (cls, _kwargs) in HostFacts.PARTS.items():
        if key in out:
            why = schema.part_problem(key, out[key])
            if why:
                out[key] = cls().default() if hasattr(cls(), "default") else None
                errors[key] = f"the {key} check printed a value nemofleet cannot use: {why}"
    out["errors"] = errors
    return out


def test_the_clean_fixture_plans_on_both_paths(tmp_path, monkeypatch):
    rc, result, err = _plan(tmp_path, monkeypatch, {CLEAN: (BASE, DATA)})
    assert rc == 0 and result[CLEAN]["refused"] == [], (result, err)
    assert not _decide(CLEAN, DATA, _as_deploy_sees(BASE)).refusals


@pytest.mark.parametrize("key", [k.name for k in settings.KEYS])
def test_every_settings_key_with_every_hostile_value(key, tmp_path, monkeypatch):
    k = settings.BY_NAME[key]
    wrongly_accepted = []
    for label, value in HOSTILE:
        try:
            settings.parse({**DATA, key: value})
        except settings.SettingsError as exc:
            assert exc.problems and all("\n" not in p for p in exc.problems), (label, exc.problems)
        else:
            if _never_right(k, label):
                wrongly_accepted.append(label)
        if settings.command_line_secret(key) is None or not k.secret:
            _decide(f"h-{label}", {**DATA, key: value}, _as_deploy_sees(BASE))
    assert not wrongly_accepted, f"{key} accepted {wrongly_accepted}"
    hosts = {CLEAN: (BASE, DATA)}
    hosts.update({f"h-{label}": (BASE, {**DATA, key: value}) for label, value in HOSTILE})
    _check_plan_run(*_plan(tmp_path, monkeypatch, hosts), [h for h in hosts if h != CLEAN])


@pytest.mark.parametrize("part", sorted(k for k in BASE if k in HostFacts.PARTS))
def test_every_facts_part_with_every_hostile_value(part, tmp_path, monkeypatch):
    hosts, n = {CLEAN: (BASE, DATA)}, 0
    for path in _paths(BASE[part], (part,)):
        for label, value in HOSTILE:
            facts = _set(BASE, path, value)
            name = f"h{n}-{label}"
            n += 1
            hosts[name] = (facts, DATA)
            _decide(name, DATA, _as_deploy_sees(facts))
            _decide_raw(name, facts, path)
    _check_plan_run(*_plan(tmp_path, monkeypatch, hosts), [h for h in hosts if h != CLEAN])


@pytest.mark.parametrize("text, label", [
    ('{"clean-0": ' + json.dumps(BASE) + ', "h": {"cgroup": ' + "9" * 5000 + "}}", "a 5000-digit number"),
    ('{"clean-0": ' + json.dumps(BASE) + ', "h": ' + "[" * 100000 + "]" * 100000 + "}", "100000-deep arrays"),
    ('{"clean-0": ' + json.dumps(BASE) + ', "h": {"cgroup": NaN}}', "NaN"),
    ("\udcff", "not UTF-8"),
])
def test_a_hostile_facts_file_is_one_sentence(text, label, tmp_path, monkeypatch):
    rc, result, err = _plan(tmp_path, monkeypatch, {CLEAN: (BASE, DATA), "h": ({}, DATA)}, facts_text=text)
    assert "Traceback" not in err and rc in (1, 2), (label, rc, err[-800:])
    if rc == 2:  # the whole file refused: one sentence naming it
        assert "facts.json" in err and len(err.strip().splitlines()) == 1, err
    else:
        assert result[CLEAN]["refused"] == [] and result["h"]["refused"], result


# ---------------------------------------------------------------------------- nothing shown that should not be

MARK = "Zq9sEcReTpw"  # a secret no sentence may contain, in any form its value takes
# the keys whose value is, or may carry, a secret: the secret keys, and every URL (credentials in it)
SECRET_BEARING = sorted(k.name for k in settings.KEYS if k.secret or k.pattern == settings.SAFE_URL)


def _carrying(key: settings.Key, label: str, value):
    """The hostile value of class `label`, made to carry MARK where its type can (a URL's password,
    a list's item, a mapping's value, bytes); numbers and booleans carry none but still go through."""
    url = key.pattern == settings.SAFE_URL
    if isinstance(value, str):
        return f"http://user:{MARK}@h.example/{value}" if url else MARK + value
    if isinstance(value, list):
        return [f"http://user:{MARK}@h.example/" if url else MARK, *value]
    if isinstance(value, dict):
        return {"k": MARK, **value}
    return value


@pytest.mark.parametrize("key", SECRET_BEARING)
def test_no_secret_of_any_type_is_shown(key, tmp_path, monkeypatch):
    """Every secret-bearing setting through every bad-value class (and bytes, and a URL whose
    credentials sit beside one bad character): the secret is in no output of `nemofleet plan`,
    text, -v or --json, stdout or stderr, nor in any refusal or warning of the decision."""
    k = settings.BY_NAME[key]
    values = [(label, _carrying(k, label, v)) for label, v in HOSTILE]
    values += [("bytes", MARK.encode()), ("url-bad-char", f"http://user:{MARK}@proxy.example:31 28"),
               ("url-no-scheme", f"user:{MARK}@proxy.example:3128"), ("url-at-in-password", f"http://u:a@{MARK}@h.x/\x01")]
    hosts = {CLEAN: (BASE, DATA)}
    hosts.update({f"h-{label}": (BASE, {**DATA, key: value}) for label, value in values})
    rc, result, err = _plan(tmp_path, monkeypatch, hosts)
    assert rc in (0, 1) and MARK not in json.dumps(result) and MARK not in err, (rc, err[-500:])
    for argv in (["plan", f"inv_{tmp_path.name.replace('-', '_')}.py", "--facts", "facts.json"],
                 ["plan", f"inv_{tmp_path.name.replace('-', '_')}.py", "--facts", "facts.json", "-v"]):
        out, errs = io.StringIO(), io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setattr("sys.stderr", errs)
        try:
            cli.main(argv)
        except SystemExit:
            pass
        assert MARK not in out.getvalue() + errs.getvalue(), (argv, key)
    for label, value in values:
        full = {"vllm_api_key": KEY, **DATA, key: value}
        d = desired.decide(inputs.make(f"h-{label}", full, _as_deploy_sees(BASE), inputs.read_secrets(full)))
        assert MARK not in " ".join(d.refusals + d.warnings), (label, d.refusals)


def _on_command_line(key: str, label: str, value) -> str:
    """The class as `--data` gives it (text), carrying MARK as _carrying does."""
    text = value if isinstance(value, str) else "9" * 5000 if label == "int-5000-digits" else json.dumps(value)
    return _carrying(settings.BY_NAME.get(key) or types.SimpleNamespace(pattern=None), label, text)


@pytest.mark.parametrize("key", SECRET_BEARING + list(settings.PYINFRA_SECRET_KEYS) + ["sudo_password"])
def test_no_secret_given_with_data_is_shown_or_passed_on(key, tmp_path, monkeypatch, capsys):
    """`--data KEY=VALUE` of every secret-bearing key (nemofleet's and pyinfra's own passwords) in
    every bad-value class: refused before any host is asked (rollout, rebuild: exit 2, rollout's
    --json one document), and by the deploy (pyinfra's own --data: spec.read), the secret in no
    output and no sentence."""
    from nemofleet import spec
    from nemofleet.fleet import driver, rebuild, rollout

    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.py").write_text("hosts = [('h1', {'ssh_hostname': '127.0.0.1'})]\n")
    for fn in (driver.exec_all, rollout.rollout, rebuild.rebuild):
        monkeypatch.setattr(fn.__module__ + "." + fn.__name__, lambda *a, **k: pytest.fail("no host may be asked"))
    for label, value in HOSTILE:
        pair = f"{key}={_on_command_line(key, label, value)}"
        for argv in (["rollout", "inv.py", "--json", "--data", pair], ["rebuild", "inv.py", "h1", "--data", pair]):
            try:
                rc = cli.main(argv)
            except SystemExit as exc:
                rc = exc.code
            out, err = capsys.readouterr()
            assert rc == 2 and MARK not in out + err and ("would put" in err or "credentials" in err), (label, argv, err)
            if "--json" in argv:
                assert json.loads(out)["result"] == "refused", (label, out)
        refusals = spec.read("h1", {"vllm_api_key": KEY, **DATA}, command_line={key: pair.partition("=")[2]}).refusals
        assert refusals and MARK not in " ".join(refusals), (label, refusals)


# ============================================================================ raw host output
# The same 25 classes as lines a host prints, before any parsing: every fact's parser (each
# nemofleet.facts.Fact's parse(), as Fact.process and HostFacts call it) and every controller-side
# reader of a remote program's answer is fed a realistic output with each line replaced by each
# class, each class inserted before each line, and each word of each line (and each leaf of a
# JSON line) replaced by it. The assertion: the parser itself raises nothing but Unreadable (no
# traceback, and so never the wrappers' catch-all either), and what it returns is of its type (a
# HostFacts part passes the part's declared type, or is refused in one sentence by it).

import importlib  # noqa: E402
import pkgutil  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import nemofleet  # noqa: E402
from nemofleet import canary, fanout  # noqa: E402
from nemofleet.lock import info as lockinfo  # noqa: E402
from nemofleet.facts import Fact  # noqa: E402
from nemofleet.facts.engine import EngineFact  # noqa: E402
from nemofleet.facts.host import read_part  # noqa: E402
from nemofleet.fleet import smoke, status  # noqa: E402
from nemofleet.valuetypes import UNIX_MAX, Unreadable  # noqa: E402

_ARABIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")  # Arabic-Indic digits: str.isdigit() takes them


def _json_text(value) -> str:
    """JSON text of a value (an int of 5000 digits, which json.dumps refuses, as its digits)."""
    big = "1" + "0" * 5000

    def walk(v):
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 10000:
            return "@@BIG@@"
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v
    try:
        return json.dumps(walk(value)).replace('"@@BIG@@"', big)
    except RecursionError:
        return "[" * 100 + "]" * 100


def _texts(value) -> list[str]:
    """A class as the text a host can print for it: a number in ASCII and in Arabic-Indic digits,
    infinity also as 1e309, None as JSON null and Python None, containers as JSON."""
    if isinstance(value, str):
        return [value]
    if value is None:
        return ["null", "None"]
    if isinstance(value, bool):
        return [json.dumps(value), str(value)]
    if isinstance(value, int):
        digits = "1" + "0" * 5000 if value.bit_length() > 10000 else str(value)
        return [digits, digits.translate(_ARABIC)]
    if isinstance(value, float):
        if math.isnan(value):
            return ["nan", "NaN"]
        if math.isinf(value):
            sign = "-" if value < 0 else ""
            return [f"{sign}inf", f"{sign}Infinity", f"{sign}1e309"]
        return [repr(value)]
    return [_json_text(value)]


RAW = [(label, text) for label, value in HOSTILE for text in _texts(value)]
_WORD = re.compile(r"[^\s=,:]+")


def _json_at(line: str):
    """(prefix, document) when the line ends in a JSON object or list (an engine answer, a weights
    check's answer), else None."""
    for k, c in enumerate(line):
        if c in "{[":
            try:
                return line[:k], json.loads(line[k:])
            except ValueError:
                return None
    return None


def _mutants(lines: list[str], words: bool = True):
    """(label, lines) of every case of one output; `words`: words and JSON leaves too."""
    seen = set()
    for i, line in enumerate(lines):
        doc = _json_at(line) if words else None
        for label, text in RAW:
            cases = [lines[:i] + [text] + lines[i + 1:], lines[:i] + [text] + lines[i:]]
            if words:
                cases += [lines[:i] + [line[:m.start()] + text + line[m.end():]] + lines[i + 1:]
                          for m in _WORD.finditer(line)]
            for case in cases:
                # a host's output is split at newlines only (pyinfra): a class holding one is two lines
                case = "\n".join(case).split("\n")
                key = tuple(case)
                if key not in seen:
                    seen.add(key)
                    yield label, case
        if doc is not None:
            prefix, doc = doc
            for path in list(_paths(doc))[1:]:
                for label, value in HOSTILE:
                    yield label, lines[:i] + [prefix + _json_text(_set(doc, path, value))] + lines[i + 1:]


def _one_line(why, where):
    assert isinstance(why, str) and why and "\n" not in why and "\x00" not in why and len(why) < 2000, (where, why)


# ---------------------------------------------------------------------------- what hosts print
# A serving host's output of every fact, in the formats of the real captures (tests/fixtures/gpu/
# h200/hostfacts_engine.out, ../shared/captures/h100/raw-outputs.txt) and of each fact's command.

_CAPTURE = (FIXTURES / "h200" / "hostfacts_engine.out").read_text().splitlines()
UUID = "GPU-aad4fc2d-65cb-6858-1097-355c5b328a88"
SHA = "0123456789abcdef0123456789abcdef01234567"
IMAGE = "vllm/vllm-openai:v0.27.1"
ENGINE = [
    '@@engine 200 info {"ServerVersion":"29.1.3","CgroupDriver":"systemd","CgroupVersion":"2",'
    '"DefaultRuntime":"runc","Runtimes":{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}}',
    f'@@engine 200 image:{IMAGE} {{"Id":"sha256:{"ab" * 32}","Config":{{"Env":["PATH=/usr/bin",'
    '"CUDA_VERSION=12.8.1","NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=535,driver<536"]}}',
    '@@engine 200 network:gpu-net {"Name":"gpu-net","Id":"1f2e"}',
    '@@engine 200 container:nemotron-0 {"Name":"/nemotron-0","State":{"Running":true},'
    '"NetworkSettings":{"Networks":{"gpu-net":{"Aliases":["nemotron-0"]}}}}',
]


def _capture_sections() -> dict[str, list[str]]:
    out, cur = {}, None
    for line in _CAPTURE:
        if line.startswith(HostFacts.MARK):
            cur = line[len(HostFacts.MARK):]
            out[cur] = []
        else:
            out[cur].append(line)
    return out


PARTS_OUT = {**_capture_sections(), **{
    "engine": ENGINE,
    "toolkit": ["ctk=1.18.0", "hook=1", "runtime=1", "cdi=/etc/cdi/nvidia.yaml", "cdi_refresh=enabled"],
    "docker": ["installed=1"],
    "daemon_json": ["##NEMOFLEET_FILE##", "{", '    "default-runtime": "runc",',
                    '    "exec-opts": ["native.cgroupdriver=cgroupfs"],', '    "features": {"cdi": true},',
                    '    "log-opts": {"max-size": "100m"},',
                    '    "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}', "}", ""],
    "models": [json.dumps({"nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {
        "total_size": 63200000000, "complete": True, "revision": SHA,
        "config": {"architectures": ["NemotronHForCausalLM"], "max_position_embeddings": 262144,
                   "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 52},
        "marker_ok": {"present_bytes": 63200000000, "total_size": 63200000000, "incomplete_files": 0}}})],
    "release": ["id=0a1b2c3d4e5f", f"image={IMAGE}", "model=nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"],
    "gpu_access": ["runtime nvidia cgroupfs 29.1.3"],
    "lock": ["state=HELD", "holder=alice@ctl", f"token_sha256={'e' * 64}", "since=2026-12-03T09:00:00Z",
             "expires=1796409088", "message=driver upgrade", "now=1796405488"],
    "addresses": ["lo 127.0.0.1/8", "eth0 10.0.0.5/24", "eth0 fe80::1/64"],
    "rdma": ["mlx5_0 mlx5_1"],
    "health": _capture_sections()["health"] + [
        "REFUSED=gpu_recovery_action", "Q:GPU 00000000:00:06.0", "Q:    GPU Recovery Action                  : None",
        "XID:[ 1234.567890] NVRM: Xid (PCI:0000:00:06): 79, pid=1234, GPU has fallen off the bus.",
        "RESET:00000000:00:06.0 1796405500", f"DRAINED:{UUID} 1796405500 0 xid 79 (fallen off the bus)",
        "FM_VERSION=580.159.04"],
}}


def _host_output() -> list[str]:
    out = []
    for key in [HostFacts.ENGINE, *HostFacts.PARTS]:
        out += [HostFacts.MARK + key, *PARTS_OUT.get(key, [])]
    return out


# the facts outside HostFacts, read by operations (or bootstrap), each with a serving host's output
OWN_OUT = {
    "UnitStates": ["unit nemofleet-vllm-nemotron-0.service enabled active",
                   "unit nemofleet-vllm-nemotron-1.service disabled inactive", "file nemofleet-vllm-nemotron-0.service"],
    "AptPackages": ["pkg nvidia-container-toolkit 1.18.0-1 hi", "pkg libnvidia-container1 1.18.0-1 ii",
                    "held nvidia-container-toolkit"],
    "BootstrapState": ["pkg nvidia-driver-580-server 580.159.04-0ubuntu1 hi", "held nvidia-driver-580-server",
                       "loaded 580.159.04"],
    "FilesDigest": ["755 dir /etc/nemofleet", "- - /etc/nemofleet/gone.json", "@nemofleet-files",
                    "/etc/nemofleet/health.json", "@nemofleet-modes", "644", "@nemofleet-sums",
                    f"{'c' * 64}  /etc/nemofleet/health.json"],
    "FileText": ['from="10.0.0.0/8",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG5lbW9mbGVldA nemofleet-seed'],
    "TcpReach": ["open"],
    "MachineId": ["0123456789abcdef0123456789abcdef"],
    "WeightsStatus": [json.dumps({"dir": "/srv/nemofleet/models/x", "exists": True, "complete": True, "marker": True,
                                  "missing": [], "truncated": [], "incomplete_files": 0, "present_bytes": 10,
                                  "total_size": 10, "commit_ok": True, "other_commits": []})],
    "HubCommit": [json.dumps({"sha": SHA})],
    "Networks": [ENGINE[2]],
    "ContainerNetworks": [ENGINE[3]],
    "Batch": ["@@nemofleet-batch:-1", *ENGINE, "@@nemofleet-rc:0", "@@nemofleet-batch:0",
              "unit nemofleet-vllm-nemotron-0.service enabled active", "@@nemofleet-rc:0"],
}


def _fact_classes() -> dict[str, type]:
    """Every concrete nemofleet fact (a new one without an output above fails the suite)."""
    for mod in pkgutil.walk_packages(nemofleet.__path__, "nemofleet."):
        if mod.name.startswith(("nemofleet.facts", "nemofleet.bootstrap")):
            importlib.import_module(mod.name)
    out, todo = {}, [Fact]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls not in (Fact, EngineFact) and cls.__module__.startswith("nemofleet."):
            out[cls.__name__] = cls
    return out


def _parsed(fact, lines):
    """(value, sentence or None) of the fact's own parser: anything but Unreadable is a traceback."""
    try:
        return fact.parse(lines), None
    except Unreadable as exc:
        return (fact.default() if exc.value is None else exc.value), str(exc)


def test_every_fact_and_remote_program_has_its_realistic_output_here():
    """A fact or a remote program added without a place in the raw suite fails here, and every
    pyinfra fact of nemofleet is a Fact (so its process() is the one total wrapper)."""
    facts = _fact_classes()
    in_host = {type(f).__name__ for _, f, _ in HostFacts()._parts(dict.fromkeys(HostFacts.ARGS, ""))}
    assert set(facts) == in_host | set(OWN_OUT) | {"HostFacts"}, set(facts) ^ (in_host | set(OWN_OUT) | {"HostFacts"})
    from pyinfra.api import FactBase

    stray = [c.__name__ for c in _all_subclasses(FactBase) if c.__module__.startswith("nemofleet.")
             and not issubclass(c, Fact)]
    assert not stray, stray
    programs = {p.stem for p in (Path(nemofleet.__file__).parent / "remote").glob("*.py")
                if p.stem not in ("__init__", "_prelude")}  # the prelude is sent before a program, never alone
    assert programs == set(READERS) | set(NOT_READ), programs ^ (set(READERS) | set(NOT_READ))


def _all_subclasses(cls):
    for c in cls.__subclasses__():
        yield c
        yield from _all_subclasses(c)


@pytest.mark.parametrize("key", [k for k in HostFacts.PARTS])
def test_every_hostfacts_part_with_every_hostile_line(key):
    """A part's output with each class in each line, word and JSON leaf: its fact's parser raises
    nothing but Unreadable, and the part it hands on is of its declared type or refused in one
    sentence (read_part: what the deploy, `nemofleet plan` and status read)."""
    fact = HostFacts.PARTS[key][0]()
    own, read = PARTS_OUT.get(key, []), PARTS_OUT[HostFacts.ENGINE] if isinstance(fact, EngineFact) else []
    cases = [("clean", own + read)] + [(label, lines + read) for label, lines in _mutants(own)]
    cases += [(label, own + lines) for label, lines in _mutants(read)]  # the Docker parts' shared engine read
    typed = {}
    for label, lines in cases:
        value, why = _parsed(fact, lines)
        if why is None:
            why = schema.part_problem(key, value)
            assert label != "clean" or why is None, why
        if why is not None:
            _one_line(why, (key, label, lines[:3]))
        part, said = read_part(key, fact, lines)  # the wrapper agrees with the parser
        assert (said is None) == (why is None) and (said is not None or schema.part_problem(key, part) is None)
        if said is None:
            typed.setdefault(repr(part), (label, part))
    # each distinct part a hostile line left of its type: the deploy's decision over it never raises
    host = HostFacts().parse(_host_output())
    for label, part in typed.values():
        _decide(f"raw-{key}-{label}", DATA, {**host, key: part})
    assert len(cases) > 50


def test_the_whole_hostfacts_output_with_every_hostile_line():
    """The combined output (section markers included) with each line replaced by each class and
    each class inserted before it: HostFacts never raises, and the gatherer refuses the host in
    one-line sentences or plans it."""
    out = _host_output()
    clean = HostFacts().parse(out)
    assert clean["errors"] == {}, clean["errors"]
    assert not factmodel.parse(clean)[1]
    for label, lines in _mutants(out, words=False):
        facts = HostFacts().parse(lines)
        for why in list(facts["errors"].values()) + factmodel.parse(facts)[1]:
            _one_line(why, (label, why))


@pytest.mark.parametrize("name", sorted(OWN_OUT))
def test_every_operation_fact_with_every_hostile_line(name):
    """The facts the operations read: the parser raises nothing but Unreadable and its value is
    of the fact's type (that of its value for the clean output, or of its default)."""
    fact = _fact_classes()[name]()
    own = OWN_OUT[name]
    clean, why = _parsed(fact, own)
    assert why is None and clean is not None and clean != fact.default(), (name, clean)
    types = (type(clean), type(fact.default()))
    for label, lines in _mutants(own):
        value, why = _parsed(fact, lines)
        assert isinstance(value, types) and fact.process(lines) == value, (name, label, value)
        if why is not None:
            _one_line(why, (name, label))


# ---------------------------------------------------------------------------- remote programs' answers

def _lock(lines):
    out = lockinfo.parse.__wrapped__(lines)
    for k, v in out.items():
        if k == "now" or k.endswith("expires"):
            assert type(v) is int and 0 <= v < UNIX_MAX, (k, v)
    for prefix in ("", "expired_", "released_"):
        info = lockinfo.holder_info(out, prefix)
        if info:
            lockinfo.describe(info), lockinfo.until(info, out.get("now")), lockinfo.expired(info, out.get("now"))
            lockinfo.lock_refusal(info, None, out.get("now") or 0)
    return out


def _status(lines):
    said = (status.unit_lines.__wrapped__(lines, 1796405488.0) + status.gpu_lines.__wrapped__(lines)
            + status.canary_line.__wrapped__(lines))
    status._record.__wrapped__(lines)
    for line in said:
        assert isinstance(line, str) and "\n" not in line, line
    return said


def _smoke(lines):
    a = smoke.parse.__wrapped__("h", 0, "\n".join(lines))
    assert isinstance(a, smoke.Answer) and "\n" not in a.error and (a.seconds is None or math.isfinite(a.seconds))
    return a


def _metrics(lines):
    gpu, texts = canary.split_instances.__wrapped__(lines)
    for text in texts.values():
        samples = canary.parse.__wrapped__(text)
        assert all(math.isfinite(v) and 0 <= v for v in samples.values()), samples
        canary.figures_of(samples).text()
    return gpu, texts


def _hub(lines):
    items = [("https://huggingface.co", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "main")]
    got = weights_facts.parse_hub_commits.__wrapped__(items, lines)
    assert set(got) == {items[0]} and (set(got[items[0]]) in ({"sha"}, {"error"})), got
    _one_line(next(iter(got[items[0]].values())), got)
    return got


def _holders(lines):
    return fanout.parse_holders(lines, {"/srv/nemofleet/models/x": "x"})


from nemofleet.facts import weights as weights_facts  # noqa: E402


def _gateway_servers(lines):
    from nemofleet.fleet import gateway

    got = gateway.parse.__wrapped__(lines)
    assert all(isinstance(s.weight, int) and 0 <= s.scur <= 1 << 20 for s in got.values()), got
    return got

# {remote program: [(reader, its answer on a serving host)]}: the facts that read engine_read,
# weights_check, models_on_disk, hub and lock are fed above; these are the readers that are no fact
READERS = {
    "engine_read": [], "weights_check": [(_holders, ["nemofleet-holds /srv/nemofleet/models/x"])],
    "models_on_disk": [],
    "lock": [(_lock, ["state=ACQUIRED", "expired_holder=bob@ctl", f"expired_token_sha256={'f' * 64}",
                      "expired_since=2026-12-01T09:00:00Z", "expired_expires=1796400000", "holder=alice@ctl",
                      "expires=1796409088", "now=1796405488"])],
    "release": [(_lock, ["id=0a1b2c3d4e5f", f"units_sha256={'d' * 64}"])],
    "host_status": [(_status, ["release id=r1", f"release image={IMAGE}",
                               "unit nemofleet-vllm-nemotron-0.service active nemofleet vLLM nemotron-0 (nemotron on GPU 0)",
                               'prom nemofleet_vllm_up{instance="nemotron-0",model="nemotron",port="8000"} 1',
                               'prom nemofleet_vllm_last_success_timestamp_seconds{instance="nemotron-0"} 1796405400',
                               'prom nemofleet_vllm_num_requests_running{instance="nemotron-0"} 3',
                               'prom nemofleet_vllm_kv_cache_usage_ratio{instance="nemotron-0"} 1.2e-05',
                               f"gpusick {UUID} 1796405500 0 xid 79 (fallen off the bus)",
                               "weights nvidia--X 10 of 10 (100%) tensor bytes, complete",
                               "canary 2026-12-03T09:00:00Z alice@ctl canary pass: 120 req, 0.0% errors"])],
    "smoke": [(_smoke, ['{"choices": [{"message": {"content": "391"}, "finish_reason": "stop"}], '
                        '"usage": {"prompt_tokens": 12, "completion_tokens": 3}}',
                        f"{smoke.MARK} http 200 0.25 instance 127.0.0.1:8000"])],
    "metrics": [(_metrics, ["@@gpu NVIDIA H200", "@@instance nemotron-0",
                            'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 120.0',
                            'http_requests_total{handler="/v1/chat/completions",method="POST",status="5xx"} 2.0',
                            'vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="m"} 100.0',
                            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 122.0',
                            'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 122.0'])],
    "hub": [(_hub, ["hub_commit 0", json.dumps({"sha": SHA})])],
    "haproxy_api": [(_gateway_servers, ["server a100-1 op=2 admin=8 weight=100 scur=0",
                                        "server h200-1 op=2 admin=0 weight=11 scur=3"])],
}
NOT_READ = {"gpu_return": "its exit status only", "health": "runs on the host; its textfile is host_status's prom lines"}


@pytest.mark.parametrize("program", sorted(READERS))
def test_every_remote_answer_reader_with_every_hostile_line(program):
    """The controller's readers of a remote program's answer (the function each wraps with
    valuetypes.reads_host, called as itself): nothing raises, and what they read is bounded."""
    for reader, answer in READERS[program]:
        reader(answer)
        for _label, lines in _mutants(answer):
            reader(lines)
