"""The fleet layer's logic without hosts: options, batches, the driver's clean results, no double
rollback, the lock's refusals, host-key decisions, and the CLI's exit codes."""
import ast
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nemofleet import cli
from nemofleet.lock.fact import DeployLock, lock_refusal
from nemofleet import hostcmd as commands
from nemofleet.fleet import driver, gateway, rebuild, rollout
from nemofleet.lock import fleet as lock
from nemofleet.fleet.driver import Exec, FleetError, Result
from nemofleet.fleet.rollout import HostState
from nemofleet import remote

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_gateway(monkeypatch):
    """These inventories have no gateway host (test_gateway_drain.py has the ones that do)."""
    monkeypatch.setattr(gateway, "gateway_hosts", lambda inv: [])


def lock_action(script: str) -> str | None:
    """The action of a lock command (`python3 -I -S -c <remote/lock.py> LOCK ACTION ...`), else None."""
    words = shlex.split(script)
    return words[6] if len(words) > 6 and words[4] == remote.source("lock") else None


# ---------------------------------------------------------------------------- options and batches

def test_batches_canary_first_then_percentages():
    assert rollout.batches(list("abcde"), "50%", 1) == [["a"], ["b", "c", "d"], ["e"]]
    assert rollout.batches(list("abc"), "1", 0) == [["a"], ["b"], ["c"]]
    assert rollout.batches(list("abc"), "100%", 0) == [["a", "b", "c"]]
    assert rollout.batches(list("abc"), "1%", 0) == [["a"], ["b"], ["c"]]


@pytest.mark.parametrize("batch, canary, failures, words", [
    ("0%", 0, 0, "percentage from 1% to 100%"), ("0", 0, 0, "at least 1 host"), ("lots", 0, 0, "a host count (N >= 1)"),
    ("150%", 0, 0, "1% to 100%"), ("1", -1, 0, "--canary -1"), ("1", 3, 0, "fewer than the 3"),
    ("1", 0, -1, "--max-failures -1 must be 0 or more"),
])
def test_bad_options_refused_with_one_sentence(batch, canary, failures, words):
    with pytest.raises(FleetError) as exc:
        rollout.check_options(3, batch, canary, failures)
    assert words in str(exc.value) and str(exc.value).count(". ") == 0


def test_lock_ttl_parsed():
    assert lock.parse_ttl("2h") == 7200 and lock.parse_ttl("90m") == 5400 and lock.parse_ttl("600") == 600
    for bad in ("soon", "10s", "-1h"):
        with pytest.raises(FleetError):
            lock.parse_ttl(bad)


# ---------------------------------------------------------------------------- driver

def test_pyinfra_runs_as_this_interpreters_module_and_a_timeout_is_a_clean_result(monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"], seen["env"] = cmd, kw["env"]
        raise subprocess.TimeoutExpired(cmd, 1, output=b"partial out", stderr=b"err")
    monkeypatch.setattr(subprocess, "run", fake_run)
    r = driver.run("inv.py", ["h"], "exec", "--", "true", timeout=1, env={"NEMOFLEET_LOCK_TOKEN": "t"})
    assert seen["cmd"][:3] == [sys.executable, "-m", "pyinfra"] and seen["cmd"][3:7] == ["-y", "inv.py", "--limit", "h"]
    assert seen["env"]["NEMOFLEET_LOCK_TOKEN"] == "t"
    assert r.rc == 124 and r.timed_out and "partial out" in r.stdout and "timed out after 1s" in r.stderr


def test_exec_output_is_split_per_host_with_its_own_exit_status(monkeypatch):
    out = ("    [a] Connected\n    [b] Could not connect (refused)\n--> Starting operation\n"
           "[a] state=HELD\n[a] @@nemofleet-rc=3\n    [a] Success\n")
    monkeypatch.setattr(driver, "run", lambda *a, **k: Result(1, "", out))
    got = driver.exec_all("inv.py", ["a", "b"], "x")
    assert got["a"] == Exec("a", 3, "state=HELD")
    assert got["b"].rc == 255 and not got["b"].reachable and got["b"].text == "Could not connect (refused)"


def write_inventory(tmp_path, text):
    p = tmp_path / f"inv{len(list(tmp_path.glob('inv*.py')))}.py"  # a new name: pyinfra caches by path
    p.write_text(text)
    return str(p)


def test_empty_inventory_and_limit_matching_nothing_are_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty = write_inventory(tmp_path, "hosts = []\n")
    with pytest.raises(FleetError, match="has no hosts"):
        driver.hosts(empty)
    inv = write_inventory(tmp_path, "gpu = [('h1', {'x': 1}), 'h2']\n")
    assert driver.hosts(inv) == ["h1", "h2"] and driver.hosts(inv, ["gpu"]) == ["h1", "h2"]
    assert driver.hosts(inv, ["h*1"]) == ["h1"] and driver.host_data(inv, ["h1"])["h1"]["x"] == 1
    with pytest.raises(FleetError, match="--limit nope matches no host or group"):
        driver.hosts(inv, ["nope"])


def test_cli_rollout_with_unknown_limit_exits_2_with_a_sentence(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    inv = write_inventory(tmp_path, "hosts = ['h1']\n")
    assert cli.main(["rollout", inv, "--limit", "nope"]) == 2
    assert "rollout refused: --limit nope matches no host" in capsys.readouterr().err
    assert cli.main(["rollout", inv, "--batch", "0%"]) == 2
    assert cli.main(["lock", "status", write_inventory(tmp_path, "hosts = []\n")]) == 2


def test_no_import_cycle_and_no_old_module():
    for path in (ROOT / "src/nemofleet/fleet").glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m == "cli" or m.endswith(".cli") for m in mods), path
    assert not (ROOT / "src/nemofleet/rollout.py").exists()
    assert "pyinfra_bin" not in (ROOT / "src/nemofleet/fleet/driver.py").read_text()


# ---------------------------------------------------------------------------- no double rollback

class FakeHost:
    """Scripted answers for one host: release states before/after, the deploy, the gate."""

    def __init__(self, monkeypatch, states, deploy_rc=0, timed_out=False, healthy=(True,)):
        self.states, self.calls, self.healthy = list(states), [], list(healthy)
        monkeypatch.setattr(rollout, "read_state", lambda inv, h: self.states.pop(0) if len(self.states) > 1 else self.states[0])
        monkeypatch.setattr(driver, "run", self.run)
        monkeypatch.setattr(rollout, "gate", lambda *a, **k: (self.healthy.pop(0) if self.healthy else True, "gate"))
        monkeypatch.setattr(rollout, "rollback_host", lambda inv, h, expect=None, window=60: self.calls.append(("rollback", expect)) or (True, "rolled back"))
        monkeypatch.setattr(rollout, "audit", lambda inv, h, event, detail: self.calls.append(("audit", event, detail)))
        self.deploy_rc, self.timed_out = deploy_rc, timed_out

    def run(self, inventory, hosts, *args, **kw):
        self.calls.append(("deploy", kw.get("env")))
        out = f"    [{hosts[0]}] Connected\n" + ("" if self.deploy_rc == 0 else "preflight refused: image unknown\n")
        return Result(self.deploy_rc, "", out, timed_out=self.timed_out)


OLD, NEW = HostState("aaaaaaaaaaaa", "u1"), HostState("bbbbbbbbbbbb", "u2")


def test_refused_deploy_that_changed_nothing_is_not_rolled_back(monkeypatch):
    fake = FakeHost(monkeypatch, [OLD, OLD], deploy_rc=1)
    res, = rollout.deploy_unit("inv", ["h"], {}, 60, {"NEMOFLEET_LOCK_TOKEN": "t"})
    assert res.result == "failed" and "nothing to roll back" in res.detail
    assert not [c for c in fake.calls if c[0] == "rollback"]
    assert fake.calls[0] == ("deploy", {"NEMOFLEET_LOCK_TOKEN": "t"})
    assert fake.calls[-1] == ("audit", "rollout", "aaaaaaaaaaaa -> aaaaaaaaaaaa: failed")


def test_failed_gate_on_an_unchanged_release_is_not_rolled_back(monkeypatch):
    fake = FakeHost(monkeypatch, [OLD, OLD, OLD], healthy=(False,))
    res, = rollout.deploy_unit("inv", ["h"], {}, 60, {})
    assert res.result == "failed" and not [c for c in fake.calls if c[0] == "rollback"]


def test_changed_host_that_fails_the_gate_goes_back_to_the_release_it_replaced(monkeypatch):
    fake = FakeHost(monkeypatch, [OLD, NEW, NEW, OLD], healthy=(False, True))
    res, = rollout.deploy_unit("inv", ["h"], {}, 60, {})
    assert ("rollback", "aaaaaaaaaaaa") in fake.calls and res.result == "rolled back" and res.new == "aaaaaaaaaaaa"


def test_units_changed_without_a_new_record_still_rolls_back(monkeypatch):
    fake = FakeHost(monkeypatch, [OLD, HostState("aaaaaaaaaaaa", "u9"), OLD], deploy_rc=1)
    res, = rollout.deploy_unit("inv", ["h"], {}, 60, {})
    assert ("rollback", "aaaaaaaaaaaa") in fake.calls and res.result == "rolled back"


def test_timed_out_deploy_rolls_back_and_audits(monkeypatch):
    fake = FakeHost(monkeypatch, [OLD, NEW, OLD], deploy_rc=124, timed_out=True)
    res, = rollout.deploy_unit("inv", ["h"], {}, 60, {})
    assert res.result == "rolled back" and "deploy timed out" in res.detail
    assert fake.calls[-1][0] == "audit"


def test_rollout_halts_after_the_budget_and_leaves_the_rest_untouched(monkeypatch):
    monkeypatch.setattr(driver, "serving_hosts", lambda inv, limit=None: ["a", "b", "c"])
    monkeypatch.setattr(driver, "group_units", lambda inv, hosts: [[h] for h in hosts])  # no serving group
    monkeypatch.setattr(driver, "host_data", lambda inv, limit=None: {})  # read for the weights fan-out
    monkeypatch.setattr(driver, "exec_all", lambda inv, hosts, script, timeout=0, env=None:
                        {h: Exec(h, 0, "state=ACQUIRED" if lock_action(script) == "acquire" else "state=REFRESHED"
                                 if lock_action(script) == "refresh" else "state=RELEASED") for h in hosts})
    seen = []

    def deploy(inv, members, data, window, env, log=print, session=None):
        h, = members
        seen.append(h)
        return [rollout.HostResult(h, "x", "x", "ok" if h == "a" else "rolled back")]
    monkeypatch.setattr(rollout, "deploy_unit", deploy)
    o = rollout.rollout("inv", canary=1, batch="1", log=lambda *_: None)
    assert seen == ["a", "b"] and o.halted and "halted after batch 1" in o.reason
    assert [r.result for r in o.results] == ["ok", "rolled back", "not reached"] and not o.ok


# ---------------------------------------------------------------------------- serving groups (one unit)

GROUP_DATA = {"h1": {}, "g1": {"serving_group": "g", "serving_group_members": ["g1", "g2"]},
              "g2": {"serving_group": "g", "serving_group_members": ["g1", "g2"]}, "h2": {}}


def test_group_units_keep_a_serving_group_together_and_refuse_half_of_one(monkeypatch):
    monkeypatch.setattr(driver, "host_data", lambda inv, limit=None: GROUP_DATA)
    assert driver.group_units("inv", ["h1", "g2", "g1", "h2"]) == [["h1"], ["g1", "g2"], ["h2"]]
    with pytest.raises(driver.FleetError, match=r"takes g1 but not g2 of serving group g: .*--limit g1,g2"):
        driver.group_units("inv", ["h1", "g1"])


def test_rollout_batches_count_a_group_as_one_unit(monkeypatch):
    monkeypatch.setattr(driver, "serving_hosts", lambda inv, limit=None: ["h1", "g1", "g2", "h2"])
    monkeypatch.setattr(driver, "host_data", lambda inv, limit=None: GROUP_DATA)
    monkeypatch.setattr(driver, "exec_all", lambda inv, hosts, script, timeout=0, env=None:
                        {h: Exec(h, 0, "state=ACQUIRED" if lock_action(script) == "acquire" else "state=REFRESHED"
                                 if lock_action(script) == "refresh" else "state=RELEASED") for h in hosts})
    seen = []
    monkeypatch.setattr(rollout, "deploy_unit", lambda inv, m, *a, **k: seen.append(m) or [rollout.HostResult(h, result="ok") for h in m])
    o = rollout.rollout("inv", canary=1, batch="1", log=lambda *_: None)
    assert seen == [["h1"], ["g1", "g2"], ["h2"]] and o.ok


def test_failed_group_gate_rolls_back_every_changed_member_together(monkeypatch):
    states = {"g1": [OLD, NEW, NEW, OLD], "g2": [OLD, NEW, NEW, OLD]}
    calls = []
    monkeypatch.setattr(rollout, "read_state", lambda inv, h: states[h].pop(0) if len(states[h]) > 1 else states[h][0])
    monkeypatch.setattr(driver, "run", lambda inv, hosts, *a, **k: calls.append(("deploy", tuple(hosts))) or Result(0, "", ""))
    gates = [False, True]
    monkeypatch.setattr(rollout, "gate", lambda inv, h, *a, **k: calls.append(("gate", h)) or (gates.pop(0), "g"))
    monkeypatch.setattr(rollout, "rollback_host", lambda inv, h, expect=None, window=60: calls.append(("rollback", h, expect)) or (True, "back"))
    monkeypatch.setattr(rollout, "audit", lambda *a: None)
    res = rollout.deploy_unit("inv", ["g1", "g2"], {}, 60, {})
    assert calls[0] == ("deploy", ("g1", "g2")) and calls[1] == ("gate", "g1")  # one deploy, the head gated first
    assert {c for c in calls if c[0] == "rollback"} == {("rollback", "g1", OLD.release), ("rollback", "g2", OLD.release)}
    assert [r.result for r in res] == ["rolled back", "rolled back"] and calls[-1] == ("gate", "g1")


# ---------------------------------------------------------------------------- lock decisions

def test_lock_refusal_names_holder_and_the_way_out():
    info = {"holder": "alice@ctl", "since": "2026-12-03T10:00:00Z", "token_sha256": commands.token_digest("t1"),
            "expires": 2000, "message": "drain"}
    why = lock_refusal(info, None, 1000)
    assert "locked by alice@ctl since 2026-12-03T10:00:00Z (drain)" in why
    assert "nemofleet lock status" in why and "nemofleet lock release --force" in why
    assert lock_refusal(info, "t1", 1000) is None  # the rollout's own deploy
    assert lock_refusal(info, "t2", 1000) is not None
    assert lock_refusal(info, None, 3000) is None  # expired
    assert lock_refusal(None, None, 1000) is None


def test_deploy_lock_fact_parses_the_status_script():
    fact = DeployLock()
    assert fact.command() == commands.lock_status()
    assert fact.process(["state=FREE", "now=5"]) is None
    info = fact.process(["state=HELD", "holder=a@b", "since=s", "expires=9", "message=m", "token_sha256=x", "now=5"])
    assert info == {"holder": "a@b", "since": "s", "expires": 9, "message": "m", "token_sha256": "x", "now": 5}


def test_acquire_gives_back_what_it_took_when_one_host_is_held(monkeypatch):
    calls = []

    def exec_all(inv, hosts, script, timeout=0, env=None):
        calls.append((script.split("\n")[0][:20], list(hosts)))
        if lock_action(script) == "acquire":
            return {"a": Exec("a", 0, "state=ACQUIRED"), "b": Exec("b", 0, "state=HELD\nholder=alice@x\nsince=T")}
        return {h: Exec(h, 0, "state=RELEASED") for h in hosts}
    monkeypatch.setattr(driver, "exec_all", exec_all)
    monkeypatch.delenv("NEMOFLEET_LOCK_TOKEN", raising=False)
    with pytest.raises(lock.LockHeld, match=r"b is locked by alice@x since T; wait for it"):
        lock.acquire("inv", ["a", "b"], "m")
    assert calls[-1][1] == ["a"]  # released on a only


# ---------------------------------------------------------------------------- host keys

def hk(known=True, matches=False):
    return rebuild.HostKey("[127.0.0.1]:2222", "/nonexistent/kh", "k ssh-ed25519 AAAA", "SHA256:new", known, matches)


def test_changed_host_key_refused_without_accept():
    with pytest.raises(rebuild.RebuildError, match="--accept-new-host-key"):
        rebuild.trust_host_key(hk(), "h", False, None, False)


def test_accept_without_expected_fingerprint_prints_it_and_refuses_unless_yes():
    with pytest.raises(rebuild.RebuildError, match="SHA256:new.*--expect-host-key SHA256:new"):
        rebuild.trust_host_key(hk(), "h", True, None, False)


def test_expected_fingerprint_mismatch_refused_before_trusting():
    with pytest.raises(rebuild.RebuildError, match="not the expected SHA256:other"):
        rebuild.trust_host_key(hk(), "h", True, "SHA256:other", True)


def test_unchanged_key_needs_nothing():
    assert "unchanged" in rebuild.trust_host_key(hk(matches=True), "h", False, None, False)


def test_matching_expected_fingerprint_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    key = rebuild.HostKey("[127.0.0.1]:2222", str(tmp_path / "kh"), "[127.0.0.1]:2222 ssh-ed25519 AAAA\n",
                          "SHA256:new", True, False)
    assert "matches the expected fingerprint" in rebuild.trust_host_key(key, "h", True, "SHA256:new", False)
    assert (tmp_path / "kh").read_text() == "[127.0.0.1]:2222 ssh-ed25519 AAAA\n"


def test_gateway_hosts_are_not_rolled_out_and_selecting_only_them_is_refused(monkeypatch):
    monkeypatch.setattr(driver, "host_groups", lambda inv, limit=None: {"gw": ["gateway"], "a": ["gpu_h100"]}
                        if not limit else {"gw": ["gateway"]})
    assert driver.serving_hosts("inv") == ["a"]
    with pytest.raises(driver.FleetError, match="all in the gateway group: they serve no model"):
        driver.serving_hosts("inv", ["gw"])


# ---------------------------------------------------------------------------- weights fan-out in a rollout

SEEDED = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "c" * 40},
          "weights_seed_key": "-----BEGIN X-----\nk\n-----END X-----", "weights_seed_public_key_file": None}


def _fan_rollout(monkeypatch, names, holds=(), fail=(), datas=None, **kw):
    from nemofleet import fanout

    pub = {"weights_seed_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFy02I2mbKJF+J/uLS5Tm25gylWlotT5MStmUt3NAvDu fleet"}
    monkeypatch.setattr(rollout.spec, "read_secrets",
                        lambda d: rollout.spec.typed_secrets({**d, **pub} if "weights_seed_key" in d else {}))
    monkeypatch.setattr(driver, "serving_hosts", lambda inv, limit=None: [n for n in names if not limit or n in limit])
    monkeypatch.setattr(driver, "group_units", lambda inv, hosts: [[h] for h in hosts])
    monkeypatch.setattr(driver, "host_data", lambda inv, limit=None: datas or {n: dict(SEEDED, weights_peer_address=f"nf-{n}")
                                                                                  for n in names})
    probes = []

    def exec_all(inv, hosts, script, timeout=0, env=None):
        if "nemofleet-complete" in script:
            probes.append(script)
            sp = rollout.spec.read("h", SEEDED)  # its secrets as read_secrets above gives them
            d = fanout.weights_dir(sp, fanout.wanted(sp))
            return {h: Exec(h, 0, f"{fanout.HELD_MARK}{d}" if h in holds else "") for h in hosts}
        return {h: Exec(h, 0, "state=ACQUIRED" if lock_action(script) == "acquire" else "state=REFRESHED"
                        if lock_action(script) == "refresh" else "state=RELEASED") for h in hosts}
    monkeypatch.setattr(driver, "exec_all", exec_all)
    calls = []

    def deploy(inv, members, data, window, env, log=print, session=None):
        h, = members
        calls.append((h, data.get("weights_seed_from")))
        return [rollout.HostResult(h, "x", "y", "failed" if h in fail else "ok")]
    monkeypatch.setattr(rollout, "deploy_unit", deploy)
    lines = []
    o = rollout.rollout("inv", log=lines.append, **kw)
    return o, calls, lines, probes


def _sources(calls):
    import json

    return {h: [p["host"] for p in json.loads(v)] if v else None for h, v in calls}


def test_rollout_fetches_once_and_every_other_host_copies_in_a_tree(monkeypatch):
    import json

    names = [f"h{i}" for i in range(1, 9)]
    o, calls, lines, probes = _fan_rollout(monkeypatch, names, batch="100%")
    assert o.ok and len(probes) == 1  # the holders are read in the reachability probe
    src = _sources(calls)
    assert sorted(src) == names and [h for h, v in src.items() if v is None] == ["h1"]  # one origin fetch
    assert src["h2"] == ["nf-h1"] and src["h3"] == ["nf-h1", "nf-h2"] and len(src["h8"]) == 3
    assert all(f"nf-{h}" not in v for h, v in src.items() if v)
    assert all(p["wait"] == 600 for _, v in calls if v for p in json.loads(v))  # a source may still be fetching
    assert "  weights: h2: copies nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@cccccccccccc from h1, " \
           "then the origin (step 1)" in lines


def test_canary_fetches_a_failed_host_is_never_a_source_and_limit_is_honoured(monkeypatch):
    names = ["h1", "h2", "h3", "h4"]
    # the canary fetches from the origin; the next batch copies from it
    o, calls, _, _ = _fan_rollout(monkeypatch, names, canary=1, batch="100%")
    assert _sources(calls) == {"h1": None, "h2": ["nf-h1"], "h3": ["nf-h1", "nf-h2"], "h4": ["nf-h2", "nf-h1"]}
    # one host per batch: h2 fails its deploy, so no later host names it
    o, calls, _, _ = _fan_rollout(monkeypatch, names, fail=("h2",), batch="1", max_failures=1)
    src = _sources(calls)
    assert src["h1"] is None and src["h2"] == ["nf-h1"] and all("nf-h2" not in src[h] for h in ("h3", "h4"))
    # --limit: only the selected hosts are probed and deployed (h1, a holder, is outside the run)
    o, calls, _, _ = _fan_rollout(monkeypatch, names, holds=("h1",), limit=["h3", "h4"], batch="100%")
    assert _sources(calls) == {"h3": None, "h4": ["nf-h3"]}
    # a fleet that already holds the commit on h1: nobody fetches from the origin
    o, calls, _, _ = _fan_rollout(monkeypatch, names, holds=("h1",), batch="100%")
    src = _sources(calls)
    assert src["h1"] is None and all(src[h] for h in ("h2", "h3", "h4")) and src["h2"][0] == "nf-h1"


def test_no_seed_key_or_fanout_off_deploys_as_before(monkeypatch):
    names = ["h1", "h2", "h3"]
    plain = {n: {"model": SEEDED["model"]} for n in names}
    o, calls, _, probes = _fan_rollout(monkeypatch, names, datas=plain, batch="100%")
    assert calls == [(n, None) for n in names] and probes == []
    off = {n: dict(SEEDED, weights_fanout=False) for n in names}
    o, calls, _, _ = _fan_rollout(monkeypatch, names, datas=off, batch="100%")
    assert calls == [(n, None) for n in names]


def test_run_data_is_read_as_pyinfra_reads_it(monkeypatch):
    # `--data model={"catalog": ..., "revision": ...}` and `--data weights_fanout=false` arrive as text
    import json

    names = ["h1", "h2"]
    other = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "d" * 40}
    o, calls, lines, _ = _fan_rollout(monkeypatch, names, batch="100%", data={"model": json.dumps(other)})
    assert _sources(calls) == {"h1": None, "h2": ["nf-h1"]} and any("@dddddddddddd" in ln for ln in lines)
    o, calls, _, _ = _fan_rollout(monkeypatch, names, batch="100%", data={"weights_fanout": "false"})
    assert _sources(calls) == {"h1": None, "h2": None}


# ---------------------------------------------------------------------------- the canary gate (issue 38)

from nemofleet import canary as gate_math  # noqa: E402
from test_canary import vllm_text  # noqa: E402  recorded /metrics samples under vLLM's names

GPUS = {"a": "NVIDIA A100-SXM4-80GB", "b": "NVIDIA H100 80GB HBM3", "c": "NVIDIA H100 80GB HBM3"}


class FakeFleet:
    """Hosts a, b, c behind a fake kept session: each read of a host's metrics adds `rate`
    requests to its counters (with `errors_every` failing and `ttft`/`e2e` latencies, as the
    release it runs serves), and records every call."""

    def __init__(self, monkeypatch, serve, rate=30):
        self.serve, self.rate, self.calls, self.n = serve, rate, [], {}
        self.release = {h: "old" for h in GPUS}
        monkeypatch.setattr(driver, "serving_hosts", lambda inv, limit=None: list(GPUS))
        monkeypatch.setattr(driver, "group_units", lambda inv, hosts: [[h] for h in hosts])
        monkeypatch.setattr(driver, "host_data", lambda inv, limit=None: {})
        monkeypatch.setattr(driver, "exec_all", lambda inv, hosts, script, timeout=0, env=None:
                            {h: Exec(h, 0, "state=ACQUIRED" if lock_action(script) == "acquire" else "state=REFRESHED"
                                     if lock_action(script) == "refresh" else "state=RELEASED") for h in hosts})
        monkeypatch.setattr(driver, "Session", lambda inv, hosts: self)
        monkeypatch.setattr(rollout, "audit", lambda inv, h, event, detail: self.calls.append(("audit", h, event, detail)))
        monkeypatch.setattr(rollout, "deploy_unit", self.deploy)
        monkeypatch.setattr(rollout, "rollback_host", self.rollback)
        monkeypatch.setattr(rollout, "gate", lambda *a, **k: (True, "healthy"))
        monkeypatch.setattr(rollout, "read_state", lambda inv, h: HostState(self.release[h], "u"))

    def deploy(self, inv, members, data, window, env, log=print, session=None):
        h, = members
        self.calls.append(("deploy", h))
        self.release[h], self.n[h] = "new", 0  # the new instance's counters start at zero
        return [rollout.HostResult(h, "old", "new", "ok")]

    def rollback(self, inv, h, expect=None, window=60):
        self.calls.append(("rollback", h, expect))
        self.release[h], self.n[h] = expect, 0
        return True, "rolled back"

    def run(self, host, script, timeout=60):
        if script == commands.release_read():
            return Exec(host, 0, f"id={self.release[host]}")
        self.n[host] = self.n.get(host, 0) + self.rate
        n = self.n[host]
        err_every, ttft, e2e = self.serve[self.release[host]]
        errors = n // err_every if err_every else 0
        text = vllm_text(ok=n - errors, errors=errors, ttft=[ttft] * (n - errors), e2e=[e2e] * (n - errors))
        return Exec(host, 0, f"@@gpu {GPUS[host]}\n@@instance nemotron-0\n{text}")

    def close(self):
        self.calls.append(("close",))


SERVE = {"old": (0, 0.1, 0.2), "new": (0, 0.1, 0.2), "slow": (0, 0.5, 1.0), "flaky": (20, 0.1, 0.2)}


def fake_clock(monkeypatch):
    """The bake's clock and sleep: a sleep moves the clock, nothing waits."""
    now = [0.0]
    monkeypatch.setattr(rollout, "_now", lambda: now[0])
    monkeypatch.setattr(rollout.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))


def run_rollout(monkeypatch, new="new", **kw):
    fleet = FakeFleet(monkeypatch, {**SERVE, "new": SERVE[new]})
    fake_clock(monkeypatch)
    lines = []
    o = rollout.rollout("inv", canary=1, batch="1", log=lines.append, bake_seconds=kw.pop("bake", 10),
                        slo=kw.pop("slo", gate_math.Slo()), **kw)
    return o, fleet, lines


def test_flaky_canary_is_rolled_back_and_the_rest_never_touched(monkeypatch):
    o, fleet, lines = run_rollout(monkeypatch, "flaky")
    assert o.result == "rolled_back" and o.halted and not o.ok
    assert [c for c in fleet.calls if c[0] in ("deploy", "rollback")] == [("deploy", "a"), ("rollback", "a", "old")]
    assert [r.result for r in o.results] == ["rolled back", "not reached", "not reached"]
    b = o.batches[0]
    assert b["verdict"] == "fail" and b["slo"] == "error rate" and "canary 5.00% vs baseline 0.00%" in b["reason"]
    assert b["baseline"]["hosts"] == ["b", "c"] and b["baseline"]["kind"].startswith("hosts still on the old release")
    audit = [c for c in fleet.calls if c[0] == "audit" and c[2] == "canary"]
    assert audit and audit[0][3].startswith("fail: error rate") and "baseline (" in audit[0][3]
    doc = o.to_json()
    assert doc["result"] == "rolled_back" and doc["hosts"]["a"] == {**doc["hosts"]["a"], "from": "old", "to": "old",
                                                                     "result": "rolled back", "canary": True}
    assert doc["hosts"]["b"]["canary"] is False and json_round_trip(doc)
    assert any(ln.startswith("  bake ") and "| baseline" in ln for ln in lines)
    assert fleet.calls[-1] == ("close",)  # the kept connections are closed


def json_round_trip(doc):
    import json

    return json.loads(json.dumps(doc)) == doc


def test_slow_canary_breaks_the_latency_slo(monkeypatch):
    o, fleet, _ = run_rollout(monkeypatch, "slow")
    assert o.result == "rolled_back" and o.batches[0]["slo"] == "p95 TTFT"
    assert "canary 0.4" in o.reason and "baseline 0.09" in o.reason


def test_good_release_goes_everywhere_the_last_batch_judged_on_its_own_window(monkeypatch):
    o, fleet, _ = run_rollout(monkeypatch, "new")
    assert o.result == "ok" and o.ok and [r.result for r in o.results] == ["ok", "ok", "ok"]
    assert [b["verdict"] for b in o.batches] == ["pass", "pass", "pass"]
    # a is an A100 and no old host is: all old hosts; b's baseline is c (same GPU class and model)
    assert o.batches[0]["baseline"]["hosts"] == ["b", "c"] and o.batches[1]["baseline"]["hosts"] == ["c"]
    last = o.batches[2]["baseline"]
    assert last["hosts"] == [] and last["kind"].startswith("the same hosts' own")


def test_thin_traffic_wait_then_fail_pass_or_fail_at_once(monkeypatch):
    # the canary gets little traffic while the baseline (b, c: 3 reads a bake step) is busy
    slo = gate_math.Slo(min_requests=100)
    real_run = FakeFleet.run
    monkeypatch.setattr(FakeFleet, "run", lambda self, h, script, timeout=60: real_run(self, h, script, timeout)
                        if h != "a" or self.release[h] != "new" else
                        Exec(h, 0, "@@gpu x\n@@instance nemotron-0\n" + vllm_text(ok=1, ttft=[0.1], e2e=[0.2])))
    o, fleet, lines = run_rollout(monkeypatch, "new", slo=slo)
    assert o.result == "rolled_back" and "too few requests" in o.reason and "--on-thin-traffic wait" in o.reason
    waited = o.batches[0]["seconds"]
    assert waited >= 20  # twice the 10 s bake
    monkeypatch.setattr(FakeFleet, "run", real_run)
    # the whole fleet idle: passed unjudged at the bake's end
    o, _, _ = run_rollout(monkeypatch, "new", slo=gate_math.Slo(min_requests=10_000))
    assert o.result == "ok" and "the fleet is idle: passed unjudged" in o.batches[0]["reason"]
    assert o.batches[0]["seconds"] < 20
    o, _, _ = run_rollout(monkeypatch, "new", slo=gate_math.Slo(min_requests=10_000, on_thin="pass"))
    assert o.result == "ok" and "passed by --on-thin-traffic pass" in o.batches[0]["reason"]
    o, _, _ = run_rollout(monkeypatch, "new", slo=gate_math.Slo(min_requests=10_000, on_thin="fail"))
    assert o.result == "rolled_back" and o.batches[0]["seconds"] < waited


def test_bake_zero_is_the_health_gate_alone(monkeypatch):
    o, fleet, _ = run_rollout(monkeypatch, "flaky", bake=0)
    assert o.result == "ok" and all(b["verdict"].startswith("not baked") for b in o.batches)


def test_pause_after_canary_promote_or_abort(monkeypatch):
    asked = []
    o, fleet, _ = run_rollout(monkeypatch, "new", pause_after_canary=True, ask=lambda q: asked.append(q) or "promote\n")
    assert o.result == "ok" and len(asked) == 1 and "promote" in asked[0]
    o, fleet, _ = run_rollout(monkeypatch, "new", pause_after_canary=True, ask=lambda q: "abort")
    assert o.result == "rolled_back" and "aborted after the canary" in o.reason
    assert [c for c in fleet.calls if c[0] == "deploy"] == [("deploy", "a")]


def test_ctrl_c_during_a_batch_rolls_it_back_and_releases_the_lock(monkeypatch):
    released = []
    fleet = FakeFleet(monkeypatch, SERVE)
    fake_clock(monkeypatch)
    real_release = lock.release
    monkeypatch.setattr(lock, "release", lambda held, log=print: released.append(True) or real_release(held, log=log))

    def deploy(inv, members, data, window, env, log=print, session=None):
        fleet.release[members[0]] = "new"  # the deploy changed the host, then the operator pressed Ctrl-C
        raise KeyboardInterrupt
    monkeypatch.setattr(rollout, "deploy_unit", deploy)
    o = rollout.rollout("inv", canary=1, batch="1", log=lambda *_: None, bake_seconds=10)
    assert o.interrupted and o.result == "halted" and "interrupted (Ctrl-C)" in o.reason
    assert ("rollback", "a", "old") in fleet.calls and o.results[0].result == "rolled back"
    assert released == [True]
    import signal
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_heartbeat_never_silent_over_ten_seconds_on_a_fake_clock():
    now = [0.0]
    lines = []
    beat = driver.Heartbeat(lines.append, "a: deploying", clock=lambda: now[0])
    stamps = []
    for step in range(600):  # 600 s of a deploy, the loop ticking every second, a stage now and then
        now[0] = float(step)
        if step in (3, 4, 250):
            beat.set(f"stage {step}")
        before = len(lines)
        beat.beat()
        if len(lines) > before or step in (3, 4, 250):
            stamps.append(now[0])
    gaps = [b - a for a, b in zip([0.0] + stamps, stamps)]
    assert max(gaps) <= 10 and "a: deploying: stage 4 (4s)" in lines[1]


def test_deploy_stages_are_read_from_pyinfras_output():
    assert driver.stage_of("--> Starting operation: nemofleet serving | Reload systemd for x.service ") == "nemofleet serving"
    assert driver.stage_of("--> Connecting to hosts...") == "Connecting to hosts..."
    assert driver.stage_of("    [a100-1] Success") is None


def test_a_port_not_open_yet_is_starting_not_unhealthy():
    text = ("instance nemotron-0 UNHEALTHY: /health returned 000 (failure 2)\n"
            "instance nemotron-1 UNHEALTHY: /health returned 503 (failure 1)")
    got = rollout.gate_detail(text)
    assert "nemotron-0 starting (port not open yet)" in got and "nemotron-1 UNHEALTHY: /health returned 503" in got


def test_status_shows_the_last_canary_verdict():
    from nemofleet.fleet import status

    lines = ["canary 2026-12-05T19:14:01Z bob@ctl canary fail: error rate: canary 5.00% vs baseline 0.00%"]
    assert status.canary_line(lines) == ["last canary gate 2026-12-05T19:14:01Z by bob@ctl: fail: error rate: "
                                         "canary 5.00% vs baseline 0.00%"]
    assert status.canary_line(["canary nothing"]) == []


def test_the_gate_figures_of_an_idle_window_say_dash_not_none():
    # the words the audit log and status give a verdict's figures (canary.figures_text, as the bake prints them)
    from nemofleet.canary import figures_text

    assert figures_text({"requests": 0, "error_rate_pct": None, "p95_ttft_s": None, "p95_e2e_s": None}) == \
        "0 req, - errors, p95 TTFT - e2e -"
    assert figures_text({"requests": 4, "error_rate_pct": 0.0, "p95_ttft_s": 0.2425, "p95_e2e_s": 0.2951}) == \
        "4 req, 0.0% errors, p95 TTFT 0.24s e2e 0.30s"


@pytest.mark.parametrize("value", ["+Inf", "1e400", "garbage"])
def test_a_canary_whose_metrics_cannot_be_read_is_rolled_back(monkeypatch, value):
    """The gate fails closed: an error counter of +Inf (or 1e400, or text) on the canary is no
    pass: the batch is rolled back and the rollout halts (with its JSON), never left unjudged."""
    served = FakeFleet.run

    def run(self, host, script, timeout=60):
        e = served(self, host, script, timeout)
        if host == "a" and self.release[host] == "new" and "@@instance" in e.text:
            e = Exec(host, 0, e.text + '\nhttp_requests_total{handler="/v1/chat/completions",method="POST",'
                                       f'status="5xx"}} {value}')
        return e

    monkeypatch.setattr(FakeFleet, "run", run)
    o, fleet, _ = run_rollout(monkeypatch)
    assert o.result == "rolled_back" and o.halted and ("rollback", "a", "old") in fleet.calls
    assert o.batches[0]["slo"] == "metrics" and "cannot read" in o.batches[0]["reason"] and json_round_trip(o.to_json())


def test_a_gate_that_raises_rolls_the_batch_back(monkeypatch):
    monkeypatch.setattr(rollout, "bake", lambda *a, **k: {}["no such figure"])
    o, fleet, _ = run_rollout(monkeypatch)
    assert o.result == "rolled_back" and ("rollback", "a", "old") in fleet.calls
    assert o.batches[0]["reason"] == "the gate could not judge the batch (KeyError)" and json_round_trip(o.to_json())
