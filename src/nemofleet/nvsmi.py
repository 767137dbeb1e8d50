"""What nvidia-smi prints, and how nemofleet types it: query fields, exit codes, timeouts, the
health fields' types and the one exception a tool's unreadable output raises.

Pure (no pyinfra): the facts (facts/gpu.py, facts/gpuhealth.py) run the commands and parse with
these; the decision (gpuhealth.py, render.py) reads the same names without loading pyinfra.
"""

from __future__ import annotations

import re

from .gpu_classes import UNIFIED  # noqa: F401  (the boards whose memory is the system's)
from .valuetypes import CONTROL, Unreadable, host_number, shown  # noqa: F401  (Unreadable: the facts' name for it)

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap",
              "pci.bus_id", "mig.mode.current", "persistence_mode")

# nvidia-smi exit codes (nvidia-smi(1), RETURN VALUE)
SMI_EXIT = {6: "no NVIDIA GPU was found", 9: "the NVIDIA driver is not loaded",
            14: "the GPU's infoROM is corrupted", 15: "a GPU has fallen off the bus"}


SMI_TIMEOUT = 20  # nvidia-smi answers in well under a second; 20 s means the driver hangs
MEMINFO_TIMEOUT = 5  # reading /proc/meminfo is instant
MEMTOTAL = "MEMTOTAL_KB="  # the line NvidiaGpus adds after nvidia-smi's: /proc/meminfo's MemTotal
CTK_TIMEOUT = 20
TIMED_OUT = 124  # timeout(1)'s exit status when it had to stop the command


# Query fields, as `nvidia-smi --help-query-gpu` names them (driver 580 on an H200 accepts every
# one, docs/gpu-health.md). Identity first: the driver always knows those three.
IDENTITY = ("index", "uuid", "pci.bus_id")
COUNTS = ("ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
          "remapped_rows.correctable", "remapped_rows.uncorrectable",
          "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
          "temperature.gpu")
YES_NO = ("retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure")
ACTIVE = ("clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
          "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown")
HEALTH_FIELDS = IDENTITY + ("ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
                            "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
                            "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                            "remapped_rows.failure") + ACTIVE + (
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "fabric.state", "fabric.status", "temperature.gpu", "persistence_mode", "gpu_recovery_action")

# the GPU query's own kinds: numbers, and the MIG modes (any other text there is unreadable: a
# "[Unknown Error]" read as "MIG off" would plan whole-GPU instances on a MIG GPU)
NUMBERS = COUNTS + ("index", "memory.total")
MIG_MODES = ("Enabled", "Disabled")

NOT_REPORTED = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
LOST = "[GPU is lost]"  # NVML_ERROR_GPU_IS_LOST, as nvidia-smi prints it (docs/gpu-health.md)
XID_TAIL = 200  # Xid lines kept: a flapping GPU cannot grow the fact without bound
RESETS_FILE = "/var/lib/nemofleet/gpu-resets"  # "PCI_BUS_ID UNIX_TIME" per reset nemofleet recorded
# "UUID SINCE INDEX REASON": a GPU the health script found sick and drained (remote/health.py)
SICK_GLOB = "/var/lib/nemofleet/health/gpu-*.sick"
LOG_TIMEOUT = 10
SMI_HUNG = "SMI_HUNG"  # HostFacts: the GPU query of the same command timed out; the health query is not tried
# `NVRM: Xid (PCI:0000:07:00): 79, pid=..., GPU has fallen off the bus.` after dmesg's
# `[seconds since boot]` (journalctl -k -o short-monotonic prints the same bracket)
_XID = re.compile(r"^\[\s*([0-9.]+)\].*NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): ([0-9]+)(?:,\s*(.*))?$")
XID_BUS = re.compile(r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(\.[0-7])?")  # a bus id as an Xid line gives it
# what nvidia-smi prints for a query field its driver does not know (exit 2): a 470 driver's compute_cap
REFUSED_FIELD = re.compile(r'Field "([^"]{1,64})" is not a valid field to query')


def bus_key(bus_id: str) -> str:
    """'00000000:07:00.0' (nvidia-smi) and '0000:07:00' (an Xid line) -> '0000:07:00'."""
    parts = bus_id.strip().lower().split(".")[0].split(":")
    if len(parts) < 3:
        return bus_id.strip().lower()
    return f"{parts[-3][-4:]}:{parts[-2]}:{parts[-1]}"


def typed(name: str, value, where: str = ""):
    """One value of query field `name`, typed; Unreadable (one sentence) when it is not what
    nvidia-smi prints for that field. Accepts an already-typed value too (facts files)."""
    if value is None or isinstance(value, bool) and name in YES_NO + ACTIVE:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and name in NUMBERS:
        if 0 <= value <= 2**53:  # a count, a temperature, a link width: never negative, never absurd
            return value
    if not isinstance(value, str):  # a facts file's number, list or mapping where nvidia-smi prints text
        raise Unreadable(f"the health facts hold {shown(value)} for {name}{where}, which nvidia-smi never prints; "
                         "write them with `pyinfra INVENTORY --json fact nemofleet.facts.host.HostFacts`")
    text = value.strip()
    if text in NOT_REPORTED:
        return None
    if name in NUMBERS:
        count = host_number(text, 0, 2**53)
        if count is not None:
            return count
    elif name in YES_NO:
        if text in ("Yes", "No"):
            return text == "Yes"
    elif name in ACTIVE:
        if text in ("Active", "Not Active"):
            return text == "Active"
    elif name == "mig.mode.current":
        if text in MIG_MODES:
            return text
    elif not (text.startswith("[") and text.endswith("]")) and len(text) <= 200 and not CONTROL.search(text):
        return text
    raise Unreadable(f"nvidia-smi printed {shown(text)} for {name}{where}, which nemofleet cannot read; "
                     "run nvidia-smi -q on the host")
