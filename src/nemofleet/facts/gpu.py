"""GPU inventory, driver/CUDA and NVIDIA Container Toolkit facts."""

from __future__ import annotations

import csv
import re

from . import Fact
from ..nvsmi import (  # noqa: F401  (the names the facts and their tests use)
    CTK_TIMEOUT,
    GPU_FIELDS,
    MEMINFO_TIMEOUT,
    MEMTOTAL,
    NOT_REPORTED,
    SMI_EXIT,
    SMI_TIMEOUT,
    TIMED_OUT,
    UNIFIED,
    Unreadable,
    typed)
from ..valuetypes import host_number, shown


def _gpu_row(n: int, row: list[str], memtotal_kb: int | None, rows: int) -> dict:
    """The `n`th --query-gpu row of `rows`, each field typed as nvidia-smi prints it (nvsmi.typed);
    Unreadable naming the GPU (its index, else the row) and quoting the row otherwise.

    A unified-memory board (DGX Spark GB10, Jetson Thor: nvsmi.UNIFIED) prints memory.total as
    [N/A]: its GPU shares the system memory, so the row takes MemTotal (what vLLM sees there as GPU
    memory) and says `unified: True` (docs/recipes.md#unified-memory). A discrete GPU without a
    memory.total is unreadable: host RAM is not its memory."""
    first = host_number(row[0], 0, 1023) if row else None
    which = f"GPU {first}" if first is not None else f"row {n + 1} of {rows}"
    if len(row) != len(GPU_FIELDS):
        raise Unreadable(f"nvidia-smi printed a row of {len(row)} fields, not {len(GPU_FIELDS)}, for {which}: "
                         f"{shown(', '.join(row), 200)}; run nvidia-smi on the host")
    r = {f: typed(f, v, f" of {which}") for f, v in zip(GPU_FIELDS, row)}
    if r["index"] is None or r["uuid"] is None or r["name"] is None:
        raise Unreadable(f"nvidia-smi printed no index, uuid or name for {which}: {shown(', '.join(row), 200)}; "
                         "run nvidia-smi on the host")
    out = {"index": r["index"], "uuid": r["uuid"], "name": r["name"], "memory_mib": r["memory.total"],
           "cc": r["compute_cap"], "bus_id": r["pci.bus_id"], "mig": r["mig.mode.current"] or "N/A",
           "persistence": r["persistence_mode"], "driver": r["driver_version"]}
    if out["memory_mib"] is None:
        if not UNIFIED.search(out["name"]):
            raise Unreadable(f"nvidia-smi reports no memory.total ({row[3].strip()}) for {which} ({out['name']}), "
                             "which is not a unified-memory board (GB10, Jetson Thor) that shares the system memory; "
                             "run nvidia-smi -q -d MEMORY on the host")
        if not memtotal_kb:
            raise Unreadable(f"nvidia-smi reports no memory.total ({row[3].strip()}) for {which} ({out['name']}), "
                             "as unified-memory boards do, and /proc/meminfo gave no MemTotal to size it by; "
                             "check that /proc/meminfo is readable on the host")
        out["memory_mib"], out["unified"] = memtotal_kb // 1024, True
    return out


def _csv_row(line: str) -> list[str]:
    try:
        return next(csv.reader([line], skipinitialspace=True), [])
    except csv.Error:  # a NUL byte: no row nvidia-smi prints
        return [line]


class NvidiaGpus(Fact, part="gpus"):
    """GPUs from `nvidia-smi --query-gpu`: {"smi", "rc", "error", "driver", "gpus": [...]}.

    `smi` is False when nvidia-smi is not installed; `rc`/`error` carry its failure (rc 124:
    it did not answer within SMI_TIMEOUT s). Output it cannot read ("[Unknown Error]" in a
    field, a row of another shape) is Unreadable naming the row, with `error` and no GPUs as its
    value; so are GPUs listed without a driver version, so HostFacts refuses the host with that
    sentence instead of judging a driver it does not know.
    """

    def command(self) -> str:
        # MemTotal first (a unified-memory GPU has no memory.total of its own), so RC= stays last
        return ("command -v nvidia-smi >/dev/null 2>&1 || { echo NOCMD; exit 0; }; "
                f"timeout {MEMINFO_TIMEOUT} awk '/^MemTotal:/ {{print \"{MEMTOTAL}\" $2; exit}}' /proc/meminfo 2>/dev/null; "
                f"timeout {SMI_TIMEOUT} nvidia-smi --query-gpu={','.join(GPU_FIELDS)} "
                '--format=csv,noheader,nounits 2>&1; echo "RC=$?"')

    def parse(self, output):
        lines = [line for line in output if line.strip()]
        if lines[:1] == ["NOCMD"]:
            return self.default()
        # the MEMTOTAL_KB= line (MemTotal in kB) typed at the edge
        memtotal = [host_number(ln[len(MEMTOTAL):], 1, 2**50) for ln in lines if ln.startswith(MEMTOTAL)]
        memtotal_kb = memtotal[-1] if memtotal else None
        lines = [ln for ln in lines if not ln.startswith(MEMTOTAL)]
        rc = host_number(lines[-1][3:], 0, 255) if lines and lines[-1].startswith("RC=") else None
        lines = lines[:-1] if rc is not None else lines
        if rc == TIMED_OUT:
            sentence = f"nvidia-smi did not answer within {SMI_TIMEOUT} s (hung driver?)"
            raise Unreadable(sentence, {"smi": True, "rc": rc, "error": sentence, "driver": None, "gpus": []})
        if rc:
            text = " ".join(lines).strip()
            return {"smi": True, "rc": rc, "error": text or SMI_EXIT.get(rc, f"nvidia-smi exit {rc}"),
                    "driver": None, "gpus": []}
        try:
            gpus = [_gpu_row(n, _csv_row(line), memtotal_kb, len(lines)) for n, line in enumerate(lines)]
        except Unreadable as exc:
            raise Unreadable(str(exc), {"smi": True, "rc": rc, "error": str(exc), "driver": None, "gpus": []}) from None
        out = {"smi": True, "rc": 0, "error": None, "driver": gpus[0]["driver"] if gpus else None, "gpus": gpus}
        if gpus and not out["driver"]:
            raise Unreadable(f"nvidia-smi lists {len(gpus)} GPU(s) but reports no driver version "
                             "([N/A]); nemofleet cannot check it against the CUDA the image needs: "
                             "run nvidia-smi on the host and reinstall the driver if it says the same", out)
        return out


class NvidiaCudaVersion(Fact, part="cuda"):
    """Highest CUDA version the driver supports, from `nvidia-smi -q -x` (no query field exists);
    None when nvidia-smi is absent or says N/A. parse() raises Unreadable on a timeout or a value
    that is not a version."""

    def command(self) -> str:
        return ("command -v nvidia-smi >/dev/null 2>&1 || exit 0; "
                f"x=$(timeout {SMI_TIMEOUT} nvidia-smi -q -x 2>/dev/null); "
                f'[ $? -eq {TIMED_OUT} ] && echo TIMEOUT; '
                "printf '%s\\n' \"$x\" | sed -n 's:.*<cuda_version>\\(.*\\)</cuda_version>.*:\\1:p'")


    def parse(self, output):
        lines = [line.strip() for line in output if line.strip()]
        if "TIMEOUT" in lines:
            raise Unreadable(f"nvidia-smi -q -x did not answer within {SMI_TIMEOUT} s (hung driver?)")
        value = lines[0] if lines and lines[0] not in NOT_REPORTED else None
        if value is not None and not re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?", value):
            raise Unreadable(f"nvidia-smi -q -x printed a CUDA version nemofleet cannot read: {shown(value)}")
        return value


class ContainerToolkit(Fact, part="toolkit"):
    """NVIDIA Container Toolkit: {"version", "hook", "runtime", "cdi_specs", "cdi_refresh"}."""

    def command(self) -> str:
        return (f"v=$(timeout {CTK_TIMEOUT} nvidia-ctk --version 2>/dev/null); [ $? -eq {TIMED_OUT} ] && echo ctk_timeout=1; "
                "echo ctk=$(printf '%s\\n' \"$v\" | awk '/CLI version/{print $NF}'); "
                "command -v nvidia-container-runtime-hook >/dev/null 2>&1 && echo hook=1; "
                "command -v nvidia-container-runtime >/dev/null 2>&1 && echo runtime=1; "
                "for f in /etc/cdi/nvidia.yaml /var/run/cdi/nvidia.yaml; do [ -s $f ] && echo cdi=$f; done; "
                "echo cdi_refresh=$(systemctl is-enabled nvidia-cdi-refresh.path 2>/dev/null); true")

    def parse(self, output):
        out = self.default()
        timed_out = False
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "ctk_timeout":
                timed_out = True
            elif key == "ctk":
                out["version"] = value or None
            elif key in ("hook", "runtime"):
                out[key] = True
            elif key == "cdi":
                out["cdi_specs"].append(value)
            elif key == "cdi_refresh":
                out["cdi_refresh"] = value == "enabled"
        if timed_out:
            raise Unreadable(f"nvidia-ctk --version did not answer within {CTK_TIMEOUT} s", out)
        return out
