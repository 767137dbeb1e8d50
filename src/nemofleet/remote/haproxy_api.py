"""nemofleet-haproxy-api: a fleet gateway's servers through HAProxy's runtime API (nemofleet.fleet.gateway).

    python3 -I -S haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS show
    python3 -I -S haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS drain SERVER...
    python3 -I -S haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS ready SERVER...
    python3 -I -S haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS weight WEIGHT SERVER...
    python3 -I -S haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS save

SOCKET is the admin socket (root only, never a TCP port). `drain` takes each SERVER of BACKEND out
(no new request; those in flight finish) and waits until none is in flight, at most until the
run's deadline SECONDS minus 5; `ready` puts each back at its full weight; `weight` puts each back
at WEIGHT (0-256; the config gives each server its full weight). Every change is then written to STATE_FILE
(`show servers state`, which HAProxy loads at a reload: drains and weights outlive it); `save`
writes it alone (before a reload). Then one line per server of BACKEND:

    server NAME op=OP admin=ADMIN weight=WEIGHT scur=IN_FLIGHT

OP is HAProxy's operational state (0 stopped, 2 running, 1/3 starting/stopping), ADMIN its admin
state flags (8: drained through this API). A server name that is not one plain word is refused
before anything changes; a refusal or a failure is one sentence on stderr (exit 1), never a traceback.
"""

import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403


def api(path, command):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(max(0.1, time_left()))
    try:
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out.decode("utf-8", "replace")
            out += chunk
    finally:
        s.close()


def servers(path, backend):
    """{name: {op, admin, weight, scur}} of BACKEND's servers."""
    out = {}
    for line in api(path, "show servers state " + backend).splitlines():
        f = line.split()
        if len(f) > 7 and f[1] == backend:
            out[f[3]] = {"op": f[5], "admin": f[6], "weight": f[7], "scur": "0"}
    rows = api(path, "show stat").splitlines()
    head = rows[0].lstrip("# ").split(",") if rows else []
    for row in rows[1:]:
        f = row.split(",")
        if len(f) == len(head) and f[0] == backend and f[1] in out:
            out[f[1]]["scur"] = f[head.index("scur")] or "0"
    return out


def main(argv):
    if len(argv) < 6 or argv[5] not in ("show", "drain", "ready", "weight", "save"):
        print("usage: haproxy_api.py SOCKET BACKEND STATE_FILE SECONDS show|drain|ready|weight|save [ARGS]",
              file=sys.stderr)
        return 2
    path, backend, state_file, action, args = argv[1], argv[2], argv[3], argv[5], argv[6:]
    deadline(float(argv[4]))
    end = time.monotonic() + float(argv[4]) - 5  # a drain's wait ends here: the answer still comes in time
    weight = args.pop(0) if action == "weight" and args else None
    if weight is not None and not (weight.isdigit() and int(weight) <= 256):
        print(f"refused: weight {weight[:20]!r} is not a number from 0 to 256", file=sys.stderr)
        return 1
    bad = [n for n in args if not n or not all(c.isalnum() or c in "_.-:" for c in n) or len(n) > 200]
    if bad:
        print(f"refused: {bad[0][:60]!r} is not a plain server name", file=sys.stderr)
        return 1
    known = servers(path, backend)
    for name in args:
        if name not in known:
            continue  # not behind this gateway: nothing to change for it
        command = {"drain": f"set server {backend}/{name} state drain",
                   "ready": f"set server {backend}/{name} state ready;set server {backend}/{name} weight 100%",
                   "weight": f"set server {backend}/{name} weight {weight};set server {backend}/{name} state ready"
                   }[action]
        answer = api(path, command).strip()
        if answer:
            print(f"gateway: {command}: {answer[:200]}", file=sys.stderr)
            return 1
    if action != "show":
        write_file(state_file, api(path, "show servers state").encode())
    while action == "drain":  # the requests in flight finish (until the deadline; then they are cut)
        known = servers(path, backend)
        if all(known[n]["scur"] == "0" for n in args if n in known) or time.monotonic() > end:
            break
        time.sleep(0.5)
    for name, s in servers(path, backend).items():
        print(f"server {name} op={s['op']} admin={s['admin']} weight={s['weight']} scur={s['scur']}")
    return 0


if __name__ == "__main__":
    try:
        rc = main([a.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for a in sys.argv])
    except OSError as exc:  # no socket (HAProxy not running), the deadline, the state file
        print(f"the gateway's runtime API did not answer: {exc.strerror or exc}", file=sys.stderr)
        rc = 1
    except Exception as exc:  # noqa: BLE001 - never a traceback on a host
        print(f"haproxy_api.py failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        rc = 1
    sys.exit(rc)
