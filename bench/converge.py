"""Benchmark: converge and no-op re-run of the main job on the local testbed.

    make bench        (needs `make testbed`; writes bench/results/converge.json)

Reports wall time per scenario (median of N no-op runs) and the exact number of remote
commands (SSH exec channels) per host, counted from pyinfra's -vv output (one `>>>` line
per exec, facts included). The first converge is measured only when the hosts are fresh
(`nemofleet testbed down && nemofleet testbed up`).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def run(deploy: str) -> tuple[float, dict[str, int], int]:
    env = dict(os.environ, PYINFRA_PROGRESS="off")
    t0 = time.monotonic()
    p = subprocess.run([PYINFRA, "-y", "-vv", "inventories/testbed.py", deploy], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    execs: dict[str, int] = {}
    for line in (p.stdout + p.stderr).splitlines():
        m = re.match(r"^\[([^\]]+)\] >>> ", line)
        if m:
            execs[m.group(1)] = execs.get(m.group(1), 0) + 1
    return wall, execs, p.returncode


def main() -> int:
    reps = int(os.environ.get("BENCH_REPS", "5"))
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "scenarios": {}}
    wall, execs, rc = run("deploys/nemotron.py")
    results["scenarios"]["converge (first run on these hosts, or no-op if converged)"] = {
        "wall_s": round(wall, 2), "execs_per_host": execs, "rc": rc}
    for name, deploy in (("no-op re-run", "deploys/nemotron.py"), ("preflight only", "deploys/preflight.py")):
        walls, last = [], {}
        for _ in range(reps):
            w, last, rc = run(deploy)
            walls.append(w)
        results["scenarios"][name] = {"median_wall_s": round(statistics.median(walls), 2),
                                      "runs": [round(w, 2) for w in walls], "execs_per_host": last}
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "converge.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
