"""The gateway during a rollout (issue 49 items 1 and 2): the runtime-API program against a fake
HAProxy socket, its answer parsed totally, and the rollout's order -- drain before a host changes,
ready after its gate, the canary at its weight while it bakes, a leftover drain put back, an
unreachable gateway refused before any host changes."""
import json
import os
import shlex
import socket
import subprocess
import sys
import threading

import pytest
from pyinfra_cli.util import parse_cli_arg  # noqa: F401  imported before a test's fake clock (as the rollout does)

from nemofleet import canary as gate_math
from nemofleet import remote
from nemofleet.fleet import driver, gateway, rollout
from nemofleet.fleet.driver import Exec, FleetError
from test_fleet_rollout import SERVE, FakeFleet, fake_clock

HEAD = ("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
        "srv_time_since_last_change")
STAT = "# pxname,svname,qcur,qmax,scur,smax,status,weight"


class FakeHaproxy(threading.Thread):
    """A unix socket answering the runtime API's commands the program uses, over `servers`
    {name: [admin, weight, scur]}; each scur falls by one per `show stat` (requests finishing)."""

    def __init__(self, path, servers):
        super().__init__(daemon=True)
        self.path, self.servers, self.commands = path, servers, []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(8)

    def answer(self, cmd):
        self.commands.append(cmd)
        if cmd.startswith("show servers state"):
            return "1\n" + HEAD + "\n" + "".join(f"3 vllm {i} {n} 10.0.0.{i} 2 {s[0]} {s[1]} 100 5\n"
                                                 for i, (n, s) in enumerate(self.servers.items(), 1))
        if cmd == "show stat":
            for s in self.servers.values():
                s[2] = max(0, s[2] - 1)
            return STAT + "\n" + "".join(f"vllm,{n},0,0,{s[2]},0,UP,{s[1]}\n" for n, s in self.servers.items())
        _, _, target, what, value = cmd.split()
        s = self.servers[target.split("/")[1]]
        if what == "state":
            s[0] = 8 if value == "drain" else 0
        else:
            s[1] = 100 if value == "100%" else int(value)
        return ""

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                line = conn.makefile().readline().strip()
                conn.sendall("".join(self.answer(c) for c in line.split(";")).encode())


def program(sock, state, *args):
    argv = remote.argv("haproxy_api", sock, "vllm", state, 20, *args)
    return subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60)


def test_the_program_drains_waits_for_requests_in_flight_saves_the_state_and_readies(tmp_path):
    fake = FakeHaproxy(str(tmp_path / "s"), {"a100-1": [0, 100, 3], "h200-1": [0, 100, 0]})
    fake.start()
    state = str(tmp_path / "state")
    r = program(fake.path, state, "drain", "a100-1")
    assert r.returncode == 0, r.stderr
    got = gateway.parse(r.stdout.splitlines())
    assert got["a100-1"].drained and got["a100-1"].scur == 0 and not got["h200-1"].drained
    assert "set server vllm/a100-1 state drain" in fake.commands
    assert open(state).read().startswith("1\n# be_id")  # `show servers state`, loaded at a reload
    r = program(fake.path, state, "weight", "22", "a100-1")
    got = gateway.parse(r.stdout.splitlines())
    assert r.returncode == 0 and got["a100-1"].weight == 22 and not got["a100-1"].drained
    got = gateway.parse(program(fake.path, state, "ready", "a100-1").stdout.splitlines())
    assert got["a100-1"].weight == 100 and not got["a100-1"].drained
    # a name that is not one plain word is refused before anything changes; an unknown one is left alone
    n = len(fake.commands)
    r = program(fake.path, state, "drain", "a100-1;shutdown sessions")
    assert r.returncode == 1 and "is not a plain server name" in r.stderr and len(fake.commands) == n
    assert program(fake.path, state, "drain", "no-such").returncode == 0
    r = program(str(tmp_path / "none"), state, "show")
    assert r.returncode == 1 and r.stderr.startswith("the gateway's runtime API did not answer")
    assert "Traceback" not in r.stderr
    fake.sock.close()


@pytest.mark.parametrize("lines", [["server a op=2 admin=8 weight=x scur=0"], ["server a op=2"], ["\x00" * 9],
                                   ["server a op=2 admin=8 weight=100 scur=99999999999999999999"], [None, 5]])
def test_a_bad_answer_reads_as_no_server(lines):
    assert gateway.parse(lines) == {}


def test_canary_weight_gives_its_share():
    assert gateway.canary_weight(0.10, 1, 3) == 22  # 22 / (22 + 200) = 9.9 %
    assert gateway.canary_weight(0.50, 1, 3) == 100 and gateway.canary_weight(0.10, 2, 10) == 44  # never above a full host
    assert gateway.canary_weight(0.10, 1, 1) == gateway.FULL  # no other server: nothing to shift
    assert gateway.canary_weight(0.001, 1, 2) == 1
    assert gateway.min_requests(50, 22) == 11 and gateway.min_requests(50, 100) == 50 and gateway.min_requests(50, 1) == 10


class GatewayFleet(FakeFleet):
    """FakeFleet with a gateway host gw in front of a, b, c: the runtime-API calls are recorded
    in order with the hosts' deploys and rollbacks."""

    def __init__(self, monkeypatch, serve, left=None, down=False):
        super().__init__(monkeypatch, serve)
        self.srv = {h: [0, 100] for h in ("a", "b", "c")}
        self.srv.update(left or {})
        self.down = down
        monkeypatch.setattr(gateway, "gateway_hosts", lambda inv: ["gw"])
        monkeypatch.setattr(driver, "host_specs", lambda inv, limit=None: {})

    def run(self, host, script, timeout=60):
        if host != "gw":
            return super().run(host, script, timeout)
        if self.down:
            return Exec(host, 1, "the gateway's runtime API did not answer: No such file or directory")
        argv = shlex.split(script)
        action, args = argv[9], argv[10:]
        if action == "weight":
            w, args = int(args[0]), args[1:]
        for h in args:
            self.srv[h] = {"drain": [8, self.srv[h][1]], "ready": [0, 100], "weight": [0, w if action == "weight" else 0]
                           }[action]
        if action != "show":
            self.calls.append((action, *args) if action != "weight" else ("weight", w, *args))
        return Exec(host, 0, "\n".join(f"server {h} op=2 admin={a} weight={w_} scur=0" for h, (a, w_) in self.srv.items()))


def gw_rollout(monkeypatch, new="new", steps=(0.10,), **kw):
    fleet = GatewayFleet(monkeypatch, {**SERVE, "new": SERVE[new]}, **kw)
    fake_clock(monkeypatch)
    lines = []
    o = rollout.rollout("inv", canary=1, batch="1", log=lines.append, bake_seconds=10, canary_steps=steps,
                        slo=gate_math.Slo(min_requests=20))
    return o, [c for c in fleet.calls if c[0] != "audit" and c[0] != "close"], lines


def test_each_batch_is_drained_before_it_changes_and_the_canary_bakes_at_its_weight(monkeypatch):
    o, calls, lines = gw_rollout(monkeypatch)
    assert o.result == "ok", o.reason
    assert calls == [("drain", "a"), ("deploy", "a"), ("weight", 22, "a"), ("ready", "a"),
                     ("drain", "b"), ("deploy", "b"), ("ready", "b"), ("drain", "c"), ("deploy", "c"), ("ready", "c")]
    step = o.batches[0]["steps"]
    assert step == [{"share": 0.1, "weight": 22, "seconds": step[0]["seconds"], "verdict": "pass",
                     "canary_requests": o.batches[0]["canary_figures"]["requests"]}]
    assert any("10% of the gateway's requests (weight 22 of 100), judged once it served 10 requests" in ln
               for ln in lines)
    assert json.loads(json.dumps(o.to_json()))["batches"][0]["baseline_figures"]["requests"] > 0


def test_canary_steps_each_judged_a_bad_canary_rolled_back_drained_then_ready(monkeypatch):
    o, calls, _ = gw_rollout(monkeypatch, "flaky", steps=(0.10, 0.25, 0.5))
    assert o.result == "rolled_back"
    assert calls == [("drain", "a"), ("deploy", "a"), ("weight", 22, "a"), ("drain", "a"), ("rollback", "a", "old"),
                     ("ready", "a")]
    o, calls, _ = gw_rollout(monkeypatch, "new", steps=(0.10, 0.25, 0.5))
    # 50 % of three hosts is more than a host's share: the canary is at full weight there
    assert [c for c in calls if c[0] == "weight"] == [("weight", 22, "a"), ("weight", 67, "a")]
    assert [s["weight"] for s in o.batches[0]["steps"]] == [22, 67, 100]
    assert [s["share"] for s in o.batches[0]["steps"]] == [0.1, 0.25, 0.5]


def test_a_leftover_drain_is_named_and_put_back_and_an_unreachable_gateway_refused(monkeypatch):
    o, calls, lines = gw_rollout(monkeypatch, left={"b": [8, 100], "c": [0, 22]})
    assert calls[0] == ("ready", "b", "c") and o.result == "ok"
    assert any("b, c left drained or at a canary weight by a run that stopped" in ln for ln in lines)
    with pytest.raises(FleetError, match="the gateway gw cannot be reached over its runtime API \\(gw: the gateway's "
                                         "runtime API did not answer: No such file or directory\\): no host was "
                                         "changed.*--no-gateway-drain"):
        gw_rollout(monkeypatch, down=True)


def test_no_gateway_drain_goes_on_without_it(monkeypatch):
    fleet = GatewayFleet(monkeypatch, SERVE, down=True)
    fake_clock(monkeypatch)
    lines = []
    o = rollout.rollout("inv", canary=1, batch="1", log=lines.append, bake_seconds=10, gateway_drain=False)
    assert o.result == "ok" and not [c for c in fleet.calls if c[0] in ("drain", "ready", "weight")]
    assert any("--no-gateway-drain: hosts are not drained at gw" in ln for ln in lines)
    assert any("the canary takes a full host's share" in ln for ln in lines)


def test_status_names_a_host_left_drained(monkeypatch):
    GatewayFleet(monkeypatch, SERVE, left={"b": [8, 100]})
    assert gateway.status_lines("inv", ["a", "b"]) == {"b": [
        "gateway gw: b is drained (a rollout that stopped left it so): the next `nemofleet rollout` or "
        "`nemofleet rollback` puts it back"]}
    GatewayFleet(monkeypatch, SERVE, down=True)
    assert gateway.status_lines("inv", ["a", "b"]) == {"": [
        "the gateway gw cannot be reached over its runtime API (gw: the gateway's runtime API did not answer: "
        "No such file or directory): hosts drained there are not shown"]}


def test_program_stays_within_the_prelude_rules():
    text = remote.source("haproxy_api")
    assert "def deadline(" in text and "def write_file(" in text  # the deadline and the state file's write
    assert os.path.basename(remote.argv("haproxy_api")[0]) == "python3"


@pytest.mark.parametrize("args, sentence", [
    (["--canary-weight", "0%"], "--canary-weight '0%' must be percentages from 1 to 99"),
    (["--canary-weight", "ten"], "--canary-weight 'ten' must be percentages from 1 to 99"),
    (["--canary-steps", "50,10"], "--canary-steps '50,10' must be percentages from 1 to 99 (at most 10 steps, each above"),
    (["--canary-steps", "10,10,20"], "--canary-steps '10,10,20' must be percentages"),
    (["--canary-steps", ",".join(map(str, range(1, 13)))], "--canary-steps '1,2,3,4,5,6,7,8,9,10,11,12' must be"),
    (["--canary-weight", "\u0661\u0660"], "--canary-weight '\u0661\u0660' must be percentages"),  # Arabic-Indic 10
])
def test_bad_canary_shares_are_refused_in_one_sentence(tmp_path, monkeypatch, capsys, args, sentence):
    from nemofleet import cli
    from test_fleet_rollout import write_inventory

    monkeypatch.chdir(tmp_path)
    assert cli.main(["rollout", write_inventory(tmp_path, "hosts = ['h1', 'h2']\n"), "--canary", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rollout refused: {sentence}") and len(err.strip().splitlines()) == 1, err
