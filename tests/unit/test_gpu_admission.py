"""GPU admission (gpuhealth.py): a sick GPU is left out of the plan with one sentence naming what was
seen and the remedy; warnings for degraded links and slowdowns; the fabric manager on NVSwitch systems."""
import copy
import json

import pytest

from opharness import verdict  # noqa: E402
from nemofleet import gpuhealth, preflight, settings
from nemofleet.facts.gpuhealth import HEALTH_FIELDS
from nemofleet.plan import Gpu, PlanError
from opharness import make_plan  # noqa: E402

from test_preflight import DATA, _plan_cli, ready

H200 = ("NVIDIA H200", 143771, "9.0")
BOOT = 1764815000


def gpus(n=4):
    return [Gpu(i, f"GPU-{i:08d}-0000-4000-8000-000000000000", *H200, bus_id=f"00000000:{0x10 + i:02X}:00.0")
            for i in range(n)]


def row(g, **over):
    """A healthy row as the real H200 prints it (tests/fixtures/gpu/h200/health_query.out), for GPU g."""
    base = {"index": g.index, "uuid": g.uuid, "pci.bus_id": g.bus_id, "ecc.mode.current": "Enabled",
            "ecc.errors.uncorrected.volatile.total": 0, "ecc.errors.uncorrected.aggregate.total": 0,
            "retired_pages.pending": None, "remapped_rows.correctable": 0, "remapped_rows.uncorrectable": 0,
            "remapped_rows.pending": False, "remapped_rows.failure": False,
            "clocks_event_reasons.hw_slowdown": False, "clocks_event_reasons.hw_thermal_slowdown": False,
            "clocks_event_reasons.hw_power_brake_slowdown": False, "clocks_event_reasons.sw_thermal_slowdown": False,
            "pcie.link.gen.current": 5, "pcie.link.gen.max": 5, "pcie.link.width.current": 16,
            "pcie.link.width.max": 16, "fabric.state": None, "fabric.status": None, "temperature.gpu": 34,
            "persistence_mode": "Enabled", "gpu_recovery_action": "None", "lost": False}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return base


def health(gs, rows=None, xids=(), resets=None, fm=None):
    rows = rows or {}
    return {"gpus": [rows.get(g.index) or row(g) for g in gs], "xids": list(xids), "boot_time": BOOT,
            "resets": resets or {}, "fabric_manager": fm or {"version": None, "active": None}, "error": None}


def xid(code, g, at=BOOT + 100):
    return {"code": code, "bus_id": g.bus_id[4:].rsplit(".", 1)[0].lower(), "time": at, "text": ""}


def left_out(gs, h):
    adm = gpuhealth.admit(gs, h)
    return [g.index for g in adm.admitted], adm.left_out, adm.warnings


def test_healthy_real_formats_admit_every_gpu_without_warnings():
    gs = gpus()
    assert left_out(gs, health(gs)) == ([0, 1, 2, 3], {}, [])
    assert left_out(gs, None) == ([0, 1, 2, 3], {}, [])  # no health part (old facts file): as before


@pytest.mark.parametrize("over,seen,remedy", [
    ({"remapped_rows.pending": True}, "remapped_rows.pending is Yes", "nvidia-smi -r -i 2"),
    ({"remapped_rows.failure": True}, "remapped_rows.failure is Yes", "replace the GPU"),
    ({"ecc.errors.uncorrected.volatile.total": 3}, "ecc.errors.uncorrected.volatile.total is 3", "nvidia-smi -r -i 2"),
    ({"retired_pages.pending": True}, "retired_pages.pending is Yes", "nvidia-smi -r -i 2"),
    ({"gpu_recovery_action": "Reset"}, "GPU Recovery Action is Reset", "nvidia-smi -r -i 2"),
    ({"gpu_recovery_action": "Reboot"}, "GPU Recovery Action is Reboot", "reboot the host"),
    ({"gpu_recovery_action": "Drain and Reset"}, "GPU Recovery Action is Drain and Reset", "nvidia-smi -r -i 2"),
    ({"lost": True}, "nvidia-smi reports it lost ([GPU is lost]); reboot the host", "reboot the host"),
])
def test_each_fault_leaves_its_gpu_out_with_what_was_seen_and_the_remedy(over, seen, remedy):
    gs = gpus()
    r = row(gs[2])
    r.update(over)
    admitted, out, _ = left_out(gs, health(gs, {2: r}))
    assert admitted == [0, 1, 3] and list(out) == [gs[2].uuid]
    sentence = out[gs[2].uuid]
    assert sentence.startswith(f"GPU 2 ({gs[2].uuid}) is left out of the plan: ") and seen in sentence and remedy in sentence


def test_not_reported_is_never_a_fault():
    gs = gpus(1)
    blank = {k: None for k in HEALTH_FIELDS if k not in ("index", "uuid", "pci.bus_id")}
    assert left_out(gs, health(gs, {0: row(gs[0], **blank)}))[:2] == ([0], {})


def test_xids_that_mean_drain_count_from_the_later_of_boot_and_the_recorded_reset():
    gs = gpus()
    h = health(gs, xids=[xid(79, gs[3]), xid(13, gs[1]), xid(48, gs[0], at=BOOT + 50)])
    admitted, out, _ = left_out(gs, h)
    assert admitted == [1, 2]  # Xid 13 is an application error, not the GPU's
    assert "Xid 79 (the GPU has fallen off the bus)" in out[gs[3].uuid] and "reboot the host" in out[gs[3].uuid]
    assert "Xid 48" in out[gs[0].uuid] and "nvidia-smi -r -i 0" in out[gs[0].uuid]
    # GPU 0 was reset (and recorded) after its Xid 48: it serves again; GPU 3's Xid 79 came after its reset
    h["resets"] = {"0000:10:00": BOOT + 60, "0000:13:00": BOOT + 10}
    assert left_out(gs, h)[0] == [0, 1, 2]


def test_repeated_xid64_says_replace():
    gs = gpus(2)
    once = left_out(gs, health(gs, xids=[xid(64, gs[1])]))[1][gs[1].uuid]
    assert "Xid 64 (a row-remapping failure)" in once and "nvidia-smi -r -i 1" in once
    twice = health(gs, xids=[xid(64, gs[1], BOOT + 5), xid(64, gs[1], BOOT + 500)], resets={"0000:11:00": BOOT + 9})
    assert "Xid 64 2 times since boot; replace the GPU" in left_out(gs, twice)[1][gs[1].uuid]


def test_degraded_pcie_and_slowdowns_are_warnings_not_exclusions():
    gs = gpus(2)
    h = health(gs, {0: row(gs[0], **{"pcie.link.width.current": 8}),
                    1: row(gs[1], **{"clocks_event_reasons.hw_thermal_slowdown": True, "temperature.gpu": 91})})
    admitted, out, warnings = left_out(gs, h)
    assert admitted == [0, 1] and out == {}
    assert any("GPU 0" in w and "width 8 of 16" in w for w in warnings)
    assert any("GPU 1" in w and "HW thermal slowdown" in w and "91 C" in w for w in warnings)


def test_plan_leaves_the_sick_gpu_out_like_mig_and_refuses_only_when_none_remains():
    gs = gpus()
    bad = row(gs[1], **{"remapped_rows.failure": True})
    p = make_plan("h", gs, {}, health=health(gs, {1: bad}))
    assert [g.index for i in p.instances for g in i.gpus] == [0, 2, 3] and p.excluded_gpus == [1]
    assert any(w.startswith("GPU 1 (") and "replace the GPU" in w for w in p.warnings)
    every = {g.index: row(g, **{"remapped_rows.pending": True}) for g in gs}
    with pytest.raises(PlanError, match=r"^no GPU of this host may serve: GPU 0 .*remapped_rows.pending is Yes"):
        make_plan("h", gs, {}, health=health(gs, every))


def test_garbage_in_a_facts_file_is_one_sentence():
    gs = gpus(1)
    with pytest.raises(PlanError, match="nvidia-smi printed 'maybe' for remapped_rows.pending of GPU 0"):
        make_plan("h", gs, {}, health=health(gs, {0: row(gs[0], **{"remapped_rows.pending": "maybe"})}))
    with pytest.raises(PlanError, match=r"health facts cannot be read: health is \['x'\], not a mapping; write them with"):
        make_plan("h", gs, {}, health=["x"])
    with pytest.raises(PlanError, match=r"health\.xids\[0\]\.code is 'x', not an integer"):
        make_plan("h", gs, {}, health={"gpus": [], "xids": [{"code": "x"}]})


def test_fabric_manager_on_an_nvswitch_system_refuses_the_host():
    f = ready()
    g = f["gpus"]["gpus"][0]
    gs = [Gpu(g["index"], g["uuid"], g["name"], g["memory_mib"], g["cc"], bus_id=g["bus_id"])]
    nvswitch = {0: row(gs[0], **{"fabric.state": "Completed", "fabric.status": "Success"})}
    f["health"] = health(gs, nvswitch, fm={"version": "580.159.04", "active": "inactive"})
    v = verdict("h", f, DATA)
    assert not v.ok and "NVSwitch system" in v.refusals[0] and "error 802" in v.refusals[0]
    f["health"]["fabric_manager"] = {"version": "570.172.08", "active": "active"}
    assert "must be the same version" in verdict("h", f, DATA).refusals[0]
    f["health"]["fabric_manager"] = {"version": "580.159.04", "active": "active"}
    assert verdict("h", f, DATA).ok
    f["health"] = health(gs, fm={"version": None, "active": None})  # fabric N/A: not an NVSwitch system
    assert verdict("h", f, DATA).ok


def test_a_gb200_nvl_compute_tray_plans_without_a_local_fabric_manager():
    """GB200 NVL72: the NVSwitches and their fabric manager are in the switch trays, not on the
    compute tray (leptonai/gpud#1106): fabric state Completed with status Success and no local
    nvidia-fabricmanager is healthy; a GPU not registered with the fabric refuses the host naming it."""
    f = ready()
    g = f["gpus"]["gpus"][0]
    g.update(name="NVIDIA GB200", memory_mib=189471, cc="10.0")
    gs = [Gpu(g["index"], g["uuid"], g["name"], g["memory_mib"], g["cc"], bus_id=g["bus_id"])]
    done = {0: row(gs[0], **{"fabric.state": "Completed", "fabric.status": "Success"})}
    f["health"] = health(gs, done, fm={"version": None, "active": "inactive"})
    v = verdict("h", f, DATA)
    assert v.ok, v.refusals
    f["health"] = health(gs, {0: row(gs[0], **{"fabric.state": "In Progress"})}, fm={"version": None, "active": None})
    why = verdict("h", f, DATA).refusals
    assert why == ["GPU 0 is not registered with the NVLink fabric (fabric.state In Progress, status not reported), so "
                   "CUDA fails with error 802; on this NVL compute tray the fabric manager runs on the NVSwitch trays: "
                   "check it there, then deploy again"]
    # an HGX H200 in the same state still needs its own fabric manager (leptonai/gpud#1151)
    f = ready()
    g = f["gpus"]["gpus"][0]
    gs = [Gpu(g["index"], g["uuid"], g["name"], g["memory_mib"], g["cc"], bus_id=g["bus_id"])]
    f["health"] = health(gs, {0: row(gs[0], **{"fabric.state": "Completed", "fabric.status": "Success"})})
    assert "nvidia-fabricmanager is not running" in verdict("h", f, DATA).refusals[0]


@pytest.fixture
def fresh_inventory_module():
    """pyinfra keeps the code of each inventory file it read by file name (inv.py here, as in
    test_preflight): drop it before and after, so this test's inventory neither sees nor leaves
    another test's."""
    from pyinfra_cli.util import PYTHON_CODES

    def drop():
        for name in [n for n in PYTHON_CODES if str(n).endswith("inv.py")]:
            del PYTHON_CODES[name]
    drop()
    yield
    drop()


def test_plan_cli_on_a_facts_file_whose_gpu0_reports_remap_pending(tmp_path, capsys, fresh_inventory_module):
    """The issue's "Done when": `nemofleet plan --facts` leaves GPU 0 out with the remedy."""
    f = ready()
    g0 = f["gpus"]["gpus"][0]
    g1 = dict(g0, index=1, uuid="GPU-11111111-2222-3333-4444-555555555555", bus_id="00000000:00:07.0")
    f["gpus"]["gpus"].append(g1)
    rows = []
    for g in (g0, g1):
        r = {k: v for k, v in row(Gpu(g["index"], g["uuid"], *H200, bus_id=g["bus_id"])).items() if k != "lost"}
        words = {k: (("Active", "Not Active") if k.startswith("clocks_event") else ("Yes", "No")) for k in r}
        rows.append({k: (words[k][0] if v is True else words[k][1] if v is False else v)  # as nvidia-smi says it
                     for k, v in r.items()})
    rows[0]["remapped_rows.pending"] = "Yes"
    f["health"] = {"gpus": rows, "xids": [], "boot_time": BOOT, "resets": {}}
    inv = ('model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "0123456789abcdef0123456789abcdef01234567"}\n'
           'gpu_h200 = [("h200-2", {"vllm_api_key": "sk-test-0123456789"})]\n')  # host data: the plan refuses no key
    rc, out = _plan_cli(tmp_path, capsys, inv, {"h200-2": f})
    assert rc == 0 and "Traceback" not in out and "REFUSED" not in out, out
    assert (f"warning: GPU 0 ({g0['uuid']}) is left out of the plan: remapped_rows.pending is Yes (a row remap "
            "waits for a GPU reset); drain it, run nvidia-smi -r -i 0") in out, out
    import os

    from nemofleet import cli
    here = os.getcwd()
    os.chdir(tmp_path)  # the inventory and facts file written by _plan_cli above
    try:
        assert cli.main(["plan", f"inv_{tmp_path.name.replace('-', '_')}.py", "--facts", "facts.json", "--json"]) == 0
    finally:
        os.chdir(here)
    plan = json.loads(capsys.readouterr().out)["h200-2"]["plan"]
    assert plan["excluded_gpus"] == [0] and [i["gpus"] for i in plan["instances"]] == [[1]]


# ---------------------------------------------------------------------------- stable identity

def test_a_sick_gpu_costs_exactly_its_instance_others_keep_name_port_and_args():
    gs = gpus(8)
    data = {"instance_extra_args": {"nemotron-5": {"enable-prefix-caching": True},
                                 "nemotron-3": {"enable-prefix-caching": True}}}
    healthy = make_plan("h", gs, data, health=health(gs))
    assert healthy.to_dict() == make_plan("h", gs, data).to_dict()  # healthy facts change nothing
    before = {i.name: (i.host_port, i.gpu_uuids, i.args) for i in healthy.instances}
    sick = make_plan("h", gs, data, health=health(gs, {3: row(gs[3], **{"remapped_rows.pending": True})}))
    after = {i.name: (i.host_port, i.gpu_uuids, i.args) for i in sick.instances}
    assert set(before) - set(after) == {"nemotron-3"} and all(after[n] == before[n] for n in after)
    assert "--enable-prefix-caching" in after["nemotron-5"][2]  # its extra args followed it, not the position
    assert sick.excluded_gpus == [3]


def test_tp_groups_keep_their_identity_and_a_split_group_plans_the_largest_subset():
    gs = gpus(8)
    data = {"tensor_parallel_size": 2}
    before = {i.name: (i.host_port, i.gpu_uuids) for i in make_plan("h", gs, data).instances}
    pair = {4: row(gs[4], **{"gpu_recovery_action": "Reset"}), 5: row(gs[5], **{"remapped_rows.failure": True})}
    after = {i.name: (i.host_port, i.gpu_uuids) for i in make_plan("h", gs, data, health=health(gs, pair)).instances}
    assert set(before) - set(after) == {"nemotron-2"} and all(after[n] == before[n] for n in after)
    # one GPU of a pair: 7 left, which TP2 does not divide; the subset search (issue 26) plans the
    # largest subset, costing exactly the instance of that pair, and says which GPU stays idle and why
    p = make_plan("h", gs, data, health=health(gs, {5: pair[5]}))
    after = {i.name: (i.host_port, i.gpu_uuids) for i in p.instances}
    assert set(before) - set(after) == {"nemotron-2"} and all(after[n] == before[n] for n in after)
    assert "GPU 4 stays idle: 7 GPUs are not a multiple of TP2" in p.choices[0] and p.excluded_gpus == [4, 5]
    assert any(w.startswith("GPU 5 (") and "is left out of the plan: remapped_rows.failure is Yes" in w
               for w in p.warnings)


def test_an_instance_of_a_new_shape_takes_names_and_ports_the_healthy_plan_does_not_use():
    from types import SimpleNamespace

    from nemofleet.plan import _slots

    gs = gpus(4)
    lay = SimpleNamespace(gpus=gs[:3], tp=1, count=3, groups=[[g] for g in gs[:3]])  # each instance's GPUs
    s = settings.parse({"instance_prefix": "v", "port_base": 8000})
    identity = {frozenset(g.uuid for g in gs): ("v0", 8000)}  # the healthy plan: one TP4 instance
    assert _slots(s, [lay], identity) == [("v1", 8001), ("v2", 8002), ("v3", 8003)]
    identity = {frozenset([gs[1].uuid]): ("v1", 8001)}
    assert _slots(s, [lay], identity) == [("v0", 8000), ("v1", 8001), ("v2", 8002)]
    assert _slots(s, [lay], None) == [("v0", 8000), ("v1", 8001), ("v2", 8002)]


def test_a_lost_gpu_names_the_xid_that_lost_it():
    gs = gpus(4)
    h = health(gs, {3: row(gs[3], lost=True)}, xids=[xid(79, gs[3])])
    assert "reports it lost ([GPU is lost]) after Xid 79 (the GPU has fallen off the bus); reboot the host" in \
        left_out(gs, h)[1][gs[3].uuid]
