"""GPU inventory, driver/CUDA and NVIDIA Container Toolkit facts."""

from __future__ import annotations

import csv

from pyinfra.api import FactBase

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap",
              "pci.bus_id", "mig.mode.current", "persistence_mode")

# nvidia-smi exit codes (reference §2.2)
SMI_EXIT = {6: "no NVIDIA GPU was found", 9: "the NVIDIA driver is not loaded",
            14: "the GPU's infoROM is corrupted", 15: "a GPU has fallen off the bus"}


def _rc_split(lines: list[str]) -> tuple[list[str], int | None]:
    if lines and lines[-1].startswith("RC="):
        return lines[:-1], int(lines[-1][3:])
    return lines, None


def _na(value: str) -> str | None:
    return None if value in ("[N/A]", "N/A", "[Not Supported]", "") else value


class NvidiaGpus(FactBase):
    """GPUs from `nvidia-smi --query-gpu`: {"smi", "rc", "error", "driver", "gpus": [...]}.

    `smi` is False when nvidia-smi is not installed; `rc`/`error` carry its failure.
    """

    def command(self) -> str:
        return ("command -v nvidia-smi >/dev/null 2>&1 || { echo NOCMD; exit 0; }; "
                f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits 2>&1; "
                'echo "RC=$?"')

    def default(self):
        return {"smi": False, "rc": None, "error": "nvidia-smi not found", "driver": None, "gpus": []}

    def process(self, output):
        lines = [line for line in output if line.strip()]
        if lines[:1] == ["NOCMD"]:
            return self.default()
        lines, rc = _rc_split(lines)
        if rc:
            text = " ".join(lines).strip()
            return {"smi": True, "rc": rc, "error": text or SMI_EXIT.get(rc, f"nvidia-smi exit {rc}"),
                    "driver": None, "gpus": []}
        gpus = []
        for row in csv.reader(lines, skipinitialspace=True):
            if len(row) != len(GPU_FIELDS):
                return {"smi": True, "rc": rc, "error": "unexpected nvidia-smi output: " + ",".join(row),
                        "driver": None, "gpus": []}
            r = dict(zip(GPU_FIELDS, (c.strip() for c in row)))
            gpus.append({
                "index": int(r["index"]), "uuid": r["uuid"], "name": r["name"],
                "memory_mib": int(float(r["memory.total"])), "cc": _na(r["compute_cap"]),
                "bus_id": r["pci.bus_id"], "mig": _na(r["mig.mode.current"]) or "N/A",
                "persistence": r["persistence_mode"], "driver": r["driver_version"],
            })
        return {"smi": True, "rc": 0, "error": None,
                "driver": gpus[0]["driver"] if gpus else None, "gpus": gpus}


class NvidiaCudaVersion(FactBase):
    """Highest CUDA version the driver supports, from `nvidia-smi -q -x` (no query field exists)."""

    def command(self) -> str:
        return ("command -v nvidia-smi >/dev/null 2>&1 && "
                "nvidia-smi -q -x 2>/dev/null | sed -n 's:.*<cuda_version>\\(.*\\)</cuda_version>.*:\\1:p' "
                "|| true")

    def process(self, output):
        for line in output:
            if line.strip():
                return line.strip()
        return None


class ContainerToolkit(FactBase):
    """NVIDIA Container Toolkit: {"version", "hook", "runtime", "cdi_specs", "cdi_refresh"}."""

    def command(self) -> str:
        return ("echo ctk=$(nvidia-ctk --version 2>/dev/null | awk '/CLI version/{print $NF}'); "
                "command -v nvidia-container-runtime-hook >/dev/null 2>&1 && echo hook=1; "
                "command -v nvidia-container-runtime >/dev/null 2>&1 && echo runtime=1; "
                "for f in /etc/cdi/nvidia.yaml /var/run/cdi/nvidia.yaml; do [ -s $f ] && echo cdi=$f; done; "
                "echo cdi_refresh=$(systemctl is-enabled nvidia-cdi-refresh.path 2>/dev/null); true")

    def default(self):
        return {"version": None, "hook": False, "runtime": False, "cdi_specs": [], "cdi_refresh": False}

    def process(self, output):
        out = self.default()
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "ctk":
                out["version"] = value or None
            elif key in ("hook", "runtime"):
                out[key] = True
            elif key == "cdi":
                out["cdi_specs"].append(value)
            elif key == "cdi_refresh":
                out["cdi_refresh"] = value == "enabled"
        return out
