"""Benchmark (not a timed test): the SLO-gated canary under steady client load (issue 38).

    .venv/bin/python bench/canary.py [--bake 30]     # on the testbed of .testbed/ (`nemofleet testbed up`)

Steady load on every host (a generator inside each test host, two clients, non-streamed chat
completions round-robin over the host's instances as its health config lists them), then for each
of the stand-in releases -slow, -flaky and -nf2: `nemofleet rollout --canary 1 --batch 1 --bake B
--json` over a100-1, h100-1, h200-1. Reported per release: the rollout's result and exit code, the
failed client requests at the canary and on the hosts outside it (goal 0), the time from the
rollout's start to the fleet back on the old release (for a rolled-back release: when the command
ends, its rollback gated), and the largest gap between two progress lines of the rollout (the
"never silent over 10 s" figure). The fleet is converged back to the inventory's release after
each release. Results: printed, and bench/results/canary.json.

With --gateway (issue 49; gw-1 up and deployed with NEMOFLEET_TESTBED_GATEWAY=1, docs/gateway.md) the
load runs inside gw-1 through the gateway instead (three clients), and each release reports the
requests and failed requests as the client saw them, each host's share of the requests during the
rollout (HAProxy's counters: the bad release's share), the time to the fleet back on the old release
and the largest silent gap. Results: bench/results/canary-gateway.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ["a100-1", "h100-1", "h200-1"]
RELEASES = ["slow", "flaky", "nf2"]
CLIENTS = 2
STOP = "/tmp/nf_canary_load_stop"


# ---------------------------------------------------------------------------- on the host

def load(clients: int, gateway_model: str = "") -> dict:
    """Until the stop file appears: completions round-robin over the host's instances (on a
    gateway host, with `gateway_model`: through the gateway's one endpoint, port 8800)."""
    import itertools
    import re
    import urllib.error
    import urllib.request as u

    if gateway_model:  # the gateway checks the fleet's key against its 0600 patterns file
        inst = [("gateway", 8800, gateway_model)]
        key = open("/etc/nemofleet/front-door.keys").read().split()[-1]
    else:
        cfg = json.load(open("/etc/nemofleet/health.json"))  # the health program's config (render.health_config)
        inst = [(i["name"], i["port"], i["model"]) for i in cfg["instances"] if i["port"]]
        key = re.search(r"^VLLM_API_KEY=(.*)$", open("/etc/nemofleet/vllm.env").read(), re.M).group(1)
    ring = itertools.cycle(inst)
    lock = threading.Lock()
    out = {"requests": 0, "failed": 0, "errors": {}}

    def client():
        while not os.path.exists(STOP):
            with lock:
                name, port, model = next(ring)[:3]
            body = json.dumps({"model": model, "max_tokens": 64,
                               "messages": [{"role": "user", "content": "What is 17*23?"}]}).encode()
            req = u.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            why = ""
            try:
                with u.urlopen(req, timeout=60) as r:
                    r.read()
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
            except Exception as exc:  # noqa: BLE001 - every failure counts, with its reason
                why = type(exc).__name__
            if why:
                time.sleep(0.2)  # a refused port or a draining instance: a client retries, it does not spin
            with lock:
                out["requests"] += 1
                if why:
                    out["failed"] += 1
                    out["errors"][why] = out["errors"].get(why, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ---------------------------------------------------------------------------- on the controller

def start_load(host: str, gateway_model: str = "", clients: int = CLIENTS) -> subprocess.Popen:
    import nemofleet_testbed as testbed

    c = testbed.container(host)
    subprocess.run(["docker", "exec", c, "rm", "-f", STOP], check=True)
    subprocess.run(["docker", "cp", __file__, f"{c}:/tmp/nf_canary_load.py"], check=True)
    return subprocess.Popen(["docker", "exec", c, "python3", "/tmp/nf_canary_load.py", "load", str(clients),
                             *([gateway_model] if gateway_model else [])], stdout=subprocess.PIPE, text=True)


def stop_load(host: str, p: subprocess.Popen) -> dict:
    import nemofleet_testbed as testbed

    subprocess.run(["docker", "exec", testbed.container(host), "touch", STOP], check=True)
    out, _ = p.communicate(timeout=120)
    return json.loads(out.strip().splitlines()[-1])


def rollout(args: list[str], hosts: list[str] = HOSTS) -> dict:
    """Run `nemofleet rollout --json`, timing each progress line (stderr) as it comes."""
    nemofleet = str(Path(sys.executable).with_name("nemofleet"))
    cmd = [nemofleet, "rollout", "inventories/testbed.py", "--json", *args]
    for h in hosts:
        cmd += ["--limit", h]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    stamps, lines = [t0], []

    def read_err():
        for line in p.stderr:  # type: ignore[union-attr]
            stamps.append(time.monotonic())
            lines.append(line.rstrip())
    reader = threading.Thread(target=read_err)
    reader.start()
    out = p.stdout.read()  # type: ignore[union-attr]
    p.wait()
    reader.join()
    end = time.monotonic()
    stamps.append(end)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {"result": "no JSON", "raw": out[-2000:]}
    return {"rc": p.returncode, "doc": doc, "seconds": round(end - t0, 1), "largest_gap_s": round(max(gaps), 1),
            "log": lines}


def converge() -> None:
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    args = [pyinfra, "-y", "inventories/testbed.py", "deploys/nemotron.py"]
    for h in HOSTS:
        args += ["--limit", h]
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True, stdin=subprocess.DEVNULL)


GW = "gw-1"


def gateway_stot() -> dict:
    """Requests each server of gw-1 took so far (HAProxy's `show stat`, read inside gw-1)."""
    import nemofleet_testbed as testbed

    code = ("import socket,sys;s=socket.socket(socket.AF_UNIX);s.connect('/run/haproxy/nemofleet-admin.sock');"
            "s.sendall(b'show stat\\n');sys.stdout.write(s.makefile().read())")
    text = subprocess.run(["docker", "exec", testbed.container(GW), "python3", "-c", code], capture_output=True,
                          text=True, check=True).stdout
    col = text.splitlines()[0].lstrip("# ").split(",").index("stot")
    return {r[1]: int(r[col] or 0) for r in (ln.split(",") for ln in text.splitlines() if ln.startswith("vllm,"))
            if r[1] not in ("BACKEND", "FRONTEND")}


def one_release(release: str, bake: float, gateway: bool = False) -> dict:
    # the one pin of the vLLM image (releases are tags beside it); imported here, not at the top:
    # this file is also copied onto a test host and run there as the load generator (load())
    from nemofleet.settings import DEFAULT_IMAGE

    # the load: inside each host against its own instances, or (--gateway) inside gw-1 through it
    loads = {GW: start_load(GW, "nemotron-3.5-lightning", clients=3)} if gateway else {h: start_load(h) for h in HOSTS}
    time.sleep(3)  # the load flows before the rollout starts
    before = gateway_stot() if gateway else {}
    r = rollout(["--canary", "1", "--batch", "1", "--wait", "120", "--bake", str(bake),
                 "--data", f"vllm_image={DEFAULT_IMAGE}-{release}"])
    done = {h: stop_load(h, p) for h, p in loads.items()}
    doc = r["doc"]
    if gateway:
        after = gateway_stot()
        took = {h: after.get(h, 0) - before.get(h, 0) for h in HOSTS}
        canary = [h for h, v in (doc.get("hosts") or {}).items() if v.get("canary")] or HOSTS[:1]
        return {"release": release, "result": doc.get("result"), "rc": r["rc"], "reason": doc.get("reason"),
                "seconds": r["seconds"], "largest_progress_gap_s": r["largest_gap_s"],
                "back_on_old_release_s": r["seconds"] if doc.get("result") == "rolled_back" else None,
                "requests": done[GW]["requests"], "failed": done[GW]["failed"], "errors": done[GW]["errors"],
                "served_per_host": took, "canary_share_whole_rollout": round(
                    sum(took[h] for h in canary) / max(1, sum(took.values())), 3),
                "steps": [b.get("steps") for b in doc.get("batches") or []],
                "batches": doc.get("batches"), "log": r["log"]}
    canary_hosts = [h for h, v in (doc.get("hosts") or {}).items() if v.get("canary")] or HOSTS[:1]
    return {
        "release": release, "result": doc.get("result"), "rc": r["rc"], "reason": doc.get("reason"),
        "seconds": r["seconds"],
        "back_on_old_release_s": r["seconds"] if doc.get("result") == "rolled_back" else None,
        "largest_progress_gap_s": r["largest_gap_s"],
        "failed_outside_canary": sum(done[h]["failed"] for h in HOSTS if h not in canary_hosts),
        "requests_outside_canary": sum(done[h]["requests"] for h in HOSTS if h not in canary_hosts),
        "failed_at_canary": sum(done[h]["failed"] for h in canary_hosts),
        "requests_at_canary": sum(done[h]["requests"] for h in canary_hosts),
        "canary_errors": {k: v for h in canary_hosts for k, v in done[h]["errors"].items()},
        "batches": doc.get("batches"), "hosts": {h: (v.get("from"), v.get("to"), v.get("result"))
                                                 for h, v in (doc.get("hosts") or {}).items()},
        "log": r["log"],
    }


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--bake", type=float, default=30)
    ap.add_argument("--releases", default=",".join(RELEASES))
    ap.add_argument("--gateway", action="store_true",
                    help="the load through gw-1 (NEMOFLEET_TESTBED_GATEWAY=1: gw-1 up and deployed; issue 49)")
    a = ap.parse_args()
    if a.gateway:
        os.environ["NEMOFLEET_TESTBED_GATEWAY"] = "1"
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "testbed" / "src")]  # nemofleet's and the testbed's sources
    os.environ["PYINFRA_PROGRESS"] = "off"
    results = []
    for release in a.releases.split(","):
        res = one_release(release, a.bake, a.gateway)
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("batches", "log")}, indent=1), flush=True)
        converge()  # back to the inventory's release for the next one
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    name = "canary-gateway.json" if a.gateway else "canary.json"
    (ROOT / "bench" / "results" / name).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:
        print(json.dumps(load(int(sys.argv[2]), *sys.argv[3:4])))
    else:
        sys.exit(main())
