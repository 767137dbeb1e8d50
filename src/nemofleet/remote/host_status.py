"""nemofleet-host-status: what `nemofleet status` shows of a host (nemofleet.hostcmd.status).

    python3 -I -S host_status.py RELEASE UNIT_DIR UNIT_PREFIX PROM_FILE HEALTH_STATE MODELS_ROOT MARKER AUDIT_LOG

Prints one line per item, each starting with its kind (nemofleet.fleet.status parses them):
  release KEY=VALUE        each line of the release record
  unit NAME STATE DESC     each unit UNIT_DIR/UNIT_PREFIX*.service: `systemctl is-active` and its Description=
  prom LINE                each metric line of the health program's textfile PROM_FILE
  gpusick LINE             the first line of each GPU marker HEALTH_STATE/gpu-*.sick
  weights NAME H of T (P%) tensor bytes, complete|incomplete
                           each directory of MODELS_ROOT: the tensor bytes of its shards on disk (each
                           safetensors file without its 8-byte length and JSON header), like with like
                           with the index's total_size; `? of ?` when it cannot be read; complete when
                           the MARKER file is there
  download UNIT STATE: LAST  each nemofleet-weights-* unit systemd knows, with its last journal line
  canary LINE              the last `canary` line of AUDIT_LOG (the last canary gate's verdict)

Everything read is input that may be wrong: every printed value is made one printable line, only
regular files are opened (a FIFO is never waited on, a link never followed: the prelude's
read_file), an index that is not what the Hub writes reads as `?`, and every systemctl/journalctl
call and the weights count have a time limit.
Standard library only; always exits 0 (a part that cannot be read is left out).
"""

import os
import re
import struct
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

CALL_TIMEOUT = 10
WEIGHTS_BUDGET = 60  # seconds for all of the weights figures (the shell version's per-directory bound)
READ_LIMIT = 1 << 20
LINE_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def one_line(text, limit=2000):
    return LINE_BREAKS.sub(" ", text).strip()[:limit]


def lines_of(path, limit=READ_LIMIT):
    data = read_file(path, limit)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()


def output(argv):
    """stdout of a bounded call ('' when it fails to answer)."""
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=CALL_TIMEOUT)
        return r.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def release(path):
    for line in lines_of(path):
        if line.strip():
            print(f"release {one_line(line)}")


def unit_lines(unit_dir, prefix):
    try:
        names = sorted(n for n in os.listdir(unit_dir) if n.startswith(prefix) and n.endswith(".service"))
    except OSError:
        return
    for n in names:
        state = one_line(output(["systemctl", "is-active", "--", n]).strip().split("\n")[0], 40)
        desc = next((ln[len("Description="):] for ln in lines_of(os.path.join(unit_dir, n))
                     if ln.startswith("Description=")), "")
        print(f"unit {one_line(n, 300)} {state} {one_line(desc)}")


def prom(path):
    for line in lines_of(path, 8 * READ_LIMIT):
        if line.strip() and not line.startswith("#"):
            print(f"prom {one_line(line)}")


def gpusick(state):
    try:
        names = sorted(n for n in os.listdir(state) if n.startswith("gpu-") and n.endswith(".sick"))
    except OSError:
        return
    for n in names:
        first = (lines_of(os.path.join(state, n), 4096) or [None])[0]
        if first is not None:
            print(f"gpusick {one_line(first)}")


def total_size(d):
    try:
        t = read_json(os.path.join(d, INDEX))["metadata"]["total_size"]
    except Exception:  # noqa: BLE001 - any index that is not the Hub's (wrong types, too deep, not UTF-8)
        return 0
    if isinstance(t, str) and re.fullmatch(r"[0-9]{1,19}", t):
        t = int(t)
    return t if type(t) is int and 0 < t < SIZE_LIMIT else 0


def tensor_bytes(d, until):
    """'<tensor bytes of the shards on disk> of <index total_size> (P%)', or None past `until`."""
    have = 0
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
    except OSError:
        names = []
    for n in names:
        if time.monotonic() > until:
            return None
        f = os.path.join(d, n)
        head, size = read_file(f, 8), file_size(f)
        if head is not None and len(head) == 8 and size is not None:
            have += max(0, size - 8 - struct.unpack("<Q", head)[0])
    total = total_size(d)
    return "%d of %s" % (have, ("%d (%.0f%%)" % (total, min(100.0, 100.0 * have / total))) if total > 0 else "?")


def weights(root, marker):
    until = time.monotonic() + WEIGHTS_BUDGET
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except OSError:
        return
    for n in names:
        d = os.path.join(root, n)
        if not os.path.isdir(d):
            continue
        have = tensor_bytes(d, until) or "? of ?"
        done = "complete" if file_size(os.path.join(d, marker)) is not None else "incomplete"
        print(f"weights {one_line(n, 300)} {have} tensor bytes, {done}")


def downloads():
    listed = output(["systemctl", "list-units", "--no-legend", "--plain", "nemofleet-weights-*"])
    for line in listed.splitlines()[:100]:
        u = (line.split() or [""])[0]
        if not re.fullmatch(r"nemofleet-weights-[A-Za-z0-9:_.\\@-]{1,200}", u):
            continue
        state = one_line(output(["systemctl", "is-active", "--", u]).strip().split("\n")[0], 40)
        last = output(["journalctl", "-u", u, "-n", "1", "--no-pager", "-o", "cat"]).replace("\r", "\n").splitlines()
        print(f"download {u} {state}: {one_line(last[-1] if last else '')}")


def canary(log):
    """The audit log's last line whose third field is `canary` (streamed: the log only grows)."""
    found = None
    fd = open_regular(log)
    if fd is None:
        return
    try:
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                parts = raw.split(None, 3)
                if len(parts) >= 3 and parts[2] == b"canary":
                    found = raw
    except OSError:
        pass
    if found is not None:
        print(f"canary {one_line(found.decode('utf-8', 'replace'))}")


def main(argv):
    rel, unit_dir, prefix, prom_file, state, root, marker, audit = argv[1:9]
    for part in (lambda: release(rel), lambda: unit_lines(unit_dir, prefix), lambda: prom(prom_file),
                 lambda: gpusick(state), lambda: weights(root, marker), downloads, lambda: canary(audit)):
        try:
            part()
        except Exception:  # noqa: BLE001 - one part that cannot be read is left out, never a traceback
            pass
        sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) != 9:
        print("usage: host_status.py RELEASE UNIT_DIR UNIT_PREFIX PROM_FILE HEALTH_STATE MODELS_ROOT MARKER AUDIT_LOG",
              file=sys.stderr)
        sys.exit(2)
    sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # a TextIOWrapper
    main([a.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for a in sys.argv])
    sys.exit(0)
