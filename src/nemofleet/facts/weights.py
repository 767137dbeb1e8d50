"""Model weights on disk: completeness check (offline, O(files)) and the catalog overrides.

The check script runs with the host's python3 (stdlib only) and is also used, in `write`
mode, by the weights operation to write the completion marker last.
"""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

MARKER = ".nemofleet-complete"

# argv: DIR REVISION MODE(check|write|full)
CHECK_SCRIPT = r'''
import hashlib, json, os, struct, sys
d, rev, mode = sys.argv[1], sys.argv[2], sys.argv[3]
marker = os.path.join(d, ".nemofleet-complete")
out = {"dir": d, "exists": os.path.isdir(d), "complete": False, "marker": False, "missing": [],
       "truncated": [], "incomplete_files": 0, "present_bytes": 0, "total_size": None}
def files():
    res = {}
    for root, dirs, names in os.walk(d):
        dirs[:] = [x for x in dirs if x != ".cache"]
        for n in names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            if rel != ".nemofleet-complete" and os.path.isfile(p):
                res[rel] = os.path.getsize(p)
    return res
def emit(code=0, msg=None):
    if msg:
        sys.stderr.write(msg + "\n")
    print(json.dumps(out, sort_keys=True))
    sys.exit(code)
if not out["exists"]:
    emit(1 if mode != "check" else 0, "weights directory %s does not exist" % d)
cache = os.path.join(d, ".cache", "huggingface", "download")
for root, _, names in os.walk(cache):
    out["incomplete_files"] += sum(1 for n in names if n.endswith(".incomplete"))
if mode == "check":
    try:
        m = json.load(open(marker))
        if m.get("revision") == rev and all(os.path.getsize(os.path.join(d, f)) == s
                                            for f, s in m["files"].items()):
            out.update(complete=True, marker=True, total_size=m.get("total_size"),
                       present_bytes=sum(m["files"].values()))
            emit()
    except (OSError, ValueError, KeyError, TypeError):
        pass
sizes = files()
out["present_bytes"] = sum(sizes.values())
shards = []
idx = os.path.join(d, "model.safetensors.index.json")
if os.path.exists(idx):
    try:
        index = json.load(open(idx))
        shards = sorted(set(index["weight_map"].values()))
        out["total_size"] = index.get("metadata", {}).get("total_size")
    except (ValueError, KeyError, TypeError):
        out["truncated"].append("model.safetensors.index.json")
elif "model.safetensors" in sizes:
    shards = ["model.safetensors"]
else:
    out["missing"].append("model.safetensors.index.json")
for s in shards:
    p = os.path.join(d, s)
    if s not in sizes:
        out["missing"].append(s)
        continue
    size = sizes[s]
    try:
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > 100 * 1024 * 1024 or 8 + n > size:
                raise ValueError
            header = json.loads(f.read(n))
        end = max([v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] or [0])
        if 8 + n + end != size:
            raise ValueError
    except (ValueError, struct.error, KeyError, TypeError):
        out["truncated"].append(s)
if "config.json" not in sizes:
    out["missing"].append("config.json")
if not any(t in sizes for t in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
    out["missing"].append("tokenizer.json")
if mode == "full":
    for s in shards:
        meta = os.path.join(cache, s + ".metadata")
        try:
            etag = open(meta).read().split("\n")[1].strip()
        except (OSError, IndexError):
            continue
        h = hashlib.sha256()
        with open(os.path.join(d, s), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        if h.hexdigest() != etag and s not in out["truncated"]:
            out["truncated"].append(s)
out["complete"] = not (out["missing"] or out["truncated"])
if mode in ("write", "full"):
    if not out["complete"]:
        emit(1, "weights in %s are incomplete after download: missing %s, truncated %s" % (
            d, ", ".join(out["missing"]) or "none", ", ".join(out["truncated"]) or "none"))
    tmp = marker + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"revision": rev, "files": sizes, "total_size": out["total_size"]}, f, sort_keys=True)
    os.rename(tmp, marker)
    out["marker"] = True
emit()
'''


def check_command(directory: str, revision: str, mode: str) -> str:
    return " ".join(["python3", "-c", shlex.quote(CHECK_SCRIPT), shlex.quote(directory),
                     shlex.quote(revision), mode])


class WeightsStatus(FactBase):
    """Completeness of one model directory for one revision (see CHECK_SCRIPT)."""

    def command(self, directory: str, revision: str, full: bool = False) -> str:
        return check_command(directory, revision, "full" if full else "check") + " 2>/dev/null || true"

    def process(self, output):
        for line in reversed(output):
            if line.startswith("{"):
                return json.loads(line)
        return None


class ModelsOnDisk(FactBase):
    """Per model directory under `root`: the index total_size and the config fields the plan uses."""

    SCRIPT = r'''
import json, os, sys
root = sys.argv[1]
out = {}
for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    d = os.path.join(root, name)
    meta = {}
    try:
        meta["total_size"] = json.load(open(os.path.join(d, "model.safetensors.index.json")))["metadata"]["total_size"]
    except Exception:
        pass
    try:
        cfg = json.load(open(os.path.join(d, "config.json")))
        keys = ("architectures", "max_position_embeddings", "num_key_value_heads", "head_dim",
                "hybrid_override_pattern", "num_hidden_layers", "num_nextn_predict_layers")
        meta["config"] = {k: cfg[k] for k in keys if k in cfg}
    except Exception:
        pass
    meta["complete"] = os.path.exists(os.path.join(d, ".nemofleet-complete"))
    out[name] = meta
print(json.dumps(out, sort_keys=True))
'''

    def command(self, root: str) -> str:
        return f"python3 -c {shlex.quote(self.SCRIPT)} {shlex.quote(root)} 2>/dev/null || echo '{{}}'"

    def default(self):
        return {}

    def process(self, output):
        try:
            return json.loads("\n".join(output))
        except ValueError:
            return {}
