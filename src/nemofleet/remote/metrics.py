"""nemofleet-metrics: one read of this host's request metrics for the canary gate (fleet/rollout.py).

    python3 -I -S metrics.py HEALTH_CONFIG AUTH_HEADER TIMEOUT DEADLINE

Prints `@@gpu NAME` (the first GPU's name, as nvidia-smi gives it; empty without one), then for
each instance with an API in HEALTH_CONFIG (the health program's config the deploy wrote, so the
instances of the release the host runs now) an `@@instance NAME` line and the lines of its
/metrics that the gate reads (canary.py): vLLM's request success counter and its TTFT and
end-to-end latency histograms, and the HTTP server's request counter. /metrics is asked with the
API key header read from AUTH_HEADER (0600), like the health program asks it; the key is never
printed or put on a command line, and by the prelude's rule (http_request) no redirect is followed:
an instance's answer is its own, and the key goes nowhere else. An instance whose whole answer has
not come within TIMEOUT seconds, or not with 200, gets its `@@instance` line and nothing else; the
run ends within DEADLINE seconds (below the controller's bound), an instance not asked by then
likewise. Standard library only; always exits 0.
"""

import re
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

WANTED = re.compile(r"^(vllm:(request_success_total|time_to_first_token_seconds_bucket|"
                    r"e2e_request_latency_seconds_bucket)|http_requests_total)")


def gpu_name():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=10)
        return (r.stdout.splitlines() or [""])[0].strip()[:200]
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv):
    config, auth_path, timeout = argv[1], argv[2], float(argv[3])
    deadline(float(argv[4]))
    print(f"@@gpu {gpu_name()}")
    cfg = read_json(config)  # None: not deployed (yet), no instance
    headers = {}
    name, sep, value = (read_file(auth_path, 4096) or b"").decode("utf-8", "replace").strip().partition(":")
    if sep and "\n" not in value:
        headers[name.strip()] = value.strip()
    address = cfg.get("address") if isinstance(cfg, dict) else None
    if not isinstance(address, str) or not re.fullmatch(r"[0-9A-Fa-f.:\[\]]{2,60}", address):
        return
    for inst in cfg.get("instances") or []:
        if not isinstance(inst, dict):
            continue
        name, port = inst.get("name"), inst.get("port")
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name)
                and isinstance(port, int) and 0 < port < 65536):
            continue  # a headless worker (port 0) has no API
        print(f"@@instance {name}")
        try:
            status, body, _ = http_request(f"http://{address}:{port}/metrics", headers, limit=16 << 20,
                                           seconds=timeout)
        except (OSError, ValueError):
            continue
        if status != 200:
            continue
        for line in body.decode("utf-8", "replace").splitlines():
            if WANTED.match(line):
                print(line)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception:  # a program on a host never ends in a traceback; what was printed stands
        pass
    sys.exit(0)
