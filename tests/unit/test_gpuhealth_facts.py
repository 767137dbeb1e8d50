"""GPU health facts (facts/gpuhealth.py), replaying real H200 outputs (tests/fixtures/gpu/h200/health_*,
captured with driver 580.159.04) and faulty values in the formats NVIDIA documents (docs/gpu-health.md)."""
import json
import subprocess
from pathlib import Path

import pytest

from nemofleet.facts.gpu import Unreadable
from nemofleet.facts.gpuhealth import HEALTH_FIELDS, GpuHealth, bus_key, typed
from nemofleet.facts.host import HostFacts, facts_file_problem

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200"


def lines(name, prefix=""):
    return [prefix + line for line in (H200 / name).read_text().splitlines()]


def real_output(extra=()):
    return (lines("health_query.out", "SMI:") + ["RC=0"] + lines("health_q_recovery.out", "Q:")
            + ["BTIME=1764815000"] + lines("health_nvrm.out", "XID:") + list(extra) + ["FM_ACTIVE="])


def test_real_h200_health_query_is_typed_under_nvidia_smi_names():
    fact = GpuHealth().process(real_output())
    assert fact["error"] is None and fact["refused_fields"] == [] and fact["xids"] == []  # NVRM lines, no Xid
    g = fact["gpus"][0]
    assert g["index"] == 0 and g["pci.bus_id"] == "00000000:00:06.0" and g["lost"] is False
    assert g["ecc.errors.uncorrected.volatile.total"] == 0 and g["remapped_rows.pending"] is False
    assert g["retired_pages.pending"] is None  # [N/A] on an H200 (it remaps rows instead): not reported
    assert g["fabric.state"] is None and g["fabric.status"] is None  # bare N/A: no NVSwitch
    assert g["clocks_event_reasons.hw_slowdown"] is False and g["pcie.link.width.current"] == 16
    assert g["gpu_recovery_action"] == "None"  # from the nvidia-smi -q line, as captured
    assert fact["fabric_manager"] == {"version": None, "active": None}


def test_capture_row_mixing_bracketed_and_bare_na():
    """The row of ../shared/captures/h200 (units on, [N/A] and N/A in one row) read field by field."""
    head, row = lines("health_capture_query.out")
    names = [h.split(" [")[0] for h in head.split(", ")]
    values = dict(zip(names, row.split(", ")))
    assert typed("retired_pages.pending", values["retired_pages.pending"]) is None
    assert typed("fabric.state", values["fabric.state"]) is None
    assert typed("remapped_rows.failure", values["remapped_rows.failure"]) is False
    assert typed("ecc.errors.uncorrected.volatile.total", values["ecc.errors.uncorrected.volatile.total"]) == 0


def test_faulty_values_in_documented_formats():
    smi = ["SMI:" + ", ".join(HEALTH_FIELDS),
           "SMI:0, GPU-a, 00000000:07:00.0, Enabled, 2, 5, Yes, 1, 3, Yes, Yes, Active, Active, Not Active, Active, "
           "3, 5, 8, 16, Completed, Success, 91, Enabled, Reset",
           "SMI:1, GPU-b, 00000000:0F:00.0, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], "
           "[GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], "
           "[GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], "
           "[GPU is lost], [GPU is lost]"]
    xid = ["XID:[ 4711.250000] NVRM: Xid (PCI:0000:0f:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
           "XID:[   12.000001] NVRM: Xid (PCI:0000:07:00): 48, pid=1234, name=python3, An uncorrectable double bit error",
           "XID:Dec 04 11:00:00 h kernel: something else"]
    fact = GpuHealth().process(smi + ["RC=0", "BTIME=1764815000"] + xid + ["RESET:00000000:07:00.0 1764815100",
                                                                         "RESET:garbage", "FM_VERSION=580.159.04",
                                                                         "FM_ACTIVE=inactive"])
    a, b = fact["gpus"]
    assert a["remapped_rows.pending"] is True and a["ecc.errors.uncorrected.volatile.total"] == 2
    assert a["gpu_recovery_action"] == "Reset" and a["pcie.link.gen.current"] == 3 and a["fabric.state"] == "Completed"
    assert b["lost"] is True and b["uuid"] == "GPU-b" and b["remapped_rows.pending"] is None
    assert [(x["code"], x["bus_id"], x["time"]) for x in fact["xids"]] == [(79, "0000:0f:00", 1764819711.25),
                                                                         (48, "0000:07:00", 1764815012.0)]
    assert fact["resets"] == {"0000:07:00": 1764815100}
    assert fact["fabric_manager"] == {"version": "580.159.04", "active": "inactive"}


def test_unreadable_values_are_one_sentence_not_a_traceback():
    smi = ["SMI:index, uuid, pci.bus_id, remapped_rows.pending", "SMI:0, GPU-a, 00000000:07:00.0, [Unknown Error]"]
    with pytest.raises(Unreadable, match=r"nvidia-smi printed '\[Unknown Error\]' for remapped_rows.pending of GPU 0"):
        GpuHealth().parse(smi + ["RC=0"])
    fact = GpuHealth().process(smi + ["RC=0"])
    assert fact["gpus"] == [] and "remapped_rows.pending" in fact["error"]
    with pytest.raises(Unreadable, match="header"):
        GpuHealth().parse(["SMI:index, what.is.this", "SMI:0, 1", "RC=0"])
    with pytest.raises(Unreadable, match="did not answer"):
        GpuHealth().parse(["RC=124"])
    assert GpuHealth().process(["NOCMD"]) == GpuHealth().default()
    failed = GpuHealth().process(["SMI:No devices were found", "RC=6"])  # the GPU facts refuse this host
    assert failed["gpus"] == [] and failed["error"] == "No devices were found"
    with pytest.raises(Unreadable):
        typed("temperature.gpu", "hot")


def test_bus_ids_of_nvidia_smi_and_xid_lines_meet():
    assert bus_key("00000000:07:00.0") == bus_key("0000:07:00") == bus_key("PCI:0000:07:00"[4:]) == "0000:07:00"
    assert bus_key("00000000:0F:00.0") == "0000:0f:00"


def _fake_smi(tmp_path, refuse=(), q_text=""):
    """An nvidia-smi that refuses `refuse` fields (as a driver that does not know them, exit 2)."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f"""#!/usr/bin/python3
import sys
refuse = {list(refuse)!r}
q = [a for a in sys.argv[1:] if a.startswith("--query-gpu=")]
if not q:
    sys.stdout.write({q_text!r}); sys.exit(0)
fields = q[0].split("=", 1)[1].split(",")
for f in fields:
    if f in refuse:
        print(f'Field "{{f}}" is not a valid field to query.'); print(); sys.exit(2)
vals = {{"index": "0", "uuid": "GPU-a", "pci.bus_id": "00000000:07:00.0"}}
print(", ".join(fields)); print(", ".join(vals.get(f, "N/A") for f in fields))
""")
    script.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", GpuHealth().command()], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0
    return GpuHealth().process(out.stdout.splitlines())


def test_fields_the_driver_refuses_are_dropped_one_by_one_and_read_as_not_reported(tmp_path):
    fact = _fake_smi(tmp_path, refuse=("gpu_recovery_action", "fabric.state", "fabric.status"),
                     q_text="GPU 00000000:07:00.0\n    GPU Recovery Action                 : Reboot\n")
    assert fact["error"] is None and sorted(fact["refused_fields"]) == ["fabric.state", "fabric.status", "gpu_recovery_action"]
    g = fact["gpus"][0]
    assert "fabric.state" not in g and g["remapped_rows.pending"] is None
    assert g["gpu_recovery_action"] == "Reboot"  # from nvidia-smi -q, since the query refused the field


def test_the_recovery_action_costs_no_second_call_when_the_query_knows_it(tmp_path):
    fact = _fake_smi(tmp_path, q_text="GPU 00000000:07:00.0\n    GPU Recovery Action : Reboot\n")
    assert fact["refused_fields"] == [] and fact["gpus"][0]["gpu_recovery_action"] is None  # the query's N/A


def test_health_is_a_part_of_the_one_host_command_and_optional_in_facts_files():
    assert "health" in HostFacts.PARTS
    cmd = HostFacts().command()
    assert cmd.count("f=index,uuid,pci.bus_id,ecc.mode.current") == 1 and cmd.count("--query-gpu=$f") == 1
    full = json.loads((H200 / "hostfacts.json").read_text())
    full.update({"rdma": [], "addresses": {}})
    assert facts_file_problem("h", full) is None  # written before the health part: plans as healthy
    out = HostFacts().process(["@@nemofleet-fact:health"] + real_output())
    assert out["health"]["gpus"][0]["uuid"] == "GPU-9d6d9006-499f-444e-e5fc-632e6d09bfc3" and out["errors"] == {}
    bad = HostFacts().process(["@@nemofleet-fact:health", "SMI:index, uuid, remapped_rows.pending", "SMI:0, GPU-a, maybe", "RC=0"])
    assert "remapped_rows.pending" in bad["errors"]["health"]


def test_a_wedged_nvidia_smi_is_waited_for_once_not_again_for_the_health_query(tmp_path, monkeypatch):
    import time

    from nemofleet.facts import gpu, gpuhealth

    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpu, "SMI_TIMEOUT", 2)
    monkeypatch.setattr(gpuhealth, "SMI_TIMEOUT", 2)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    t0 = time.monotonic()
    out = subprocess.run(["sh", "-c", HostFacts().command()], capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - t0
    facts = HostFacts().process(out.stdout.splitlines())
    assert facts["gpus"]["rc"] == 124 and "did not answer" in facts["errors"]["gpus"]
    assert "health" not in facts["errors"] and facts["health"]["gpus"] == []  # the gpus sentence is the one
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2 and calls[1] == "-q -x", calls  # the GPU and CUDA queries, not the health query too
    assert took < 30, took
