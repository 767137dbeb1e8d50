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
by hand, a file that is a FIFO or a symlink loop, names that are not UTF-8, numbers of any size):
the check never crashes on it and never reads or removes a file outside DIR because of it. What
it cannot make sense of counts as missing or truncated (the file is fetched again), never as
complete. A shard name that could leave DIR or be read as an option (`..`, `/x`, `-x`) makes the
index itself count as truncated.
"""

import hashlib
import json
import os
import stat
import struct
import sys

MARKER = ".nemofleet-complete"
INDEX = "model.safetensors.index.json"
CACHE = os.path.join(".cache", "huggingface", "download")
# an index or a marker is a few MB at most (a 232 GB checkpoint's index is about 2 MB);
# a safetensors header is bounded the same way (the format caps it at 100 MB)
JSON_LIMIT = 64 * 1024 * 1024
HEADER_LIMIT = 100 * 1024 * 1024
# a size or an offset no file system holds: anything larger (or negative) is not a size
SIZE_LIMIT = 2 ** 63


def is_size(n):
    return type(n) is int and 0 <= n < SIZE_LIMIT


def is_inside(name):
    """A relative path that stays inside DIR (no absolute path, no `..`, no NUL)."""
    if not isinstance(name, str) or not name or "\x00" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def is_shard_name(name):
    """A file name the index may name: inside DIR and never taken for an option of `hf download`."""
    return is_inside(name) and all(part[0] not in "-." for part in name.split("/")) \
        and all(c.isprintable() for c in name) and len(name) <= 1024


def open_regular(path):
    """A file object for a regular file, or None: a FIFO, a device, a directory or a symlink
    loop is never opened for reading (O_NONBLOCK: opening a FIFO does not wait for a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except OSError:
        os.close(fd)
        return None


def read_json(path):
    """The JSON value of a regular file of at most JSON_LIMIT bytes, or None."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            data = f.read(JSON_LIMIT + 1)
        except OSError:
            return None
    if len(data) > JSON_LIMIT:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def read_lines(path, limit=4096):
    """The lines of a small text file (huggingface_hub's metadata), undecodable bytes replaced."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            return f.read(limit).decode("utf-8", "replace").split("\n")
        except OSError:
            return None


def size_of(path):
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def files(d):
    """{relative name: size} of the regular files under d (not .cache, not the marker)."""
    res = {}
    for root, dirs, names in os.walk(d):
        dirs[:] = [x for x in dirs if x != ".cache"]
        for n in names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            size = size_of(p) if rel != MARKER else None
            if size is not None:
                res[rel] = size
    return res


def marker_files(marker):
    """The marker's {file: size} when every entry is a file inside DIR with a size, else None."""
    if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
        return None
    listed = marker["files"]
    if not all(is_inside(k) and is_size(v) for k, v in listed.items()):
        return None
    return listed


def shard_intact(path, size):
    """The safetensors file at `path` ends where its header says its last tensor ends."""
    f = open_regular(path)
    if f is None:
        return False
    with f:
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


def sha256_of(path):
    f = open_regular(path)
    if f is None:
        return None
    h = hashlib.sha256()
    with f:
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
    """clean: every truncated file and its huggingface_hub metadata removed (names of the index
    are shard names, checked to stay inside d)."""
    for name in out["truncated"]:
        if not is_inside(name):
            continue
        for p in (os.path.join(d, name), os.path.join(d, CACHE, name + ".metadata")):
            try:
                if os.path.lexists(p) and not os.path.isdir(p):
                    os.unlink(p)
            except OSError:
                pass


def check(d, rev, mode, out):
    marker = os.path.join(d, MARKER)
    if not out["exists"]:
        emit(out, 1 if mode in ("write", "full") else 0, "weights directory %s does not exist" % d)
    cache = os.path.join(d, CACHE)
    for _, _, names in os.walk(cache):
        out["incomplete_files"] += sum(1 for n in names if n.endswith(".incomplete"))
    if mode == "check":
        m = read_json(marker)
        listed = marker_files(m)
        if listed is not None and m.get("revision") == rev \
                and all(size_of(os.path.join(d, f)) == s for f, s in listed.items()):
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
        elif not shard_intact(os.path.join(d, s), sizes[s]):
            out["truncated"].append(s)
    if "config.json" not in sizes:
        out["missing"].append("config.json")
    if not any(t in sizes for t in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        out["missing"].append("tokenizer.json")
    if mode == "full":
        for s in shards:
            lines = read_lines(os.path.join(cache, s + ".metadata"))
            if not lines or len(lines) < 2 or s not in sizes:
                continue
            etag = lines[1].strip()
            if sha256_of(os.path.join(d, s)) != etag and s not in out["truncated"]:
                out["truncated"].append(s)
    out["complete"] = not (out["missing"] or out["truncated"])
    # which commit the files are of: line 1 of huggingface_hub's local-dir metadata per file. A copy
    # from a peer (or by hand) is trusted as `rev` only when every shard and config.json say so.
    commits = set()
    for s in shards + ["config.json"]:
        lines = read_lines(os.path.join(cache, s + ".metadata"))
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
        tmp = marker + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"revision": rev, "files": sizes, "total_size": out["total_size"]}, f, sort_keys=True)
        os.rename(tmp, marker)
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
