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
# which commit the files are of: line 1 of huggingface_hub's local-dir metadata per file. A copy
# from a peer (or by hand) is trusted as `rev` only when every shard and config.json say so.
commits = set()
for s in shards + ["config.json"]:
    try:
        commits.add(open(os.path.join(cache, s + ".metadata")).read().split("\n")[0].strip())
    except OSError:
        commits.add(None)
out["commit_ok"] = commits == {rev}
out["other_commits"] = sorted(c for c in commits if c and c != rev)
pinned = len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)
if mode == "write" and out["complete"] and pinned and not out["commit_ok"]:
    # never mark files as this commit unless huggingface_hub's metadata says they are
    emit(1, "weights in %s are complete but not of commit %s (their metadata names %s); remove the "
            "directory and run again" % (d, rev, ", ".join(out["other_commits"]) or "no commit"))
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


# Bounded like every remote command: the check stats the files (a hung NFS models root must not
# hang the run); `full` hashes every shard (232 GB at a slow disk's 100 MB/s is ~40 min).
CHECK_TIMEOUT = {"check": 600, "write": 600, "full": 4 * 3600}


def check_command(directory: str, revision: str, mode: str) -> str:
    return " ".join(["timeout", str(CHECK_TIMEOUT[mode]), "python3", "-c", shlex.quote(CHECK_SCRIPT),
                     shlex.quote(directory), shlex.quote(revision), shlex.quote(mode)])


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
    try:
        m = json.load(open(os.path.join(d, ".nemofleet-complete")))
        meta["revision"] = m["revision"]
        # the weights check's marker fast path (CHECK_SCRIPT, check mode), done here in the same
        # python: every file the marker lists is still of its size (the deploy then asks no more)
        if all(os.path.getsize(os.path.join(d, f)) == n for f, n in m["files"].items()):
            cache = os.path.join(d, ".cache", "huggingface", "download")
            meta["marker_ok"] = {"present_bytes": sum(m["files"].values()), "total_size": m.get("total_size"),
                                 "incomplete_files": sum(1 for _, _, ns in os.walk(cache)
                                                         for n in ns if n.endswith(".incomplete"))}
    except Exception:
        meta["revision"] = None
    out[name] = meta
print(json.dumps(out, sort_keys=True))
'''

    def command(self, root: str) -> str:
        # bounded: a hung NFS models root must not hang the run (no answer: no models known).
        # -I -S: the stdlib only (json, os, sys), without the site module and its .pth scan, which
        # is a third of a python start's CPU on every converged host's no-op
        return f"timeout 60 python3 -I -S -c {shlex.quote(self.SCRIPT)} {shlex.quote(root)} 2>/dev/null || echo '{{}}'"

    def default(self):
        return {}

    def process(self, output):
        try:
            return json.loads("\n".join(output))
        except ValueError:
            return {}


def status_from_models(root: str, name: str, meta: dict) -> tuple[dict, dict] | None:
    """(WeightsStatus kwargs, value) that the weights check (check mode) would answer for a
    directory whose marker ModelsOnDisk found intact: the deploy's read of it is then answered
    from HostFacts, with no second python start on the host (facts/prefetch.py)."""
    ok = meta.get("marker_ok") if isinstance(meta, dict) else None
    if not isinstance(ok, dict) or not meta.get("revision"):
        return None
    d = f"{root}/{name}"
    return ({"directory": d, "revision": meta["revision"], "full": False},
            {"dir": d, "exists": True, "complete": True, "marker": True, "missing": [], "truncated": [],
             "incomplete_files": ok.get("incomplete_files", 0), "present_bytes": ok.get("present_bytes", 0),
             "total_size": ok.get("total_size")})


class HubCommit(FactBase):
    """The 40-hex commit a branch or tag names on the Hub (or its mirror), asked from the host
    (the host, not the controller, reaches the mirror): {"sha"} or {"error": sentence}.
    Only read when a revision is not pinned to a commit; bounded to 20 s."""

    SCRIPT = r'''
import json, os, sys, urllib.error, urllib.parse, urllib.request
endpoint, repo, rev = sys.argv[1:4]
headers = {"User-Agent": "nemofleet"}
if os.path.exists("/etc/nemofleet/hf.env"):
    for line in open("/etc/nemofleet/hf.env"):
        if line.startswith("HF_TOKEN="):
            headers["Authorization"] = "Bearer " + line.split("=", 1)[1].strip()
url = "%s/api/models/%s/revision/%s" % (endpoint, repo, urllib.parse.quote(rev, safe=""))
try:
    sha = json.load(urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15))["sha"]
    print(json.dumps({"sha": sha}))
except urllib.error.HTTPError as e:
    print(json.dumps({"error": "%s has no revision %s on %s (HTTP %d)" % (repo, rev, endpoint, e.code)}))
except Exception as e:
    print(json.dumps({"error": "%s is unreachable from the host (%s)" % (endpoint, getattr(e, "reason", e))}))
'''

    def command(self, endpoint: str, repo: str, revision: str) -> str:
        return ("timeout 20 python3 -c " + shlex.quote(self.SCRIPT) + " " + " ".join(
            shlex.quote(x) for x in (endpoint, repo, revision))
            + " 2>/dev/null || echo '{\"error\": \"the Hub query did not finish within 20 s\"}'")

    def process(self, output):
        for line in reversed(output):
            try:
                out = json.loads(line)
            except ValueError:
                continue
            sha = out.get("sha")
            if isinstance(sha, str) and len(sha) == 40 and all(c in "0123456789abcdef" for c in sha):
                return {"sha": sha}
            return {"error": str(out.get("error") or f"unexpected answer {line[:80]!r}")}
        return {"error": "no answer from the Hub query"}


HUB_COMMIT_MARK = "hub_commit "


def hub_commits_script(items) -> str:
    """HubCommit's command for each (endpoint, repo, revision), each answer after a marker line:
    what `nemofleet status` and `nemofleet plan` run on a host (in their one remote command) to
    pin a revision exactly as the deploy's HubCommit fact does."""
    return "".join(f"echo {HUB_COMMIT_MARK}{k}\n{HubCommit().command(*item)}\n" for k, item in enumerate(items))


def parse_hub_commits(items, lines) -> dict:
    """{(endpoint, repo, revision): {"sha"} | {"error"}} from the output of hub_commits_script(items)."""
    answers: dict = {}
    current = None
    for line in lines:
        if line.startswith(HUB_COMMIT_MARK) and line[len(HUB_COMMIT_MARK):].isdigit():
            current = int(line[len(HUB_COMMIT_MARK):])
            answers[current] = []
        elif current is not None:
            answers[current].append(line)
    return {tuple(item): HubCommit().process(answers.get(k, [])) for k, item in enumerate(items)}
