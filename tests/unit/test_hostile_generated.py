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

import pytest

from nemofleet import cli, desired, factmodel, inputs, settings
from nemofleet.facts import schema
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
SECRET_BEARING = sorted(k.name for k in settings.KEYS if k.secret or k.pattern in (settings.URL, settings.SAFE_URL))


def _carrying(key: settings.Key, label: str, value):
    """The hostile value of class `label`, made to carry MARK where its type can (a URL's password,
    a list's item, a mapping's value, bytes); numbers and booleans carry none but still go through."""
    url = key.pattern in (settings.URL, settings.SAFE_URL)
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
