"""GETs to the Docker Engine API over its unix socket (runs on the host, stdlib only).

    python3 -I -S engine_read.py DEADLINE_SECONDS KEY PATH [KEY PATH ...]

One line per request: `@@engine STATUS KEY BODY`, BODY being dockerd's JSON as it sent it (its
newlines made spaces, which JSON allows between tokens; a newline inside a string is sent
escaped). STATUS is the HTTP status, "down" (nothing answers at the socket), "timeout" or
"garbled"; BODY is then the reason. The host does no JSON: the controller parses it
(facts/engine.py). `_socket`, not `socket`, and no `json`: their imports (enum, re) were two
thirds of the read's CPU on a test host (docs/measurements.md). HTTP/1.0, one connection per
request: dockerd closes it after the answer (no chunked body). Sent without the prelude
(remote/__init__.py, BARE): it reads no file of the host's, follows no redirect and sends no key;
its answer is bounded (ANSWER_LIMIT) and its whole run by DEADLINE_SECONDS, every recv included.

KEY and PATH come from the controller (facts/engine.py %-quotes every name in a PATH); a PATH
holding a CR, a LF or a space is refused here too, so that it can never add a header or a
second request line.
"""

import _socket
import os
import sys
import time

MARK = "@@engine "
# dockerd's answers are KBs (docker info is the largest); more is not the Engine API
ANSWER_LIMIT = 64 * 1024 * 1024


def read(where, path, end):
    """(status, text) of one GET, all of it before `end` (time.monotonic()): each recv may wait only
    for what is left, so a dockerd trickling its answer cannot keep it past the deadline."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(max(end - time.monotonic(), 0.001))
    chunks = []
    got = 0
    try:
        s.connect(where[7:])
        s.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\n\r\n" % path).encode("ascii", "replace"))
        while got <= ANSWER_LIMIT:
            left = end - time.monotonic()
            if left <= 0:
                raise _socket.timeout
            s.settimeout(left)
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
            got += len(data)
    except _socket.timeout:
        return "timeout", ""
    except OSError as exc:
        return "down", str(exc.strerror or exc)
    finally:
        s.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    words = head.split(None, 2)
    status = words[1].decode("ascii", "replace") if len(words) > 1 and words[1].isdigit() else "garbled"
    return status, body.replace(b"\r", b" ").replace(b"\n", b" ").decode("utf-8", "replace")


def main(argv):
    end = time.monotonic() + float(argv[0])
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    args = argv[1:]
    out = []
    for i in range(0, len(args) - 1, 2):
        key, path = args[i], args[i + 1]
        left = end - time.monotonic()
        if not where.startswith("unix://"):
            out.append("%sdown %s DOCKER_HOST=%s is not a unix socket" % (MARK, key, where))
            continue
        if left <= 0:
            out.append("%stimeout %s" % (MARK, key))
            continue
        if not path.startswith("/") or any(c in path for c in " \r\n\t\x00"):
            out.append("%sdown %s the API path is not one word" % (MARK, key))
            continue
        status, body = read(where, path, end)
        out.append("%stimeout %s" % (MARK, key) if status == "timeout" else "%s%s %s %s" % (MARK, status, key, body))
    sys.stdout.write("".join(line + "\n" for line in out))


if __name__ == "__main__":
    main(sys.argv[1:])
