"""The human-readable form of a plan (`nemofleet plan`); `--json` prints Plan.to_dict() instead.

Works on the dict form, so the CLI can print what it read from JSON as well. Columns are as
wide as their widest cell, so an 8-GPU instance ("0-7") never runs into the port column.
"""

from __future__ import annotations

import itertools

GIB = 1024**3

_HEAD = ("instance", "GPUs", "GPU", "port", "TP", "EP", "context", "seqs", "GiB need/avail", "full-ctx seqs")


def gpu_ranges(indices: list[int]) -> str:
    """[0,1,2,3,5] -> '0-3,5': a run of consecutive indices keeps one index - position."""
    runs = [[i for _, i in run] for _, run in itertools.groupby(enumerate(sorted(indices)), lambda p: p[1] - p[0])]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def table(instances: list[dict]) -> list[str]:
    rows = [_HEAD] + [(
        i["name"], gpu_ranges(i["gpus"]), i.get("gpu_model", ""), str(i["port"]), str(i["tp"]),
        "y" if i["ep"] else "-", str(i["max_model_len"]), str(i["max_num_seqs"]),
        f"{i['memory_need_bytes'] / GIB:.1f}/{i['memory_available_bytes'] / GIB:.1f}",
        str(i.get("full_context_seqs", "")),
    ) for i in instances]
    widths = [max(len(r[c]) for r in rows) for c in range(len(_HEAD))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def lines(plan: dict) -> list[str]:
    """The plan of one host: header, choices, the instance table, flags per distinct command line."""
    out = [f"{plan['model']} ({plan['repo']}@{plan['revision'][:12]}) on {plan['image']}, GPUs via {plan['gpu_method']}"]
    out += [f"choice: {c}" for c in plan.get("choices", [])]
    out += [f"departure: {d}" for d in plan.get("departures", [])]  # from the published recipe, one line each
    if plan.get("excluded_gpus"):
        out.append("GPUs left out: " + gpu_ranges(plan["excluded_gpus"]))
    out += table(plan["instances"])
    seen: list[list[str]] = []
    for i in plan["instances"]:
        if i["args"] not in seen:
            seen.append(i["args"])
            names = [j["name"] for j in plan["instances"] if j["args"] == i["args"]]
            label = "flags" if len(seen) == 1 and len(names) == len(plan["instances"]) else f"flags ({', '.join(names)})"
            out.append(f"{label}: " + " ".join(i["args"][1:]))
    return out
