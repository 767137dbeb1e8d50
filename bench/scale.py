"""Controller scale: a no-op run's wall time and controller CPU as the fleet grows.

    .venv/bin/python bench/scale.py            # BENCH_SCALE_SIZES=5,10,20 BENCH_REPS=3

One testbed of its own (nf-bench, the 1x H200 bench profile of bench/run.py) with the largest
size's hosts, converged once; then for each size N the no-op re-run of its first N hosts,
BENCH_REPS times: median wall time, controller CPU (user+sys of the pyinfra process) and remote
commands per host (from a -vv run). These are full test hosts (systemd, sshd, cron, dockerd, a
stand-in vLLM container each), so 20 is about what 2 cores and 24 GiB start in reasonable time;
the per-host slope is what extrapolates. Results: bench/results/scale.json and a table.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (same testbed, profile and counting as bench/run.py)

ROOT = bench.ROOT


def noop(hosts: list[str]) -> dict:
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run([bench.PYINFRA, "-y", "inventories/testbed.py", "deploys/nemotron.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    changed = "Grand total" in p.stdout and not p.stdout.split("Grand total", 1)[1].split()[1] == "-"
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rc": p.returncode, "changed": changed}


def main() -> int:
    sizes = [int(x) for x in os.environ.get("BENCH_SCALE_SIZES", "5,10,20").split(",")]
    reps = int(os.environ.get("BENCH_REPS", "3"))
    hosts = bench.fresh(max(sizes))
    t0 = time.monotonic()
    first = bench.nemofleet(hosts)
    bench.log(f"first converge of {len(hosts)} host(s): {time.monotonic() - t0:.0f}s rc={first['rc']}")
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "sizes": {}}
    for n in sizes:
        runs = [noop(hosts[:n]) for _ in range(reps)]
        execs = bench.nemofleet(hosts[:n], verbose=True)["execs_per_host"]
        out["sizes"][str(n)] = {"noop_wall_s": statistics.median(r["wall_s"] for r in runs),
                                "noop_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                                "changed": any(r["changed"] for r in runs), "remote_commands_per_host": execs,
                                "runs": runs}
        bench.log(json.dumps({n: out["sizes"][str(n)]}))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "scale.json").write_text(json.dumps(out, indent=2))
    print(f"{'hosts':>5} {'no-op wall':>11} {'cpu':>7} {'cmds/host':>10}")
    for n, r in out["sizes"].items():
        print(f"{n:>5} {r['noop_wall_s']:10.2f}s {r['noop_cpu_s']:6.2f}s {r['remote_commands_per_host']:>10}")
    lo, hi = str(min(sizes)), str(max(sizes))
    print(f"{hi}-host / {lo}-host no-op wall: {out['sizes'][hi]['noop_wall_s'] / out['sizes'][lo]['noop_wall_s']:.2f}")
    if os.environ.get("BENCH_KEEP") != "1":
        for h in hosts:
            bench.testbed.destroy_host(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
