"""nemofleet-smoke: one chat completion on this host, sent where a client on the host would send it.

    python3 -I -S smoke.py MARK HEALTH_CONFIG AUTH_HEADER FRONT_DOOR_CFG DEADLINE  < request.json

stdin: the request body without the model, one JSON object ({"messages": [...], "max_tokens": N});
the served model name is this host's own, read from its health program's config (HEALTH_CONFIG,
written by the deploy: each instance's port and served name, the address its ports are published
on, this host's part of a serving group). The request goes to the front door when the host has one
(HAProxy's `frontend front_door`, bound on 127.0.0.1 in FRONT_DOOR_CFG), else to the first instance
with an API. The API key is read from AUTH_HEADER (0600, the whole `Authorization: Bearer ...`
line) and is never printed or put on a command line. The request follows no redirect (the
prelude's http_request): the answer is the front door's or the instance's own, and the key goes
nowhere else. The whole run, the answer's last byte included, ends within DEADLINE seconds.

Prints the answer's body, then one marker line: `MARK http CODE SECONDS VIA` (CODE 000 when no HTTP
answer came, with the reason as the body), `MARK error SENTENCE` or `MARK skip SENTENCE`
(fleet/smoke.py parses it). A file that is a link, a FIFO or no regular file is not read (an
error line). Standard library only; always exits 0.
"""

import json
import os
import re
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403


def say(mark, kind, text):
    print(f"{mark} {kind} {text}")


def first_instance(cfg):
    """(port, served name) of the first instance with an API; None when there is none."""
    for inst in cfg.get("instances") or []:
        if isinstance(inst, dict) and isinstance(inst.get("port"), int) and inst["port"] > 0:
            return inst["port"], inst.get("model")
    return None


def front_door_port(path):
    """The port of HAProxy's front_door frontend on 127.0.0.1, or None."""
    text = (read_file(path, 1 << 20) or b"").decode("utf-8", "replace")
    if not re.search(r"^frontend front_door$", text, re.M):
        return None
    m = re.search(r"^ *bind 127\.0\.0\.1:([0-9]{1,5})$", text, re.M)
    return int(m.group(1)) if m else None


def main(argv):
    mark, config, auth_path, front_cfg, seconds = argv[1:6]
    deadline(float(seconds))
    auth = read_file(auth_path, 4096)
    if auth is None:
        return say(mark, "error", f"its API key file {auth_path} is not a regular file: deploy it again"
                   if os.path.lexists(auth_path) else f"it has no API key file {auth_path}: deploy it first")
    auth = auth.decode("utf-8", "replace").strip()
    name, sep, value = auth.partition(":")
    if not sep or name.strip().lower() != "authorization" or "\n" in auth:
        return say(mark, "error", f"its API key file {auth_path} is not one Authorization header line")
    cfg = read_json(config, 1 << 20)
    if not isinstance(cfg, dict):
        return say(mark, "error", f"its {config} is not JSON (or no regular file): deploy it again"
                   if os.path.lexists(config) else f"it has no {config}: deploy it first")
    first = first_instance(cfg)
    if first is None:
        group = cfg.get("group")
        if isinstance(group, dict) and group.get("role") == "worker":
            return say(mark, "skip", "a worker of a serving group: its head answers")
        return say(mark, "error", "its health config lists no instance with an API")
    port, model = first
    if not isinstance(model, str) or not re.fullmatch(r"[A-Za-z0-9._/:+-]{1,200}", model):
        return say(mark, "error", "its served model name is not an API model name")
    address = cfg.get("address")
    if not isinstance(address, str) or not re.fullmatch(r"[0-9A-Fa-f.:\[\]]{2,60}", address):
        return say(mark, "error", "its health config has no address to ask")
    via, url = f"instance {address}:{port}", f"http://{address}:{port}/v1/chat/completions"
    fd = front_door_port(front_cfg)
    if fd:
        via, url = f"front door 127.0.0.1:{fd}", f"http://127.0.0.1:{fd}/v1/chat/completions"
    try:
        body = json.loads(sys.stdin.read(1 << 20))
        if not isinstance(body, dict):
            raise ValueError("not an object")
    except ValueError:
        return say(mark, "error", "the request on stdin is not a JSON object")
    data = json.dumps({"model": model, **body}).encode()
    headers = {"Content-Type": "application/json", name.strip(): value.strip()}
    t0 = time.monotonic()
    try:
        code, text, _ = http_request(url, headers, data, limit=1 << 20)
    except (OSError, ValueError) as exc:  # refused, timed out, reset, the deadline, too long: no HTTP answer
        code, text = 0, str(getattr(exc, "reason", exc)).encode()
    seconds = time.monotonic() - t0
    print(text.decode("utf-8", "replace"))
    say(mark, "http", f"{code:03d} {seconds:.3f} {via}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception as exc:  # a program on a host never ends in a traceback: one marker line
        print(f"{sys.argv[1] if len(sys.argv) > 1 else '@@'} error the smoke program failed ({type(exc).__name__})")
    sys.exit(0)
