"""The offline completeness check of one model directory (runs on the host, stdlib only).

    python3 -I -S weights_check.py DIR REVISION MODE

MODE:
  check  answer from the completion marker when it is intact for REVISION, else look at the files
  write  look at the files; when they are complete (and of REVISION when it is a commit), write the
         completion marker (last, by rename); exit 1 with one sentence on stderr otherwise
  full   like write, and every shard's sha256 is compared with the etag huggingface_hub recorded
  clean  like check, then unlink every file found truncated with its huggingface_hub metadata, so
         that `hf download` fetches it again instead of trusting the metadata

Prints one JSON line: dir, exists, complete, marker, missing, truncated, incomplete_files,
present_bytes, total_size (and, when the files were looked at, commit_ok and other_commits).

Everything in DIR is input that may be wrong or hostile (an index from a mirror, a marker edited
by hand, a file that is a FIFO or a symlink loop, names that are not UTF-8, numbers of any size, a
link a peer's copy planted): the check never crashes on it and never reads, writes or removes a
file outside DIR because of it. A link is no file and a linked directory (a linked .cache) is never
entered (the prelude's below()); the marker is written to a new temporary file, then renamed. What
it cannot make sense of counts as missing or truncated (the file is fetched again), never as
complete. A shard name that could leave DIR or be read as an option (`..`, `/x`, `-x`) makes the
index itself count as truncated.
"""

import hashlib
import json
import os
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

MARKER = ".nemofleet-complete"
# an index or a marker is a few MB at most (a 232 GB checkpoint's index is about 2 MB: read_json's
# 64 MB bound); a safetensors header is bounded the same way (the format caps it at 100 MB)
HEADER_LIMIT = 100 * 1024 * 1024


def is_shard_name(name):
    """A file name the index may name: inside DIR and never taken for an option of `hf download`."""
    return is_inside(name) and all(part[0] not in "-." for part in name.split("/")) \
        and all(c.isprintable() for c in name) and len(name) <= 1024


def metadata(d, name):
    """The lines of huggingface_hub's metadata of file `name` (undecodable bytes replaced), or None."""
    data = below(d, CACHE + "/" + name + ".metadata", read_file, 4096)
    return None if data is None else data.decode("utf-8", "replace").split("\n")


def files(d):
    """{relative name: size} of the regular files under d (not .cache, not the marker); a link
    is no file and a linked directory is not entered."""
    res = {}
    for root, dirs, names in os.walk(d):
        dirs[:] = [x for x in dirs if x != ".cache"]
        for n in names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            size = file_size(p) if rel != MARKER else None
            if size is not None:
                res[rel] = size
    return res


def shard_intact(d, name, size):
    """The safetensors file `name` ends where its header says its last tensor ends."""
    fd = below(d, name, open_regular)
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.read(8)
            if len(head) != 8:
                return False
            n = struct.unpack("<Q", head)[0]
            if n > HEADER_LIMIT or 8 + n > size:
                return False
            header = json.loads(f.read(n))
        except (OSError, ValueError, RecursionError, struct.error):
            return False
    if not isinstance(header, dict):
        return False
    end = 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        offsets = v.get("data_offsets") if isinstance(v, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_size(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            return False
        end = max(end, offsets[1])
    return 8 + n + end == size


def sha256_of(d, name):
    fd = below(d, name, open_regular)
    if fd is None:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        try:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        except OSError:
            return None
    return h.hexdigest()


def emit(out, code=0, msg=None):
    if msg:
        sys.stderr.write(msg + "\n")
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def unlink_truncated(d, out):
    """clean: every truncated file and its huggingface_hub metadata removed: names of the index
    are shard names inside d, and a link on the way (a linked .cache) is never followed; a link
    itself is removed, never what it points at."""
    for name in out["truncated"]:
        for rel in (name, CACHE + "/" + name + ".metadata"):
            try:
                below(d, rel, os.unlink)
            except OSError:
                pass


def check(d, rev, mode, out):
    marker = os.path.join(d, MARKER)
    if not out["exists"]:
        emit(out, 1 if mode in ("write", "full") else 0, "weights directory %s does not exist" % d)
    out["incomplete_files"] = incomplete_files(d)
    if mode == "check":
        m = read_json(marker)
        listed = marker_files(d, m) if isinstance(m, dict) and m.get("revision") == rev else None
        if listed is not None:
            total = m.get("total_size")
            out.update(complete=True, marker=True, total_size=total if is_size(total) else None,
                       present_bytes=sum(listed.values()))
            emit(out)
    sizes = files(d)
    out["present_bytes"] = sum(sizes.values())
    shards = []
    if INDEX in sizes:
        index = read_json(os.path.join(d, INDEX))
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        names = list(weight_map.values()) if isinstance(weight_map, dict) else None
        if names and all(is_shard_name(s) for s in names):
            shards = sorted(set(names))
            meta = index.get("metadata")
            total = meta.get("total_size") if isinstance(meta, dict) else None
            out["total_size"] = total if is_size(total) else None
        else:
            out["truncated"].append(INDEX)
    elif "model.safetensors" in sizes:
        shards = ["model.safetensors"]
    else:
        out["missing"].append(INDEX)
    for s in shards:
        if s not in sizes:
            out["missing"].append(s)
        elif not shard_intact(d, s, sizes[s]):
            out["truncated"].append(s)
    if "config.json" not in sizes:
        out["missing"].append("config.json")
    if not any(t in sizes for t in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        out["missing"].append("tokenizer.json")
    if mode == "full":
        for s in shards:
            lines = metadata(d, s)
            if not lines or len(lines) < 2 or s not in sizes:
                continue
            etag = lines[1].strip()
            if sha256_of(d, s) != etag and s not in out["truncated"]:
                out["truncated"].append(s)
    out["complete"] = not (out["missing"] or out["truncated"])
    # which commit the files are of: line 1 of huggingface_hub's local-dir metadata per file. A copy
    # from a peer (or by hand) is trusted as `rev` only when every shard and config.json say so.
    commits = set()
    for s in shards + ["config.json"]:
        lines = metadata(d, s)
        commits.add(lines[0].strip() if lines else None)
    out["commit_ok"] = commits == {rev}
    out["other_commits"] = sorted(c for c in commits if c and c != rev)
    pinned = len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)
    if mode == "clean":
        unlink_truncated(d, out)
        emit(out)
    if mode == "write" and out["complete"] and pinned and not out["commit_ok"]:
        # never mark files as this commit unless huggingface_hub's metadata says they are
        emit(out, 1, "weights in %s are complete but not of commit %s (their metadata names %s); remove "
                     "the directory and run again" % (d, rev, ", ".join(out["other_commits"]) or "no commit"))
    if mode in ("write", "full"):
        if not out["complete"]:
            emit(out, 1, "weights in %s are incomplete after download: missing %s, truncated %s" % (
                d, ", ".join(out["missing"]) or "none", ", ".join(out["truncated"]) or "none"))
        write_file(marker, json.dumps({"revision": rev, "files": sizes, "total_size": out["total_size"]},
                                      sort_keys=True).encode())
        out["marker"] = True
    emit(out)


def main(argv):
    if len(argv) != 3 or argv[2] not in ("check", "write", "full", "clean"):
        sys.stderr.write("usage: weights_check.py DIR REVISION check|write|full|clean\n")
        sys.exit(2)
    d, rev, mode = argv
    out = {"dir": d, "exists": os.path.isdir(d), "complete": False, "marker": False, "missing": [],
           "truncated": [], "incomplete_files": 0, "present_bytes": 0, "total_size": None}
    try:
        check(d, rev, mode, out)
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        # the last resort (a file vanishing under the walk, a disk error): never a traceback,
        # never "complete"; write and full fail, check answers "incomplete"
        out["complete"] = False
        emit(out, 1 if mode in ("write", "full") else 0,
             "the weights check of %s stopped: %s" % (d, exc.__class__.__name__))


if __name__ == "__main__":
    main(sys.argv[1:])
