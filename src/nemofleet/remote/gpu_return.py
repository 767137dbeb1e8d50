"""nemofleet-gpu-return: a GPU the health program drained serves again (nemofleet.hostcmd.gpu_returns).

    flock -w 900 HEALTH_LOCK python3 -I -S gpu_return.py HEALTH_STATE DRAIN FRONT_DOOR UUID INSTANCE...

Removes the GPU's markers in HEALTH_STATE (`gpu-UUID.sick`, `gpu-UUID.healthy_runs`) and each
instance's `INSTANCE.gpu_sick`; with FRONT_DOOR `1` each instance goes back in the front door
(`DRAIN in INSTANCE`, while haproxy is active), one at a time, each call bounded. The caller holds
the health program's lock (flock), so no health run sees half of it.

The UUID and the instance names are file names in HEALTH_STATE: one that is not a single plain
name (a `/`, `..`, a NUL) is refused before anything is removed. Standard library only; a refusal
or a failed step is one sentence on stderr and exit 1, never a traceback.
"""

import os
import subprocess
import sys

IS_ACTIVE_TIMEOUT = 10
DRAIN_TIMEOUT = 60  # `DRAIN in` enables one server through HAProxy's runtime socket


def plain(name):
    return bool(name) and name not in (".", "..") and "/" not in name and "\x00" not in name and len(name) < 256


def call(argv, seconds):
    sys.stdout.flush()
    try:
        return subprocess.run(["timeout", str(seconds), *argv], stdin=subprocess.DEVNULL,
                              timeout=seconds + 15).returncode
    except subprocess.TimeoutExpired:
        return 124
    except OSError:
        return 127


def main(argv):
    if len(argv) < 5 or argv[3] not in ("0", "1"):
        print("usage: gpu_return.py HEALTH_STATE DRAIN 0|1 UUID INSTANCE...", file=sys.stderr)
        return 2
    state, drain, front_door, uuid, names = argv[1], argv[2], argv[3] == "1", argv[4], argv[5:]
    bad = [n for n in [uuid, *names] if not plain(n)]
    if bad:
        print(f"refused: {bad[0]!r} is not a plain GPU UUID or instance name", file=sys.stderr)
        return 1
    marks = [f"gpu-{uuid}.sick", f"gpu-{uuid}.healthy_runs"] + [f"{n}.gpu_sick" for n in names]
    for m in marks:
        try:
            os.unlink(os.path.join(state, m))
        except FileNotFoundError:
            pass
    if front_door:
        for n in names:
            if call(["systemctl", "is-active", "-q", "haproxy"], IS_ACTIVE_TIMEOUT) != 0:
                continue  # no front door running: the instance is served directly
            rc = call([drain, "in", n], DRAIN_TIMEOUT)
            if rc != 0:
                print(f"instance {n} could not be put back in the front door ({drain} in: exit {rc})", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    try:
        rc = main([a.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for a in sys.argv])
    except OSError as exc:
        print(f"the GPU's markers could not be removed: {exc.strerror or exc} ({exc.filename or ''})", file=sys.stderr)
        rc = 1
    except Exception as exc:  # noqa: BLE001 - never a traceback on a host
        print(f"gpu_return.py failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        rc = 1
    sys.exit(rc)
