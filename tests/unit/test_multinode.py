"""Multi-node serving groups (nemofleet.multinode): one model over several hosts on vLLM's own
distributed runtime. Plans per member, refusals with figures, the group's units and health
script, the inventory's serving_groups, golden desired states of a head and a worker."""
import json
import os
import shutil
import subprocess

import pytest

from opharness import verdict  # noqa: E402
from nemofleet import desired, factmodel, inventory, multinode, plan, preflight, render, settings
from test_desired import GOLDEN, REV, SECRETS, dump, facts

A100 = dict(name="NVIDIA A100-SXM4-80GB", mib=81920, cc="8.0", driver="570.195.03")
SVL = {"catalog": "nemotron-3.5-super-vl-bf16", "revision": REV}


def member(addr, gpus=4, rdma=(), **kw):
    f = facts(gpus=gpus, **{**A100, **kw})
    f["addresses"] = {"lo": ["127.0.0.1", "::1"], "eth0": [addr], "docker0": ["172.17.0.1"]}
    f["rdma"] = list(rdma)
    f["disk_free"] = 10**13
    return f


def group(members=("a100-1", "a100-2"), **extra):
    return {"model": SVL, "serving_group": "svl", "serving_group_members": list(members), **extra}


def peers(n=2, **kw):
    return {f"a100-{i + 1}": member(f"10.0.0.{i + 1}", **kw) for i in range(n)}


def plan_of(host, data=None, ps=None):
    ps = ps or peers()
    v = verdict(host, ps[host], data or group(), peers=ps)
    assert not v.refusals, v.refusals
    return v.plan


def refusal(host, data=None, ps=None):
    ps = ps if ps is not None else peers()
    v = verdict(host, ps.get(host) or member("10.0.0.9"), data or group(), peers=ps)
    assert v.refusals and v.plan is None
    return v.refusals[0]


def args_after(args, flag):
    return args[args.index(flag) + 1]


# ---------------------------------------------------------------------------- plans

def test_pp_head_and_worker_follow_vllms_multinode_recipe():
    """TP = GPUs per host, PP = hosts; the head serves the API, the others run --headless
    (docs/recipes.md#multi-node)."""
    head, worker = plan_of("a100-1"), plan_of("a100-2")
    h, w = head.instances[0], worker.instances[0]
    for i in (h, w):
        assert args_after(i.args, "--tensor-parallel-size") == "4"
        assert args_after(i.args, "--pipeline-parallel-size") == "2"
        assert args_after(i.args, "--nnodes") == "2"
        assert args_after(i.args, "--master-addr") == "10.0.0.1"
        assert args_after(i.args, "--master-port") == "29501"
        assert args_after(i.args, "--host") == "127.0.0.1" and args_after(i.args, "--port") == "8000"
        assert i.name == "nemotron-svl" and i.tp == 4 and len(i.gpus) == 4
    assert args_after(h.args, "--node-rank") == "0" and "--headless" not in h.args
    assert args_after(w.args, "--node-rank") == "1" and w.args[-1] == "--headless"
    # everything but the rank and --headless is the same command line on every member
    strip = lambda a: [x for k, x in enumerate(a) if x != "--headless" and not (k and a[k - 1] == "--node-rank")]
    assert strip(h.args) == strip(w.args)
    assert worker.env["VLLM_HOST_IP"] == "10.0.0.2" and worker.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert worker.env["GLOO_SOCKET_IFNAME"] == "eth0" and head.env["VLLM_HOST_IP"] == "10.0.0.1"
    assert "TP4 within each host x PP2 across the hosts" in head.choices[0]
    assert "rank 1 of 2 (worker, --headless)" in worker.choices[0]
    assert any("not encrypted" in x for x in head.warnings)
    assert any("no InfiniBand/RoCE adapter on a100-1, a100-2" in x for x in head.warnings)


def test_tp_across_hosts_and_dp_across_hosts():
    tp = plan_of("a100-2", group(serving_group_parallel="tp")).instances[0]
    assert args_after(tp.args, "--tensor-parallel-size") == "8" and "--pipeline-parallel-size" not in tp.args
    head = plan_of("a100-1", group(serving_group_parallel="dp")).instances[0]
    worker = plan_of("a100-2", group(serving_group_parallel="dp")).instances[0]
    assert args_after(head.args, "--data-parallel-size") == "2"
    assert args_after(head.args, "--data-parallel-size-local") == "1"
    assert args_after(head.args, "--data-parallel-address") == "10.0.0.1"
    assert args_after(head.args, "--data-parallel-rpc-port") == "13345"
    assert "--data-parallel-start-rank" not in head.args and "--nnodes" not in head.args
    assert args_after(worker.args, "--data-parallel-start-rank") == "1" and worker.args[-1] == "--headless"


def test_every_multinode_line_parses_with_the_flag_table():
    """The stand-in's parser (the same table the planner validates against) takes every line."""
    parser = __import__("nemofleet.vllm_flags", fromlist=["x"]).build_argparser("0.27.1")
    for mode in ("pp", "tp", "dp"):
        for h in ("a100-1", "a100-2"):
            parser.parse_args(plan_of(h, group(serving_group_parallel=mode)).instances[0].args)


def test_rdma_present_no_warning_and_ib_hca_reaches_the_env():
    ps = peers(rdma=("mlx5_0", "mlx5_1"))
    p = plan_of("a100-1", group(serving_group_ib_hca="mlx5_0,mlx5_1"), ps)
    assert not any("InfiniBand" in w for w in p.warnings)
    assert p.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


def test_a_model_that_fits_one_host_plans_but_says_so():
    p = plan_of("a100-1", group(model={"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}))
    assert any("fits one host of serving_group svl" in w and "serve it per host" in w for w in p.warnings)


# ---------------------------------------------------------------------------- refusals

def test_group_too_small_is_refused_with_figures_and_the_group_that_fits():
    ps = {f"a100-{i}": member(f"10.0.0.{i}", gpus=1) for i in (1, 2)}
    why = refusal("a100-1", ps=ps)
    assert "over serving_group svl (2 hosts x 1x A100 80 GiB, TP1 x PP2) needs" in why
    assert "GiB per GPU" in why and "but each GPU has 72.0 GiB" in why
    assert "it fits 4 hosts of 1x A100 80 GiB" in why or "it fits 5 hosts of 1x A100 80 GiB" in why


@pytest.mark.parametrize("ps, data, words", [
    ({"a100-1": member("10.0.0.1")}, None, "a100-2 is not part of this run (deploy every member of svl together: "
                                           "--limit a100-1,a100-2)"),
    ({"a100-1": member("10.0.0.1"), "a100-2": factmodel.PeerMissing(why="did not answer (Connection refused)")}, None,
     "a100-2 did not answer (Connection refused)"),
    ({"a100-1": member("10.0.0.1"), "a100-2": factmodel.PeerMissing(why="is not a host of this inventory")}, None,
     "a100-2 is not a host of this inventory"),
    ({"a100-1": member("10.0.0.1"), "a100-2": member("10.0.0.2", gpus=2)}, None,
     "mixes GPUs (a100-1: 4x A100 80 GiB, a100-2: 2x A100 80 GiB)"),
    ({"a100-1": member("10.0.0.1"), "a100-2": member("10.0.0.2", driver="580.95.05")}, None,
     "mixes NVIDIA drivers (a100-1: 570.195.03, a100-2: 580.95.05)"),
    ({"a100-1": member("203.0.113.7"), "a100-2": member("10.0.0.2")}, None,
     "a100-1: its only address on any interface is 203.0.113.7, outside serving_group_network"),
    ({"a100-1": dict(member("10.0.0.1"), image={"id": "sha256:aaaa", "env": {}}),
      "a100-2": dict(member("10.0.0.2"), image={"id": "sha256:bbbb", "env": {}})}, None,
     "vllm/vllm-openai:v0.27.1 is a different image on a100-2 than on the head"),
    ({"a100-1": member("10.0.0.1"), "a100-2": dict(member("10.0.0.2"), errors={"gpus": "nvidia-smi did not answer"})},
     None, "a100-2: could not read gpus (nvidia-smi did not answer)"),
    (None, group(members=("a100-3", "a100-2")), "this host is in serving_group svl but not among its members"),
    (None, {"model": SVL, "serving_group": "svl"}, "serving_group svl has no members"),
    (None, group(serving_group_interface="ib0"), "a100-1: it has no usable address on ib0"),
])
def test_group_refusals_are_one_sentence(ps, data, words):
    why = refusal("a100-1", data, ps)
    assert words in why, why


def test_worker_that_gets_no_answer_from_the_head_is_refused():
    s = settings.parse(group())
    # the members' facts typed as the deploy hands them over (factmodel.parse_peer)
    typed = {m: factmodel.parse_peer(m, f) for m, f in peers().items()}
    assert multinode.head_probe("a100-2", s, typed) == ("10.0.0.1", 29501)
    assert multinode.head_probe("a100-1", s, typed) is None  # the head probes nobody
    assert multinode.head_probe("a100-2", settings.parse(group(serving_group_parallel="dp")), typed) == ("10.0.0.1", 13345)
    unreadable = dict(typed, **{"a100-1": factmodel.parse_peer("a100-1", dict(peers()["a100-1"], addresses=[1]))})
    assert multinode.head_probe("a100-2", s, unreadable) is None  # the plan refuses it, naming a100-1
    ps = peers()
    ps["a100-2"]["head_reach"] = {"target": "10.0.0.1:29501", "state": "silent"}
    why = refusal("a100-2", None, ps)
    assert "gets no answer from the head a100-1 at 10.0.0.1:29501 within 3 s" in why and "open TCP 29501" in why
    ps["a100-2"]["head_reach"] = {"target": "10.0.0.1:29501", "state": "refused"}  # answered: nothing listens yet
    assert "(reachable from here: refused)" in plan_of("a100-2", None, ps).choices[0]


def test_tcp_reach_fact():
    from nemofleet.facts.network import TcpReach

    cmd = TcpReach().command("10.0.0.1", 29501)
    # a constant program; the address and the port are its arguments
    assert cmd.startswith("if timeout 3 bash -c 'exec 3<>\"/dev/tcp/$1/$2\"' reach 10.0.0.1 29501 ")
    assert [TcpReach().process([w]) for w in ("open", "refused", "silent", "junk")] == ["open", "refused", "silent", None]
    # against loopback only: a closed port answers "refused"
    assert subprocess.run(["bash", "-c", TcpReach().command("127.0.0.1", 9)], capture_output=True,
                          text=True).stdout.strip() == "refused"


def test_public_rendezvous_only_when_told():
    ps = {"a100-1": member("203.0.113.7"), "a100-2": member("203.0.113.8")}
    assert "not encrypted" in refusal("a100-1", None, ps)
    p = plan_of("a100-1", group(serving_group_allow_public=True), ps)
    assert args_after(p.instances[0].args, "--master-addr") == "203.0.113.7"


def test_real_h200_without_iproute2_and_with_an_empty_infiniband_class():
    """As read on the real H200 machine (device tool): /sys/class/infiniband exists but is empty,
    and `ip` is not installed, so HostAddresses is empty."""
    from nemofleet.facts.docker import HostAddresses
    from nemofleet.facts.host import RdmaDevices

    assert RdmaDevices().process([]) == [] and HostAddresses().process(["bash: line 1: ip: command not found"]) == {}
    assert "is iproute2 installed?" in multinode.member_address({}, settings.parse({}))


def test_member_address_prefers_private_ipv4_and_skips_plumbing():
    s = settings.parse({})
    addrs = {"lo": ["127.0.0.1"], "docker0": ["172.17.0.1"], "br-1a2b": ["172.18.0.1"], "veth9": ["10.9.9.9"],
             "bond0": ["fd00::5", "10.1.2.3"], "eth1": ["198.51.100.4"]}
    assert multinode.member_address(addrs, s) == ("bond0", "10.1.2.3")


def test_members_with_different_settings_are_refused():
    ps = peers()
    d = desired.build("a100-1", group(), ps["a100-1"], SECRETS, peers=ps,
                      peer_data={"a100-2": group(max_model_len=4096)})
    assert not d.ok and "a100-2 differs from this host in max_model_len" in d.refusals[0]
    ok = desired.build("a100-1", group(), ps["a100-1"], SECRETS, peers=ps,
                       peer_data={"a100-2": group(serving_group_interface="eth0")})
    assert ok.ok, ok.refusals


def test_a_group_needs_a_pinned_commit():
    ps = peers()
    commits = {("https://huggingface.co", SVL["catalog"], "main"): {"sha": REV}}
    d = desired.build("a100-1", group(model={"catalog": "nemotron-3.5-super-vl-bf16", "revision": "main"}), ps["a100-1"],
                      SECRETS, peers=ps, commits=commits)
    assert not d.ok and "serving_group svl: pin the model revision to a 40-hex commit" in " ".join(d.refusals)


def test_hostile_group_values_are_refused_by_the_schema():
    for bad in ({"serving_group": "svl; rm -rf /"}, {"serving_group_members": ["a100-1"]},
                {"serving_group_members": ["a100-1", "a b"]}, {"serving_group_interface": "eth0 -v"},
                {"serving_group_network": ["10.0.0.0/33"]}, {"serving_group_ib_hca": "mlx5_0\n[Service]"},
                {"serving_group_master_port": 80}, {"serving_group_parallel": "ray"}):
        with pytest.raises(settings.SettingsError):
            settings.parse(bad)


# ---------------------------------------------------------------------------- units, health, desired

def test_worker_unit_waits_for_the_head_and_runs_on_the_host_network():
    ps = peers()
    head = desired.build("a100-1", group(), ps["a100-1"], SECRETS, peers=ps)
    worker = desired.build("a100-2", group(), ps["a100-2"], SECRETS, peers=ps)
    (hu,), (wu,) = [c for c, _ in head.units.values()], [c for c, _ in worker.units.values()]
    assert "--network=host" in wu and " -p " not in wu and "--network=host" in hu
    # the wait is a constant program; the head's address and port are its arguments ($1, $2)
    assert ("ExecStartPre=/usr/bin/timeout 600 /bin/bash -c "
            "'until (exec 3<>\"/dev/tcp/$$1/$$2\") 2>/dev/null; do sleep 2; done' join-wait 10.0.0.1 29501") in wu
    assert "/dev/tcp" not in hu
    assert "rank 1 (worker) of serving group svl" in wu
    assert worker.ready_command is None and "wait_ready nemotron-svl http://127.0.0.1:8000/health 1200;" in head.ready_command
    assert not worker.front_door and not head.front_door  # no frontends: no front door
    wh = json.loads(worker.health_files["/etc/nemofleet/health.json"][0])
    assert wh["instances"][0]["name"] == "nemotron-svl" and wh["instances"][0]["port"] == 0
    assert wh["group"] == {"name": "svl", "role": "worker", "rank": 1, "head": "10.0.0.1", "port": 29501}


def test_group_head_with_frontends_gets_the_front_door():
    ps = peers()
    data = group(frontends=[{"name": "open-webui", "network": "open-webui_default", "create": True}])
    head = desired.build("a100-1", data, ps["a100-1"], SECRETS, peers=ps)
    worker = desired.build("a100-2", data, ps["a100-2"], SECRETS, peers=ps)
    assert head.front_door and not head.attached and not worker.front_door and not worker.frontend_lines
    # the group's one instance restarts with its group (units.running on every member), never
    # through a drain that would restart the head alone
    assert head.drain_restarts == []
    assert any("the front door" in x for x in head.frontend_lines)


def test_group_units_and_health_script_pass_the_real_consumers(tmp_path):
    from test_destinations import verify_units

    ps = peers()
    for h in ("a100-1", "a100-2"):
        d = desired.build(h, group(), ps[h], SECRETS, peers=ps)
        (tmp_path / h).mkdir()
        verify_units({p: c for p, (c, _) in d.units.items()}, tmp_path / h)
        # the health program and its config (JSON) as the host reads them
        compile(d.health_files["/usr/local/bin/nemofleet-health"][0], "nemofleet-health", "exec")
        assert json.loads(d.health_files["/etc/nemofleet/health.json"][0])["group"]["rank"] == (h == "a100-2")


@pytest.mark.parametrize("host", ["a100-1", "a100-2"])
def test_golden_group_member(host):
    ps = peers()
    text = dump(desired.build(host, group(), ps[host], SECRETS, operator="ops@ctl", peers=ps))
    path = GOLDEN / f"group-svl-2x4xa100-{host}.txt"
    if os.environ.get("NEMOFLEET_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


# ---------------------------------------------------------------------------- inventory

def test_inventory_serving_groups_fill_host_data():
    ns = {"gpu_a100": [("a100-1", {"ssh_port": 1}), "a100-2", ("a100-3", {})],
          "serving_groups": {"svl": ["a100-1", "a100-2"]}}
    assert inventory.serving_groups(ns) is None
    assert ns["gpu_a100"][0] == ("a100-1", {"ssh_port": 1, "serving_group": "svl",
                                            "serving_group_members": ["a100-1", "a100-2"]})
    assert ns["gpu_a100"][1] == ("a100-2", {"serving_group": "svl", "serving_group_members": ["a100-1", "a100-2"]})
    assert ns["gpu_a100"][2] == ("a100-3", {})


@pytest.mark.parametrize("groups, words", [
    ({"svl": ["a100-1", "a100-9"]}, "names a100-9, which is not a host of this inventory"),
    ({"svl": ["a100-1"]}, "must list at least two host names"),
    ({"svl": ["a100-1", "a100-1"]}, "lists a host twice"),
    ({"svl": ["a100-1", "a100-2"], "b": ["a100-2", "a100-3"]}, "a100-2 is in serving groups svl and b"),
    ({"Bad Name": ["a100-1", "a100-2"]}, "must be lower-case letters"),
    (["a100-1"], "serving_groups must be a mapping"),
    (5, "serving_groups must be a mapping"),
    ({"svl": ["a100-1", None]}, "must list at least two host names"),
    ({"svl": [None, "a100-1", "a100-2"]}, "must list at least two host names"),
])
def test_inventory_serving_groups_refusals(groups, words):
    ns = {"gpu_a100": ["a100-1", "a100-2", "a100-3"], "serving_groups": groups}
    assert words in inventory.serving_groups(ns)
