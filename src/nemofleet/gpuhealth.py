"""GPU admission: which GPUs may serve, from the health fact (facts/gpuhealth.py). Pure functions.

A GPU that must not serve is left out of the plan like a MIG GPU, with one sentence: which GPU,
what was seen, what to do. Degraded PCIe links and thermal/power slowdowns are warnings. On an
NVSwitch system a fabric manager that is not running, or not of the driver's version, refuses the
host. docs/gpu-health.md has the table of signal -> action and its sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .factmodel import FabricManager, Health, parse
from .nvsmi import bus_key


class HealthError(ValueError):
    """One sentence: the health facts of this host cannot be read."""


# Xids that mean the GPU must stop serving (NVIDIA's Xid catalog puts them in the RESET_GPU or
# RESTART_BM resolution buckets; docs/gpu-health.md), with what they mean.
DRAIN_XIDS = {
    48: "an uncorrectable double-bit ECC error",
    62: "an internal micro-controller (PMU) halt",
    64: "a row-remapping failure",
    74: "an NVLink error",
    79: "the GPU has fallen off the bus",
    95: "an uncontained ECC error",
    119: "a GSP RPC timeout",
    120: "a GSP error",
    140: "an unrecovered ECC error",
    154: "a change of the GPU recovery action",
}
REPEATED_XID64 = 2  # Xid 64 seen this often since boot: the memory cannot protect itself, replace it

SLOWDOWNS = {
    "clocks_event_reasons.hw_slowdown": "HW slowdown",
    "clocks_event_reasons.hw_thermal_slowdown": "HW thermal slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown": "HW power brake slowdown",
    "clocks_event_reasons.sw_thermal_slowdown": "SW thermal slowdown",
}


@dataclass
class Admission:
    admitted: list  # the GPUs (plan.Gpu) that may serve, in the order given
    left_out: dict = field(default_factory=dict)  # uuid -> one sentence
    warnings: list[str] = field(default_factory=list)


def read(health) -> Health:
    """A host's typed health part (factmodel.Health, typed once at the edge). A mapping (a test's,
    a hand-written fixture's) is typed through the same model; HealthError with its one sentence
    when it is not of that type."""
    if health is None:
        return Health()
    if not isinstance(health, Health):
        typed, problems = parse({"health": health})  # the edge's own parser, once
        if problems:
            raise HealthError(f"the health facts cannot be read: {problems[0]}; write them with "
                              "`pyinfra INVENTORY --json fact nemofleet.facts.host.HostFacts`")
        health = typed.health
    return health


def _row_of(gpu, rows) -> dict | None:
    """The GPU's health row by its uuid, else by its bus id (a row is never empty: it has a uuid)."""
    key = bus_key(gpu.bus_id) if getattr(gpu, "bus_id", "") else None
    return (next((r for r in rows if r["uuid"] == gpu.uuid), None)
            or next((r for r in rows if key and r.get("pci.bus_id") and bus_key(r["pci.bus_id"]) == key), None))


def _xids_of(gpu, row: dict | None, h: Health) -> tuple[list, int]:
    """(Xid events that count for this GPU: after the boot and its last recorded reset, the
    number of Xid 64 since boot)."""
    bus = getattr(gpu, "bus_id", "") or (row or {}).get("pci.bus_id") or ""
    if not bus:
        return [], 0
    key = bus_key(bus)
    mine = [x for x in h.xids if bus_key(x.bus_id) == key]
    # an Xid's time is btime (whole seconds) + seconds since boot, so it can read up to 1 s late:
    # one within a second of a recorded reset is the reset's own
    reset = {bus_key(k): v for k, v in h.resets.items()}.get(key)
    since = max(h.boot_time or 0, reset + 1 if reset else 0)
    counting = [x for x in mine if x.time is None or x.time > since]
    return counting, sum(1 for x in mine if x.code == 64)


def sickness(gpu, row: dict | None, h: Health) -> str | None:
    """What was seen and what to do, when this GPU must not serve; None when it may."""
    n = gpu.index
    reset = f"drain it, run nvidia-smi -r -i {n} and record the reset (docs/gpu-health.md), then deploy again"
    counting, xid64 = _xids_of(gpu, row, h)
    bad = [x for x in counting if x.code in DRAIN_XIDS]
    if row is not None:
        if row.get("lost"):
            cause = f" after Xid {bad[-1].code} ({DRAIN_XIDS[bad[-1].code]})" if bad else ""
            return f"nvidia-smi reports it lost ([GPU is lost]){cause}; reboot the host"
        action = row.get("gpu_recovery_action")
        if action not in (None, "None"):
            todo = ("reboot the host" if "reboot" in action.lower()
                    else reset if "reset" in action.lower() or "drain" in action.lower() else
                    f"follow NVIDIA's recovery action {action!r}")
            return f"its GPU Recovery Action is {action}; {todo}"
        if row.get("remapped_rows.failure"):
            return ("remapped_rows.failure is Yes (a memory row could not be remapped: NVIDIA's RMA policy); "
                    "replace the GPU")
        if row.get("remapped_rows.pending"):
            return f"remapped_rows.pending is Yes (a row remap waits for a GPU reset); {reset}"
        ecc = row.get("ecc.errors.uncorrected.volatile.total")
        if ecc:
            return f"ecc.errors.uncorrected.volatile.total is {ecc} (uncorrectable ECC errors since its last reset); {reset}"
        if row.get("retired_pages.pending"):
            return f"retired_pages.pending is Yes (pages wait for retirement at the next reset); {reset}"
    if bad:
        x = bad[-1]
        seen = f"Xid {x.code} ({DRAIN_XIDS[x.code]}) in the kernel log since boot"
        if len({y.code for y in bad}) > 1:
            seen += f" (and Xid {', '.join(str(c) for c in sorted({y.code for y in bad} - {x.code}))})"
        if any(y.code == 79 for y in bad):
            return f"{seen}; reboot the host (a GPU that fell off the bus cannot be reset)"
        if xid64 >= REPEATED_XID64 and any(y.code == 64 for y in bad):
            return f"{seen}, Xid 64 {xid64} times since boot; replace the GPU"
        return f"{seen}; {reset}"
    return None


def _warnings(gpu, row: dict) -> list[str]:
    out = []
    for what in ("width", "gen"):
        cur, top = row.get(f"pcie.link.{what}.current"), row.get(f"pcie.link.{what}.max")
        if cur is not None and top is not None and cur < top:
            out.append(f"GPU {gpu.index} ({gpu.uuid}) runs its PCIe link at {what} {cur} of {top} "
                       f"(pcie.link.{what}.current < max; the driver lowers it when the GPU is idle): check it "
                       "under load and reseat the GPU or riser if it stays low")
    slow = [label for name, label in SLOWDOWNS.items() if row.get(name)]
    if slow:
        out.append(f"GPU {gpu.index} ({gpu.uuid}) is slowed down ({', '.join(slow)} active, "
                   f"temperature {row.get('temperature.gpu', '?')} C): check its cooling and power")
    return out


def admit(gpus: list, health) -> Admission:
    """The GPUs of `gpus` (plan.Gpu) that may serve, a sentence per GPU left out and warnings.
    HealthError when the health facts cannot be read."""
    h = read(health)
    rows = [{**r.values, "uuid": r.uuid, "lost": r.lost} for r in h.gpus]
    adm = Admission(admitted=[])
    for g in gpus:
        row = _row_of(g, rows)
        why = sickness(g, row, h)
        if why:
            adm.left_out[g.uuid] = f"GPU {g.index} ({g.uuid}) is left out of the plan: {why}"
            continue
        adm.admitted.append(g)
        if row is not None:
            adm.warnings += _warnings(g, row)
    return adm


# Grace-Blackwell NVL compute trays (GB200/GB300 NVL72, NVL36): their NVSwitches and the fabric
# manager are in the switch trays, so no nvidia-fabricmanager runs on the host; a GPU whose fabric
# state is Completed with status Success is registered with the fabric (leptonai/gpud#1106)
NVL_COMPUTE_TRAY = re.compile(r"\bGB[23]00\b", re.I)


def fabric_refusal(health, driver: str | None, names=()) -> str | None:
    """On an NVSwitch system (a GPU reports fabric.state), the fabric manager must run and be of
    the driver's version, or CUDA fails with error 802 (docs/gpu-health.md). On an NVL compute
    tray (`names`: the GPUs' names) every GPU must be registered with the fabric instead."""
    try:
        h = read(health)
    except HealthError:
        return None  # admit() says it
    rows = [r.values for r in h.gpus if r.values.get("fabric.state") is not None]
    if not rows:
        return None
    fm = h.fabric_manager or FabricManager()
    if any(NVL_COMPUTE_TRAY.search(n) for n in names):
        bad = next((r for r in rows if (r.get("fabric.state"), r.get("fabric.status")) != ("Completed", "Success")), None)
        if bad is not None:
            return (f"GPU {bad.get('index')} is not registered with the NVLink fabric (fabric.state {bad['fabric.state']}, "
                    f"status {bad.get('fabric.status') or 'not reported'}), so CUDA fails with error 802; on this NVL "
                    "compute tray the fabric manager runs on the NVSwitch trays: check it there, then deploy again")
    elif fm.active != "active":
        return (f"this is an NVSwitch system (fabric.state {rows[0]['fabric.state']}) but nvidia-fabricmanager is "
                f"{fm.active or 'not running'}, so CUDA fails with error 802; "
                "install nvidia-fabricmanager of the driver's version and systemctl enable --now nvidia-fabricmanager")
    if fm.active == "active" and driver and fm.version and fm.version != driver:
        return (f"nvidia-fabricmanager {fm.version} runs with driver {driver} on this NVSwitch system, and the two "
                "must be the same version (CUDA fails with error 802); install nvidia-fabricmanager "
                f"{driver} and restart it")
    return None


def returning(instances: list, health) -> dict[str, list[str]]:
    """{uuid: [instance names]} of the GPUs the health script drained (their marker is in the
    health fact) that this plan serves on again: the deploy puts those instances back in the
    front door and removes the marker, so a healthy GPU returns at the next deploy."""
    drained = health.drained if isinstance(health, Health) else {}
    out: dict[str, list[str]] = {}
    for uuid in sorted(drained):
        names = [i.name for i in instances if uuid in i.gpu_uuids]
        if names:
            out[uuid] = names
    return out
