"""`nemofleet testbed gpu-fault` on the simulated tools, without Docker: the drill tool changes what
the simulated nvidia-smi and dmesg print, the health fact reads it, admission acts on it, and the
stand-in fails its requests on a GPU that cannot compute."""
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nemofleet import gpuhealth
from nemofleet.facts.gpuhealth import GpuHealth
from nemofleet.plan import Gpu

SIMDIR = Path(__file__).resolve().parents[2] / "testbed" / "src" / "nemofleet_testbed" / "sim"
H100 = ("NVIDIA H100 80GB HBM3", 81559, "9.0")
PROFILE = [{"index": i, "uuid": f"GPU-{i:08d}-bbbb-4000-8000-000000000000", "name": H100[0], "memory_mib": H100[1],
            "cc": H100[2], "bus_id": f"00000000:{0x18 + i:02X}:00.0"} for i in range(4)]
GPUS = [Gpu(g["index"], g["uuid"], *H100, bus_id=g["bus_id"]) for g in PROFILE]


@pytest.fixture
def host(tmp_path):
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "profile.json").write_text(json.dumps({"driver": "580.159.04", "cuda": "13.0", "gpus": PROFILE}))
    (sim / "visible").write_text("all\n")  # as inside a container: no boot-time driver state needed
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("nvidia-smi", "dmesg"):
        (bin_ / tool).write_text(f"#!/bin/sh\nexec {SIMDIR / tool} \"$@\"\n")
        (bin_ / tool).chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "NEMOFLEET_SIM_DIR": str(sim),
           "NEMOFLEET_SIM_RESETS": str(tmp_path / "gpu-resets")}

    def drill(gpu, kind):
        r = subprocess.run([sys.executable, str(SIMDIR / "nemofleet-sim-fault"), str(gpu), kind],
                           capture_output=True, text=True, env=env, timeout=30)
        return r.returncode, r.stdout + r.stderr

    def fact():
        out = subprocess.run(["sh", "-c", GpuHealth().command()], capture_output=True, text=True, env=env, timeout=60)
        # on a host the fact reads /var/lib/nemofleet/gpu-resets; here the drill wrote them elsewhere:
        # the same lines, through the fact's own RESET: reader
        resets = tmp_path / "gpu-resets"
        lines = out.stdout.splitlines() + [f"RESET:{ln}" for ln in (resets.read_text().splitlines() if resets.exists() else [])]
        return GpuHealth().parse(lines)

    return drill, fact


@pytest.mark.parametrize("kind,seen", [
    ("xid79", "[GPU is lost]"), ("xid48", "ecc.errors.uncorrected.volatile.total is 1"),
    ("remap-pending", "remapped_rows.pending is Yes"), ("remap-failure", "remapped_rows.failure is Yes"), ("ecc-uncorrectable", "ecc.errors.uncorrected.volatile.total is 2"),
])
def test_each_drill_leaves_that_gpu_out_and_clear_brings_it_back(host, kind, seen):
    drill, fact = host
    assert drill(2, kind) == (0, f"GPU 2 ({PROFILE[2]['uuid']}): {kind}\n")
    h = fact()
    adm = gpuhealth.admit(GPUS, h)
    assert [g.index for g in adm.admitted] == [0, 1, 3] and seen in adm.left_out[PROFILE[2]["uuid"]]
    if kind in ("xid79", "xid48"):
        assert [x["code"] for x in h["xids"]] == [int(kind[3:])] and h["xids"][0]["bus_id"] == "0000:1a:00"
    assert drill(2, "clear")[0] == 0
    h = fact()
    assert [g.index for g in gpuhealth.admit(GPUS, h).admitted] == [0, 1, 2, 3], h["xids"]  # the Xid predates the reset
    if kind in ("xid79", "xid48"):
        assert len(h["xids"]) == 1  # the kernel keeps the line until reboot; the recorded reset makes it old


def test_degraded_pcie_warns_and_fabric_manager_down_refuses_the_host(host):
    drill, fact = host
    drill(1, "pcie-degraded")
    adm = gpuhealth.admit(GPUS, fact())
    assert len(adm.admitted) == 4 and any("GPU 1" in w and "width 8 of 16" in w for w in adm.warnings)
    drill(0, "fabric-manager-down")
    h = fact()
    assert h["gpus"][3]["fabric.state"] == "Completed" and h["fabric_manager"]["active"] != "active"
    assert "NVSwitch system" in gpuhealth.fabric_refusal(h, "580.159.04")
    drill(0, "clear")
    assert gpuhealth.fabric_refusal(fact(), "580.159.04") is None


def test_drill_refuses_unknown_gpus_and_kinds_in_one_sentence(host):
    drill, _ = host
    assert drill(9, "xid79") == (2, "this test host has no GPU 9 (GPUs 0, 1, 2, 3)\n")
    assert drill(0, "melt")[0] == 2
    import nemofleet_testbed as testbed
    from nemofleet import cli

    assert testbed.gpu_fault("h", "0", "melt") == (2, "unknown GPU fault 'melt'; one of " + ", ".join(testbed.GPU_FAULT_KINDS))
    assert cli.main(["testbed", "gpu-fault", "h100-1"]) == 2


def test_standin_on_a_broken_gpu_fails_requests_but_health_stays_200(tmp_path, monkeypatch):
    import threading
    import types
    from http.server import ThreadingHTTPServer

    from nemofleet import vllm_flags

    monkeypatch.setitem(sys.modules, "vllm_flags", vllm_flags)
    monkeypatch.syspath_prepend(str(SIMDIR.parent / "standin"))
    sys.modules.pop("vllm_standin", None)
    import vllm_standin

    faults = tmp_path / "gpu-faults.json"
    monkeypatch.setattr(vllm_standin, "GPU_FAULTS", str(faults))
    monkeypatch.setattr(vllm_standin, "nvml_ok", lambda: True)  # NVML answers: the GPU is listed, just broken
    vllm_standin.STATE.update(ready=True, gpus=[PROFILE[3]["uuid"]])
    vllm_standin.Handler.args = types.SimpleNamespace(served_model_name=["nemotron"], model_tag="/m",
                                                      max_num_seqs=2, max_model_len=4096)
    vllm_standin.Handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), vllm_standin.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    body = json.dumps({"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}).encode()

    def ask():
        req = urllib.request.Request(base + "/v1/chat/completions", body, {"content-type": "application/json"})
        try:
            return urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert ask() == 200
        faults.write_text(json.dumps({PROFILE[1]["uuid"]: "xid79", PROFILE[3]["uuid"]: "remap-pending"}))
        assert ask() == 200  # another GPU's fault, and a pending remap does not stop a running server
        faults.write_text(json.dumps({PROFILE[3]["uuid"]: "xid79"}))
        assert ask() == 500
        assert urllib.request.urlopen(base + "/health", timeout=5).status == 200
    finally:
        server.shutdown()
        sys.modules.pop("vllm_standin", None)
