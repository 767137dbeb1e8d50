"""Per model directory under a models root: what the plan reads (runs on the host, stdlib only).

    python3 -I -S models_on_disk.py ROOT

Prints one JSON object {directory name: {"total_size", "config", "complete", "revision",
"marker_ok"}}: the index's total_size, the config.json fields the plan uses, whether the
completion marker is there and which revision it names, and -- the weights check's marker fast
path (weights_check.py, check mode), done here in the same python -- "marker_ok" when every file
the marker lists is still of its size (the deploy then asks no more).

The files are input that may be wrong: a value of the wrong type is left out (the controller
types what it reads, facts/schema.py), a file that is not a regular file is never read, and no
file outside ROOT is looked at because of what a marker lists.
"""

import json
import os
import stat
import sys

MARKER = ".nemofleet-complete"
CONFIG_KEYS = ("architectures", "max_position_embeddings", "num_key_value_heads", "head_dim",
               "hybrid_override_pattern", "num_hidden_layers", "num_nextn_predict_layers",
               # the testbed's tiny stand-in checkpoint marks itself (nemofleet plan says so)
               "nemofleet_tiny")
JSON_LIMIT = 64 * 1024 * 1024
SIZE_LIMIT = 2 ** 63


def is_size(n):
    return type(n) is int and 0 <= n < SIZE_LIMIT


def is_inside(name):
    if not isinstance(name, str) or not name or "\x00" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def read_json(path):
    """The JSON value of a regular file of at most JSON_LIMIT bytes, or None (a FIFO is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.set_blocking(fd, True)
        data = os.read(fd, JSON_LIMIT + 1)
        while data and len(data) <= JSON_LIMIT:
            more = os.read(fd, JSON_LIMIT + 1 - len(data))
            if not more:
                break
            data += more
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > JSON_LIMIT:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def size_of(path):
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def describe(d):
    meta = {}
    index = read_json(os.path.join(d, "model.safetensors.index.json"))
    total = index.get("metadata") if isinstance(index, dict) else None
    total = total.get("total_size") if isinstance(total, dict) else None
    if is_size(total):
        meta["total_size"] = total
    cfg = read_json(os.path.join(d, "config.json"))
    if isinstance(cfg, dict):
        meta["config"] = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
    meta["complete"] = os.path.exists(os.path.join(d, MARKER))
    m = read_json(os.path.join(d, MARKER))
    listed = m.get("files") if isinstance(m, dict) else None
    meta["revision"] = m["revision"] if isinstance(m, dict) and isinstance(m.get("revision"), str) else None
    if meta["revision"] is not None and isinstance(listed, dict) \
            and all(is_inside(f) and is_size(n) for f, n in listed.items()) \
            and all(size_of(os.path.join(d, f)) == n for f, n in listed.items()):
        cache = os.path.join(d, ".cache", "huggingface", "download")
        marker_total = m.get("total_size")
        meta["marker_ok"] = {"present_bytes": sum(listed.values()),
                             "total_size": marker_total if is_size(marker_total) else None,
                             "incomplete_files": sum(1 for _, _, ns in os.walk(cache)
                                                     for n in ns if n.endswith(".incomplete"))}
    return meta


def main(argv):
    root = argv[0] if argv else ""
    out = {}
    try:
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    except OSError:
        names = []
    for name in names:
        try:
            out[name] = describe(os.path.join(root, name))
        except (OSError, ValueError, RecursionError, MemoryError):
            out[name] = {"complete": False, "revision": None}
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
