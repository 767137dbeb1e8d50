"""GPU inventory, driver/CUDA and NVIDIA Container Toolkit facts."""

from __future__ import annotations

import csv
import re

from pyinfra.api import FactBase

from ..nvsmi import (  # noqa: F401  (the names the facts and their tests use)
    CTK_TIMEOUT,
    GPU_FIELDS,
    MEMINFO_TIMEOUT,
    MEMTOTAL,
    SMI_EXIT,
    SMI_TIMEOUT,
    TIMED_OUT,
    Unreadable)


class StrictFact(FactBase):
    """A fact with a strict `parse()` (raises Unreadable) whose `process()` never raises: what
    pyinfra stores is the fallback value the Unreadable carries; HostFacts calls parse() to get the
    sentence (read_part)."""

    def process(self, output):
        try:
            return self.parse(output)
        except Unreadable as exc:
            return exc.value


def _rc_split(lines: list[str]) -> tuple[list[str], int | None]:
    if lines and lines[-1].startswith("RC=") and lines[-1][3:].isdigit():
        return lines[:-1], int(lines[-1][3:])
    return lines, None


def _na(value: str) -> str | None:
    return None if value in ("[N/A]", "N/A", "[Not Supported]", "") else value


def _gpu_row(row: list[str], memtotal_kb: int | None = None) -> dict:
    """One --query-gpu row; ValueError when a field is not what nvidia-smi prints for it.

    A unified-memory board (DGX Spark GB10, Jetson Thor) prints memory.total as [N/A]: its GPU
    shares the system memory, so the row takes MemTotal (what vLLM sees there as GPU memory) and
    says `unified: True` (docs/recipes.md#unified-memory); Unreadable when MemTotal is unknown."""
    if len(row) != len(GPU_FIELDS):
        raise ValueError(f"{len(row)} fields, not {len(GPU_FIELDS)}")
    r = dict(zip(GPU_FIELDS, (c.strip() for c in row)))
    out = {
        "index": int(r["index"]), "uuid": r["uuid"], "name": r["name"],
        "memory_mib": 0, "cc": _na(r["compute_cap"]),
        "bus_id": r["pci.bus_id"], "mig": _na(r["mig.mode.current"]) or "N/A",
        "persistence": r["persistence_mode"], "driver": _na(r["driver_version"]),
    }
    if _na(r["memory.total"]) is not None:
        out["memory_mib"] = int(float(r["memory.total"]))
    elif memtotal_kb:
        out["memory_mib"], out["unified"] = memtotal_kb // 1024, True
    else:
        raise Unreadable(f"nvidia-smi reports no memory.total ({r['memory.total']}) for GPU {out['index']} "
                         f"({out['name']}), as unified-memory boards do, and /proc/meminfo gave no MemTotal to "
                         "size it by; check that /proc/meminfo is readable on the host")
    return out


def _memtotal(lines: list[str]) -> tuple[list[str], int | None]:
    """(the other lines, MemTotal in kB or None): the MEMTOTAL_KB= line typed at the edge."""
    rest, kb = [], None
    for line in lines:
        if line.startswith(MEMTOTAL):
            value = line[len(MEMTOTAL):].strip()
            kb = int(value) if value.isdigit() and int(value) > 0 else None
        else:
            rest.append(line)
    return rest, kb


class NvidiaGpus(StrictFact):
    """GPUs from `nvidia-smi --query-gpu`: {"smi", "rc", "error", "driver", "gpus": [...]}.

    `smi` is False when nvidia-smi is not installed; `rc`/`error` carry its failure (rc 124:
    it did not answer within SMI_TIMEOUT s). process() never raises: output it cannot read
    ("[Unknown Error]" in a field) gives `error` and no GPUs; parse() raises Unreadable then,
    and when the GPUs are listed without a driver version, so HostFacts refuses the host with
    that sentence instead of judging a driver it does not know.
    """

    def command(self) -> str:
        # MemTotal first (a unified-memory GPU has no memory.total of its own), so RC= stays last
        return ("command -v nvidia-smi >/dev/null 2>&1 || { echo NOCMD; exit 0; }; "
                f"timeout {MEMINFO_TIMEOUT} awk '/^MemTotal:/ {{print \"{MEMTOTAL}\" $2; exit}}' /proc/meminfo 2>/dev/null; "
                f"timeout {SMI_TIMEOUT} nvidia-smi --query-gpu={','.join(GPU_FIELDS)} "
                '--format=csv,noheader,nounits 2>&1; echo "RC=$?"')

    def default(self):
        return {"smi": False, "rc": None, "error": "nvidia-smi not found", "driver": None, "gpus": []}


    def parse(self, output):
        lines = [line for line in output if line.strip()]
        if lines[:1] == ["NOCMD"]:
            return self.default()
        lines, memtotal_kb = _memtotal(lines)
        lines, rc = _rc_split(lines)
        if rc == TIMED_OUT:
            sentence = f"nvidia-smi did not answer within {SMI_TIMEOUT} s (hung driver?)"
            raise Unreadable(sentence, {"smi": True, "rc": rc, "error": sentence, "driver": None, "gpus": []})
        if rc:
            text = " ".join(lines).strip()
            return {"smi": True, "rc": rc, "error": text or SMI_EXIT.get(rc, f"nvidia-smi exit {rc}"),
                    "driver": None, "gpus": []}
        try:
            gpus = [_gpu_row(row, memtotal_kb) for row in csv.reader(lines, skipinitialspace=True)]
        except Unreadable as exc:
            raise Unreadable(str(exc), {"smi": True, "rc": rc, "error": str(exc), "driver": None, "gpus": []}) from None
        except ValueError:
            sentence = f"nvidia-smi printed output nemofleet cannot read: {lines[0].strip()[:200]}"
            raise Unreadable(sentence, {"smi": True, "rc": rc, "error": sentence, "driver": None, "gpus": []}) from None
        out = {"smi": True, "rc": 0, "error": None, "driver": gpus[0]["driver"] if gpus else None, "gpus": gpus}
        if gpus and not out["driver"]:
            raise Unreadable(f"nvidia-smi lists {len(gpus)} GPU(s) but reports no driver version "
                             "([N/A]); nemofleet cannot check it against the CUDA the image needs: "
                             "run nvidia-smi on the host and reinstall the driver if it says the same", out)
        return out


class NvidiaCudaVersion(StrictFact):
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
        value = _na(lines[0]) if lines else None
        if value is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", value):
            raise Unreadable(f"nvidia-smi -q -x printed a CUDA version nemofleet cannot read: {value[:80]}")
        return value


class ContainerToolkit(StrictFact):
    """NVIDIA Container Toolkit: {"version", "hook", "runtime", "cdi_specs", "cdi_refresh"}."""

    def command(self) -> str:
        return (f"v=$(timeout {CTK_TIMEOUT} nvidia-ctk --version 2>/dev/null); [ $? -eq {TIMED_OUT} ] && echo ctk_timeout=1; "
                "echo ctk=$(printf '%s\\n' \"$v\" | awk '/CLI version/{print $NF}'); "
                "command -v nvidia-container-runtime-hook >/dev/null 2>&1 && echo hook=1; "
                "command -v nvidia-container-runtime >/dev/null 2>&1 && echo runtime=1; "
                "for f in /etc/cdi/nvidia.yaml /var/run/cdi/nvidia.yaml; do [ -s $f ] && echo cdi=$f; done; "
                "echo cdi_refresh=$(systemctl is-enabled nvidia-cdi-refresh.path 2>/dev/null); true")

    def default(self):
        return {"version": None, "hook": False, "runtime": False, "cdi_specs": [], "cdi_refresh": False}


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
