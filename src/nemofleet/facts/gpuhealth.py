"""GPU health facts: per-GPU health fields, the GPU Recovery Action, Xid events since boot, the
GPU resets nemofleet recorded and the fabric manager, in one bounded command (docs/gpu-health.md).

Values keep nvidia-smi's query names (`remapped_rows.pending`, ...) and are typed here, at the
edge: counts are ints, Yes/No and Active/Not Active are booleans, and a value the driver does not
report ("[N/A]", "N/A", "[Not Supported]", or a field the driver refuses to query) is None, never
a fault. A value nemofleet cannot read ("[Unknown Error]", text in a count) raises Unreadable with
one sentence, which refuses that host only.
"""

from __future__ import annotations

from typing import Any

import re


from . import Fact
from .gpu import SMI_TIMEOUT, TIMED_OUT, Unreadable, _csv_row  # noqa: F401
from ..valuetypes import gpu_uuid_problem, host_number, host_time, shown

from ..nvsmi import (  # noqa: F401  (HEALTH_FIELDS, bus_key, typed: the names its tests use)
    HEALTH_FIELDS, LOG_TIMEOUT, LOST, RESETS_FILE, SICK_GLOB, SMI_HUNG, XID_BUS, XID_TAIL, _XID, bus_key, typed)


class GpuHealth(Fact, part="health"):
    """{"gpus": [{query field: typed value}], "refused_fields", "xids": [{"code", "bus_id", "uptime",
    "time", "text"}], "boot_time", "resets": {bus: unix time}, "fabric_manager": {"version", "active"},
    "drained": {uuid: {"since", "index", "reason"}} (GPUs the health script drained), "error"}.

    One bounded command: the query is retried without each field the driver refuses (at most once
    per field), the Recovery Action comes from `nvidia-smi -q` only when the query cannot give it,
    and the kernel log is cut to its last XID_TAIL Xid lines. Exits 0 whatever happens."""

    def command(self) -> str:
        fields = ",".join(HEALTH_FIELDS)
        return ("command -v nvidia-smi >/dev/null 2>&1 || { echo NOCMD; exit 0; }; "
                f"f={fields}; n=0; "
                f"while :; do out=$(timeout {SMI_TIMEOUT} nvidia-smi --query-gpu=$f --format=csv,nounits 2>&1); rc=$?; "
                "bad=$(printf '%s\\n' \"$out\" | sed -n 's/^Field \"\\(.*\\)\" is not a valid field to query.*/\\1/p' | head -n 1); "
                f"[ \"$rc\" = 2 ] && [ -n \"$bad\" ] && [ $n -lt {len(HEALTH_FIELDS)} ] || break; "
                "echo \"REFUSED=$bad\"; f=$(printf ',%s,' \"$f\" | awk -v b=\",$bad,\" '{i = index($0, b); "
                "if (i) $0 = substr($0, 1, i) substr($0, i + length(b)); gsub(/^,|,$/, \"\"); print}'); n=$((n + 1)); done; "
                "printf '%s\\n' \"$out\" | sed 's/^/SMI:/'; echo \"RC=$rc\"; "
                "case \",$f,\" in *,gpu_recovery_action,*) ;; *) "
                f"timeout {SMI_TIMEOUT} nvidia-smi -q 2>/dev/null | grep -E '^GPU [0-9A-Fa-f:.]+$|GPU Recovery Action' | sed 's/^/Q:/';; esac; "
                "echo \"BTIME=$(awk '/^btime/{print $2}' /proc/stat 2>/dev/null)\"; "
                f"{{ timeout {LOG_TIMEOUT} dmesg 2>/dev/null || timeout {LOG_TIMEOUT} journalctl -k -b -o short-monotonic --no-pager 2>/dev/null; }} "
                f"| grep -F 'NVRM: Xid' | tail -n {XID_TAIL} | sed 's/^/XID:/'; "
                f"tail -n 100 {RESETS_FILE} 2>/dev/null | sed 's/^/RESET:/'; "
                f"for m in {SICK_GLOB}; do [ -f \"$m\" ] && head -n 1 \"$m\" | sed 's/^/DRAINED:/'; done; "
                "command -v nv-fabricmanager >/dev/null 2>&1 && echo \"FM_VERSION=$(timeout 5 nv-fabricmanager --version 2>/dev/null "
                "| sed -n 's/.*[Vv]ersion is *: *//p' | head -n 1)\"; "
                "echo \"FM_ACTIVE=$(timeout 5 systemctl is-active nvidia-fabricmanager 2>/dev/null)\"; true")

    def parse(self, output):
        out = self.default()
        smi: list[str] = []
        q: list[str] = []
        rc = None
        # "TAG:value" lines: nvidia-smi's query, `nvidia-smi -q`'s recovery actions, Xid lines, resets, drained GPUs
        tagged = {"SMI": smi.append, "Q": q.append, "XID": lambda v: _xid(v, out), "RESET": lambda v: _reset(v, out),
                  "DRAINED": lambda v: _drained(v, out)}
        for raw in output:
            line = raw.rstrip("\n")
            key, sep, value = line.partition(":")
            if line == "NOCMD":
                return out
            if line == SMI_HUNG:  # the gpus part refuses the host with its own sentence
                out["error"] = "not read: nvidia-smi did not answer the GPU query"
                return out
            if line.startswith("REFUSED="):
                out["refused_fields"].append(line[len("REFUSED="):].strip())
            elif line.startswith("RC=") and host_number(line[3:], 0, 255) is not None:
                rc = host_number(line[3:], 0, 255)
            elif line.startswith("BTIME="):
                out["boot_time"] = host_time(line[len("BTIME="):])
            elif line.startswith("FM_VERSION="):
                out["fabric_manager"]["version"] = line[len("FM_VERSION="):].strip() or None
            elif line.startswith("FM_ACTIVE="):
                out["fabric_manager"]["active"] = line[len("FM_ACTIVE="):].strip() or None
            elif sep and key in tagged:
                tagged[key](value)
        if rc == TIMED_OUT:
            out["error"] = f"nvidia-smi did not answer the health query within {SMI_TIMEOUT} s (hung driver?)"
            raise Unreadable(out["error"], out)
        if rc:
            # the GPU facts report a failing nvidia-smi on their own (no driver, no GPU): no health then
            out["error"] = " ".join(s.strip() for s in smi if s.strip())[:200] or f"nvidia-smi exit {rc}"
            return out
        try:
            out["gpus"] = _rows([s for s in smi if s.strip()])
        except Unreadable as exc:
            out["error"] = str(exc)
            raise Unreadable(str(exc), out) from None
        if q:
            _recovery_from_q(q, out["gpus"])
        for xid in out["xids"]:
            if out["boot_time"] is not None:
                xid["time"] = round(out["boot_time"] + xid["uptime"], 3)
        return out


def _rows(lines: list[str]) -> list[dict]:
    if not lines:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in _csv_row(lines[0])]
    if [h for h in header if h not in HEALTH_FIELDS] or "index" not in header:
        raise Unreadable(f"nvidia-smi printed a health query header nemofleet cannot read: {shown(lines[0], 200)}")
    gpus = []
    for n, line in enumerate(lines[1:]):
        row = _csv_row(line)
        index = host_number(row[header.index("index")], 0, 1023) if len(row) == len(header) else None
        where = f" of GPU {index}" if index is not None else f" of health row {n + 1} of {len(lines) - 1}"
        if len(row) != len(header):
            raise Unreadable(f"nvidia-smi printed a health row of {len(row)} fields, not {len(header)}{where}: "
                             f"{shown(line, 200)}")
        raw = dict(zip(header, (c.strip() for c in row)))
        gpu: dict[str, Any] = {"lost": any(v == LOST for v in raw.values())}
        for name, value in raw.items():
            gpu[name] = None if value == LOST else typed(name, value, where)
        gpus.append(gpu)
    return gpus


def _recovery_from_q(q: list[str], gpus: list[dict]) -> None:
    """'GPU 00000000:00:06.0' / '    GPU Recovery Action : None' pairs of `nvidia-smi -q`."""
    by_bus = {bus_key(g.get("pci.bus_id") or ""): g for g in gpus}
    current = None
    for line in q:
        m = re.match(r"^GPU ([0-9A-Fa-f:.]+)$", line.strip())
        if m:
            current = by_bus.get(bus_key(m.group(1)))
        elif "GPU Recovery Action" in line and current is not None:
            current["gpu_recovery_action"] = typed("gpu_recovery_action", line.partition(":")[2])


def _xid(text: str, out: dict) -> None:
    m = _XID.match(text.strip())
    code = host_number(m.group(3), 0, 10**6) if m else None
    uptime = host_number(m.group(1), 0, 10**10, decimal=True) if m else None
    if m and code is not None and uptime is not None:  # a line of another shape is left out: the kernel log is free text
        out["xids"].append({"code": code, "bus_id": bus_key(m.group(2)), "uptime": uptime,
                            "time": None, "text": (m.group(4) or "").strip()[:160]})


def _reset(text: str, out: dict) -> None:
    parts = text.split()
    key, when = (bus_key(parts[0]), host_time(parts[1])) if len(parts) == 2 else ("", None)
    if when is not None and XID_BUS.fullmatch(key):  # "BUS UNIX_TIME": a file read back; another shape is left out
        out["resets"][key] = max(when, out["resets"].get(key, 0))


def _drained(text: str, out: dict) -> None:
    parts = text.split(None, 3)
    # "UUID SINCE INDEX REASON": a file on the host read back; a line of another shape is left out
    since, index = (host_time(parts[1]), host_number(parts[2], 0, 1023)) if len(parts) >= 3 else (None, None)
    if since is not None and index is not None and gpu_uuid_problem(parts[0]) is None:
        out["drained"][parts[0]] = {"since": since, "index": index, "reason": parts[3].strip() if len(parts) > 3 else ""}
