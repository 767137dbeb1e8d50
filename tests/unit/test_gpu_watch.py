"""The health program's GPU watch (remote/health.py), run for real against stub tools: one nvidia-smi call
per run, a GPU that turns sick drains its instance once (front door out, webhook once, no
restart), the metrics per GPU, and the return after GPU_RETURN_AFTER healthy checks."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

from nemofleet import remote, render, settings
from nemofleet.facts.gpuhealth import HEALTH_FIELDS
from nemofleet.plan import Gpu
from opharness import make_plan  # noqa: E402

H100 = ("NVIDIA H100 80GB HBM3", 81559, "9.0")
GPUS = [Gpu(i, f"GPU-{i:08d}-aaaa-4000-8000-000000000000", *H100, bus_id=f"00000000:{0x18 + i:02X}:00.0")
        for i in range(4)]
HEALTHY = {"ecc.mode.current": "Enabled", "ecc.errors.uncorrected.volatile.total": "0",
           "ecc.errors.uncorrected.aggregate.total": "0", "retired_pages.pending": "[N/A]",
           "remapped_rows.correctable": "0", "remapped_rows.uncorrectable": "0", "remapped_rows.pending": "No",
           "remapped_rows.failure": "No", "clocks_event_reasons.hw_slowdown": "Not Active",
           "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
           "clocks_event_reasons.hw_power_brake_slowdown": "Not Active",
           "clocks_event_reasons.sw_thermal_slowdown": "Not Active", "pcie.link.gen.current": "5",
           "pcie.link.gen.max": "5", "pcie.link.width.current": "16", "pcie.link.width.max": "16",
           "fabric.state": "N/A", "fabric.status": "N/A", "temperature.gpu": "34", "persistence_mode": "Enabled",
           "gpu_recovery_action": "None"}

STUBS = {
    # answers the query fields from gpus.json; counts its calls
    "nvidia-smi": """#!/usr/bin/python3
import json, os, sys
d = os.environ["T"]
open(d + "/smi.calls", "a").write(" ".join(sys.argv[1:]) + "\\n")
q = [a for a in sys.argv[1:] if a.startswith("--query-gpu=")]
fields = q[0].split("=", 1)[1].split(",")
for g in json.load(open(d + "/gpus.json")):
    print(", ".join(g.get(f, "N/A") for f in fields))
""",
    "dmesg": "#!/bin/sh\ncat \"$T/kmsg\" 2>/dev/null\n",
    "systemctl": "#!/bin/sh\necho \"$*\" >> \"$T/systemctl.calls\"\nexit 0\n",
    # /health 200, /v1/models lists the model, /metrics nothing; the webhook (-K -) is recorded
    "curl": """#!/bin/sh
for a in "$@"; do last=$a; done
case " $* " in
  *" -K - "*) sed 's/^/config: /' >> "$T/webhook.calls"; echo "args: $*" >> "$T/webhook.calls"; exit 0 ;;
esac
case "$last" in
  */health) printf 200 ;;
  */v1/models) printf '{"data": [{"id": "%s"}]}' "$MODEL" ;;
  *) exit 22 ;;
esac
""",
    "drain": """#!/bin/sh
echo "$1 $2" >> "$T/drain.calls"
case "$1" in
  out) echo drain > "$T/door.$2" ;;
  in) echo ready > "$T/door.$2" ;;
  state) cat "$T/door.$2" 2>/dev/null || echo ready ;;
esac
""",
}


def setup(tmp_path):
    s = settings.parse({})
    plan = make_plan("h100-1", GPUS, {})
    text = render.health_config(plan, s, front_door=True)
    for real, fake in (("/usr/local/bin/nemofleet-drain", "drain"), ("/var/lib/nemofleet/health", "state"),
                       ("/var/lib/nemofleet/gpu-resets", "resets"), ("/etc/nemofleet/health.conf", "health.conf"),
                       ("/etc/nemofleet/api-auth.header", "none")):
        text = text.replace(real, str(tmp_path / fake))
    (tmp_path / "health.json").write_text(text)
    (tmp_path / "health.py").write_text(render.health_program())
    (tmp_path / "bin").mkdir()
    for name, body in STUBS.items():
        where = tmp_path / ("drain" if name == "drain" else f"bin/{name}")
        where.write_text(body)
        where.chmod(0o755)
    write_gpus(tmp_path, {})
    return plan


def write_gpus(tmp_path, faults):
    rows = []
    for g in GPUS:
        r = {"index": str(g.index), "uuid": g.uuid, "pci.bus_id": g.bus_id, **HEALTHY, **faults.get(g.index, {})}
        rows.append(r)
    (tmp_path / "gpus.json").write_text(json.dumps(rows))


def run(tmp_path, plan, **env):
    e = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "T": str(tmp_path), "PROM_DIR": str(tmp_path / "prom"),
         "MODEL": plan.served_name, "WEBHOOK_URL": "http://hook.example/x", "FAIL_RESTART": "1",
         "RESTART_GRACE": "0", **env}
    r = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "health.py"), str(tmp_path / "health.json")],
                       capture_output=True, text=True, env=e, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    return r, prom


def calls(tmp_path, name):
    """The stub's calls; for the drain script, those that change the front door (not `state`)."""
    p = tmp_path / f"{name}.calls"
    out = p.read_text().splitlines() if p.exists() else []
    return [c for c in out if not c.startswith("state ")] if name == "drain" else out


def test_a_gpu_that_turns_sick_is_drained_once_never_restarted_and_returns_after_n_healthy_checks(tmp_path):
    plan = setup(tmp_path)
    r, prom = run(tmp_path, plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(calls(tmp_path, "smi")) == 1  # one nvidia-smi call for every GPU
    assert calls(tmp_path, "smi")[0] == f"--query-gpu={','.join(HEALTH_FIELDS)} --format=csv,noheader,nounits"
    assert 'nemofleet_gpu_healthy{gpu="3",UUID="%s",pci_bus_id="00000000:1B:00.0"} 1' % GPUS[3].uuid in prom
    assert 'nemofleet_gpu_pcie_link_width{gpu="0",' in prom and 'nemofleet_gpu_temperature_celsius{gpu="2",' in prom
    assert "nemofleet_gpu_retired_pages_pending" not in prom  # [N/A]: not reported, not 0
    assert calls(tmp_path, "drain") == [] and calls(tmp_path, "webhook") == []

    # Xid 79 on GPU 3 (bus 1b): drained once, the webhook once, no restart
    (tmp_path / "kmsg").write_text("[ 1234.500000] NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
                                   "GPU has fallen off the bus.\n")
    r, prom = run(tmp_path, plan)
    assert r.returncode == 1
    assert f"GPU 3 ({GPUS[3].uuid}) is sick: Xid 79 in the kernel log since boot; reboot the host; instance(s) " \
           "nemotron-3 out of the front door, not restarted" in r.stdout
    assert calls(tmp_path, "drain") == ["out nemotron-3"]
    hooks = [h for h in calls(tmp_path, "webhook") if h.startswith("args: ")]
    assert len(hooks) == 1 and '"instance":"nemotron-3","state":"gpu_sick"' in hooks[0] and "Xid 79" in hooks[0]
    assert "http://hook.example" not in " ".join(hooks)  # the URL went on stdin, never on the command line
    assert 'nemofleet_gpu_healthy{gpu="3",' in prom and prom.count("nemofleet_gpu_healthy{") == 4
    assert 'nemofleet_gpu_healthy{gpu="3",UUID="%s",pci_bus_id="00000000:1B:00.0"} 0' % GPUS[3].uuid in prom
    assert 'nemofleet_gpu_xid_last{gpu="3",UUID="%s",pci_bus_id="00000000:1B:00.0"} 79' % GPUS[3].uuid in prom
    assert 'nemofleet_vllm_up{instance="nemotron-3",' in prom and prom.count("} 0\n") >= 2
    assert not [c for c in calls(tmp_path, "systemctl") if c.startswith("restart")]

    # the next runs: still out (its /health is 200, as vLLM's on a failing GPU), no second drain,
    # no second webhook, never restarted (FAIL_RESTART=1 would restart a failing instance)
    for _ in range(2):
        r, prom = run(tmp_path, plan)
        assert r.returncode == 1 and "instance nemotron-3 drained: GPU 3:" in r.stdout
    assert calls(tmp_path, "drain").count("out nemotron-3") == 1 and "in nemotron-3" not in calls(tmp_path, "drain")
    assert len([h for h in calls(tmp_path, "webhook") if h.startswith("args: ")]) == 1
    assert not [c for c in calls(tmp_path, "systemctl") if c.startswith("restart")]
    assert (tmp_path / "state" / f"gpu-{GPUS[3].uuid}.sick").read_text().startswith(f"{GPUS[3].uuid} ")

    # reset recorded after the Xid: healthy; with GPU_RETURN_AFTER=2 it returns at the 2nd healthy check.
    # The Xid's time is boot time + its kernel-log timestamp (1234.5 s), as the health program reads
    # them: the reset is placed after that event, whatever this machine's uptime
    btime = next(int(ln.split()[1]) for ln in open("/proc/stat") if ln.startswith("btime "))
    (tmp_path / "resets").write_text(f"00000000:1B:00.0 {btime + 1234 + 5}\n")
    r, _ = run(tmp_path, plan, GPU_RETURN_AFTER="2")
    assert r.returncode == 1 and "in nemotron-3" not in calls(tmp_path, "drain")
    r, prom = run(tmp_path, plan, GPU_RETURN_AFTER="2")
    assert r.returncode == 0, r.stdout
    assert "GPU 3 (%s) healthy for 2 checks in a row: instance(s) nemotron-3 return" % GPUS[3].uuid in r.stdout
    assert calls(tmp_path, "drain")[-1] == "in nemotron-3"
    assert not (tmp_path / "state" / f"gpu-{GPUS[3].uuid}.sick").exists()


def test_remap_pending_and_a_refused_field_and_no_return_without_the_operator(tmp_path):
    plan = setup(tmp_path)
    write_gpus(tmp_path, {1: {"remapped_rows.pending": "Yes"}})
    r, prom = run(tmp_path, plan)
    assert r.returncode == 1 and "GPU 1 (%s) is sick: remapped_rows.pending is Yes" % GPUS[1].uuid in r.stdout
    assert 'nemofleet_gpu_row_remap_pending{gpu="1",' in prom
    write_gpus(tmp_path, {})
    for _ in range(3):  # healthy again, but GPU_RETURN_AFTER is 0: it waits for the deploy
        r, _ = run(tmp_path, plan)
        assert r.returncode == 1
    assert calls(tmp_path, "drain") == ["out nemotron-1"]

    # a driver that does not know gpu_recovery_action: dropped once, remembered, one call afterwards
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(STUBS["nvidia-smi"].replace(
        "fields = q[0]", "fields = q[0]\nif 'gpu_recovery_action' in q[0]:\n"
        "    print('Field \"gpu_recovery_action\" is not a valid field to query.'); print(); sys.exit(2)\nfields = q[0]"))
    (tmp_path / "smi.calls").unlink()
    run(tmp_path, plan)
    run(tmp_path, plan)
    assert len(calls(tmp_path, "smi")) == 3 and "gpu_recovery_action" not in calls(tmp_path, "smi")[-1]


def test_the_deploy_returns_a_drained_gpu_that_reads_healthy_and_does_nothing_otherwise():
    from nemofleet import desired
    from nemofleet.facts.gpuhealth import GpuHealth
    from nemofleet import hostcmd as commands
    from test_desired import SECRETS
    from test_preflight import DATA, ready

    f = ready()
    uuid = f["gpus"]["gpus"][0]["uuid"]
    fact = GpuHealth().process(["SMI:index, uuid, pci.bus_id", f"SMI:0, {uuid}, 00000000:00:06.0", "RC=0",
                                f"DRAINED:{uuid} 1764846000 0 Xid 79 in the kernel log since boot"])
    assert fact["drained"] == {uuid: {"since": 1764846000, "index": 0, "reason": "Xid 79 in the kernel log since boot"}}
    f["health"] = fact  # the GPU reads healthy now (no Xid in the log: the host was rebooted)
    d = desired.build("h200-1", DATA, f, SECRETS)
    assert not d.refusals, d.refusals
    assert d.gpu_returns == commands.gpu_returns({uuid: ["nemotron-0"]},
                                                 d.front_door)
    # one argument list: the health lock, then remote/gpu_return.py with the markers' directory, the drain
    # script, the front door, the GPU and its instances (test_fleet_commands.py runs it)
    w = shlex.split(d.gpu_returns[0])
    assert w[:4] == ["flock", "-w", "900", "/run/lock/nemofleet-health.lock"]
    assert w[4:8] == list(remote.PYTHON) and w[8] == remote.source("gpu_return")
    assert w[9:] == ["/var/lib/nemofleet/health", "/usr/local/bin/nemofleet-drain", str(int(d.front_door)), uuid,
                     "nemotron-0"]
    # still sick at the deploy: left out of the plan, so nothing returns; no marker: nothing at all
    f["health"] = dict(fact, xids=[{"code": 79, "bus_id": "0000:00:06", "time": None, "text": ""}])
    assert desired.build("h200-1", DATA, f, SECRETS).refusals  # its only GPU: no GPU may serve
    f["health"] = dict(fact, drained={})
    assert desired.build("h200-1", DATA, f, SECRETS).gpu_returns == []
    with_door = shlex.split(commands.gpu_returns({"GPU-x": ["nemotron-3"]}, True)[0])
    assert with_door[9:] == ["/var/lib/nemofleet/health", "/usr/local/bin/nemofleet-drain", "1", "GPU-x", "nemotron-3"]


def test_status_shows_the_sick_gpu_and_why():
    from nemofleet import hostcmd as commands
    from nemofleet.fleet.status import gpu_lines

    # the drained GPUs' markers, HEALTH_STATE/gpu-*.sick, are read by remote/host_status.py (test_remote_lock.py runs it)
    assert "/var/lib/nemofleet/health" in shlex.split(commands.status("/srv/models", "/var/lib/prom"))[7:]
    assert gpu_lines(["gpusick GPU-3 1764846000 3 Xid 79 in the kernel log since boot; reboot the host",
                      "prom x 1", "gpusick garbage"]) == [
        "GPU 3 (GPU-3) SICK since 2025-12-04T11:00:00Z, its instances out of the front door: "
        "Xid 79 in the kernel log since boot; reboot the host"]
