"""Per model directory under a models root: what the plan reads (runs on the host, stdlib only).

    python3 -I -S models_on_disk.py ROOT

Prints one JSON object {directory name: {"total_size", "config", "complete", "revision",
"marker_ok"}}: the index's total_size, the config.json fields the plan uses, whether the
completion marker is there and which revision it names, and -- the weights check's marker fast
path (weights_check.py, check mode), done here in the same python -- "marker_ok" when every file
the marker lists is still of its size (the deploy then asks no more).

The files are input that may be wrong: a value of the wrong type is left out (the controller
types what it reads, factmodel.py), a file that is not a regular file (a link, a FIFO) is
never read and is no marker, and no file outside ROOT is looked at because of what a marker lists
or through a link inside a model directory.
"""

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

MARKER = ".nemofleet-complete"
CONFIG_KEYS = ("architectures", "max_position_embeddings", "num_key_value_heads", "head_dim",
               "hybrid_override_pattern", "num_hidden_layers", "num_nextn_predict_layers",
               # the testbed's tiny stand-in checkpoint marks itself (nemofleet plan says so)
               "nemofleet_tiny")


def describe(d):
    meta = {}
    index = read_json(os.path.join(d, INDEX))
    total = index.get("metadata") if isinstance(index, dict) else None
    total = total.get("total_size") if isinstance(total, dict) else None
    if is_size(total):
        meta["total_size"] = total
    cfg = read_json(os.path.join(d, "config.json"))
    if isinstance(cfg, dict):
        meta["config"] = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
    meta["complete"] = file_size(os.path.join(d, MARKER)) is not None
    m = read_json(os.path.join(d, MARKER))
    meta["revision"] = m["revision"] if isinstance(m, dict) and isinstance(m.get("revision"), str) else None
    listed = marker_files(d, m) if meta["revision"] is not None else None
    if listed is not None:
        marker_total = m.get("total_size")
        meta["marker_ok"] = {"present_bytes": sum(listed.values()),
                             "total_size": marker_total if is_size(marker_total) else None,
                             "incomplete_files": incomplete_files(d)}
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
