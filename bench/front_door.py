"""Benchmark: streamed chat completions through h100-1's front door while a rollout restarts its
instances (issue 17: zero failed requests, p50/p99 latency before / during / after).

    .venv/bin/python bench/front_door.py            # uses (or brings up) h100-1 of its own testbed

The load stays inside the testbed: this file is copied into the host and run there (`load`
mode) against its own front door on 127.0.0.1, with a fixed request count per phase and a few
concurrent streams (each request asks the stand-in to hold it ~HOLD seconds, spread over its
SSE chunks). The "during" phase runs from before `nemofleet rollout --limit h100-1` starts until
it ends, bounded by DURING_MAX requests. A request fails when its status is not 200, its stream
lacks `data: [DONE]`, or it raises. Results: printed, and bench/results/front_door.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HOLD = 0.5  # seconds each request is in flight at the instance
CONCURRENCY = 4
PHASE_REQUESTS = 80  # before and after
DURING_MAX = 4000  # the during phase stops when the rollout ends, or at this many requests
FRONT_DOOR = "http://127.0.0.1:8800"
HOST = "h100-1"


# ---------------------------------------------------------------------------- on the host

def one_request(url: str, key: str, model: str) -> tuple[bool, float, str]:
    import urllib.request as u

    body = json.dumps({"model": model, "stream": True, "max_tokens": 64, "standin_hold_seconds": HOLD,
                       "messages": [{"role": "user", "content": "What is 17*23?"}]}).encode()
    req = u.Request(url + "/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    t0 = time.monotonic()
    try:
        with u.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            ok = r.status == 200 and "data: [DONE]" in text and '"delta"' in text
            return ok, time.monotonic() - t0, "" if ok else f"status {r.status}, stream incomplete"
    except Exception as exc:  # noqa: BLE001 - every failure counts, with its reason
        return False, time.monotonic() - t0, f"{type(exc).__name__}: {exc}"


def load(url: str, key: str, model: str, requests: int, concurrency: int, stop_file: str | None) -> dict:
    lock = threading.Lock()
    results: list[tuple[bool, float, str]] = []
    sent = [0]

    def worker():
        while True:
            with lock:
                if sent[0] >= requests or (stop_file and os.path.exists(stop_file)):
                    return
                sent[0] += 1
            res = one_request(url, key, model)
            with lock:
                results.append(res)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(results, time.monotonic() - t0)


def summary(results, seconds: float) -> dict:
    lat = sorted(r[1] for r in results if r[0])
    failed = [r[2] for r in results if not r[0]]

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

    return {"requests": len(results), "failed": len(failed), "errors": sorted(set(failed))[:5],
            "p50_s": pct(0.50), "p99_s": pct(0.99), "seconds": round(seconds, 1)}


# ---------------------------------------------------------------------------- on the controller

def in_host(host: str, *args: str, stop_file: str | None = None, requests: int = PHASE_REQUESTS) -> subprocess.Popen:
    """Start the load generator inside the test host (against its own front door)."""
    import nemofleet_testbed as testbed

    c = testbed.container(host)
    subprocess.run(["docker", "cp", __file__, f"{c}:/tmp/nf_front_door_load.py"], check=True)
    key_cmd = "sed -n 's/^VLLM_API_KEY=//p' /etc/nemofleet/vllm.env"
    cmd = (f"python3 /tmp/nf_front_door_load.py load --url {FRONT_DOOR} --key \"$({key_cmd})\" "
           f"--requests {requests} --concurrency {CONCURRENCY}" + (f" --stop-file {stop_file}" if stop_file else ""))
    return subprocess.Popen(["docker", "exec", c, "bash", "-c", cmd], stdout=subprocess.PIPE, text=True)


def phase(host: str, requests: int = PHASE_REQUESTS) -> dict:
    p = in_host(host, requests=requests)
    out, _ = p.communicate(timeout=600)
    return json.loads(out.strip().splitlines()[-1])


def during_rollout(host: str, rollout_args: list[str], env: dict | None = None,
                   command: str = "rollout") -> tuple[dict, int, str, float]:
    """The during phase: load from before the rollout (or `command`: rollback) starts until it ends."""
    import nemofleet_testbed as testbed

    c, stop = testbed.container(host), "/tmp/nf_front_door_stop"
    subprocess.run(["docker", "exec", c, "rm", "-f", stop], check=True)
    p = in_host(host, stop_file=stop, requests=DURING_MAX)
    time.sleep(2)  # the load is flowing before the first restart
    nemofleet = str(Path(sys.executable).with_name("nemofleet"))
    t0 = time.monotonic()
    r = subprocess.run([nemofleet, command, "inventories/testbed.py", "--limit", host, *rollout_args],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=1500,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    took = time.monotonic() - t0
    subprocess.run(["docker", "exec", c, "touch", stop], check=True)
    out, _ = p.communicate(timeout=600)
    return json.loads(out.strip().splitlines()[-1]), r.returncode, r.stdout + r.stderr, took


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    os.environ.setdefault("NEMOFLEET_TESTBED_NAME", "nf-door")
    os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(root / ".testbed-door"))
    os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", "22701")
    os.environ["NEMOFLEET_TESTBED_HOSTS"] = HOST
    os.environ["PYINFRA_PROGRESS"] = "off"
    sys.path[:0] = [str(root / "src"), str(root / "testbed" / "src")]  # nemofleet's and the testbed's sources
    import nemofleet_testbed as testbed

    testbed.up(only=[HOST])
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    t0 = time.monotonic()
    subprocess.run([pyinfra, "-y", "inventories/testbed.py", "deploys/nemotron.py"], cwd=root, check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    converge = time.monotonic() - t0
    seed = int(time.time()) % 100000  # a serving flag this host does not have yet: every instance restarts
    before = phase(HOST)
    during, rc, out, took = during_rollout(HOST, ["--data", f'vllm_extra_args={{"seed": {seed}}}'])
    after = phase(HOST)
    report = {"converge_s": round(converge, 1), "rollout_s": round(took, 1), "rollout_rc": rc,
              "before": before, "during": during, "after": after}
    print(f"converge (to zero or more changes) {converge:.1f}s; rollout of 8 instances {took:.1f}s (rc {rc})")
    print(f"{'phase':<8} {'requests':>8} {'failed':>6} {'p50 s':>7} {'p99 s':>7}")
    for name in ("before", "during", "after"):
        ph = report[name]
        print(f"{name:<8} {ph['requests']:>8} {ph['failed']:>6} {ph['p50_s']!s:>7} {ph['p99_s']!s:>7}")
    results = root / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "front_door.json").write_text(json.dumps(report, indent=2) + "\n")
    if rc != 0:
        print(out[-3000:], file=sys.stderr)
    return 0 if rc == 0 and not any(report[p]["failed"] for p in ("before", "during", "after")) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("mode")
        ap.add_argument("--url", default=FRONT_DOOR)
        ap.add_argument("--key", required=True)
        ap.add_argument("--model", default="nemotron-3.5-lightning")
        ap.add_argument("--requests", type=int, default=PHASE_REQUESTS)
        ap.add_argument("--concurrency", type=int, default=CONCURRENCY)
        ap.add_argument("--stop-file")
        a = ap.parse_args()
        print(json.dumps(load(a.url, a.key, a.model, a.requests, a.concurrency, a.stop_file)))
        sys.exit(0)
    sys.exit(main())
