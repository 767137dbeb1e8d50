"""nemofleet-tensor-bytes: `nemofleet status`'s weights figure for one weights directory.

    python3 -I -S tensor_bytes.py DIR

Prints "<tensor bytes in the shards on disk> of <index total_size> (P%)" ("? of ?" shapes when the
index is missing or unreadable). Standard library only.
"""

import glob
import json
import os
import struct
import sys

d = sys.argv[1]
have = 0
for f in glob.glob(os.path.join(d, "*.safetensors")):
    with open(f, "rb") as fh:
        head = fh.read(8)
    if len(head) == 8:
        have += max(0, os.path.getsize(f) - 8 - struct.unpack("<Q", head)[0])
try:
    total = int(json.load(open(os.path.join(d, "model.safetensors.index.json")))["metadata"]["total_size"])
except Exception:
    total = 0
print("%d of %s" % (have, ("%d (%.0f%%)" % (total, min(100.0, 100.0 * have / total))) if total > 0 else "?"))
