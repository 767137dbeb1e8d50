"""Controller scale: a no-op run's wall time and controller CPU as the fleet grows, 5 to 100 hosts.

    .venv/bin/python bench/scale.py            # BENCH_SCALE_SIZES=5,20,50,100 BENCH_REPS=3

On the light scale testbed (nemofleet_testbed.scale: systemd, sshd, cron and the simulated GPU
tools per host, containers in one shared engine; a testbed of its own, nf-scale, ports 23701+),
brought up and converged once by the real deploy for the largest size; then for each size N the
no-op re-run of its first N hosts (`pyinfra -y inventories/testbed.py deploys/nemotron.py`),
BENCH_REPS times: median wall time, controller CPU (user+sys of the pyinfra process), the whole
machine's busy CPU over the run (/proc/stat; the rest is the hosts' own work: their sshd, docker
CLI, simulated nvidia-smi, plus anything else running on the machine), the 1-minute load average
before the run, remote commands per host (from a -vv run), each light host's own CPU (its
container's cgroup: sshd, shells, docker CLI, python, simulated GPU tools) with the simulated GPU
tools' share measured apart and left out, and the shared engine's dockerd CPU per host (the light
hosts' docker calls are served there). Results: bench/results/scale.json and a table.
BENCH_KEEP=1 keeps the testbed up afterwards.
"""
from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import benchlib
from benchlib import PYINFRA, ROOT, container_cpu, gpu_tools_cpu

benchlib.use_testbed("nf-scale", ".testbed-scale", 23701)

import nemofleet_testbed as testbed  # noqa: E402
from nemofleet_testbed import scale  # noqa: E402


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def busy_cpu() -> float:
    """Seconds of CPU the whole machine spent busy so far (/proc/stat: all but idle and iowait)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def load1() -> float:
    return float(open("/proc/loadavg").read().split()[0])


def quiet(window: float = 2.0, wait: float = 90.0) -> float:
    """Cores busy with other work just before a run (/proc/stat over `window` s, after the hosts
    settled from the previous run); waits up to `wait` s for it to fall below 0.5 core."""
    deadline = time.monotonic() + wait
    while True:
        b0, t0 = busy_cpu(), time.monotonic()
        time.sleep(window)
        busy = (busy_cpu() - b0) / (time.monotonic() - t0)
        if busy < 0.5 or time.monotonic() > deadline:
            return round(busy, 2)


def noop(hosts: list[str], verbose: bool = False) -> dict:
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts))
    busy_before = quiet()
    load = load1()
    names = [testbed.container(h) for h in hosts] + [scale.ENGINE]
    host_cpu = container_cpu(names)
    before, machine = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu()
    t0 = time.monotonic()
    p = subprocess.run([PYINFRA, "-y", *(["-vv"] if verbose else []), "inventories/testbed.py", "deploys/nemotron.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    machine = busy_cpu() - machine
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    host_after = container_cpu(names)
    spent = {k: host_after.get(k, 0.0) - v for k, v in host_cpu.items()}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = p.stdout + p.stderr
    grand = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    r = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "machine_cpu_s": round(machine, 2), "load1_before": load, "busy_cores_before": busy_before,
         "rc": p.returncode, "changed": bool(grand and grand.group(2) != "-"), "errors": bool(grand and grand.group(3) != "-"),
         # every light host's own CPU (mean per host), and the shared engine's dockerd (their docker calls)
         "host_cpu_per_host_s": round(sum(v for k, v in spent.items() if k != scale.ENGINE) / len(hosts), 3),
         "engine_cpu_s": round(spent.get(scale.ENGINE, 0.0), 2)}
    if verbose:
        count: dict[str, int] = {}
        for line in out.splitlines():
            m = re.match(r"^\[([^\]]+)\] >>> ", line)
            if m:
                count[m.group(1)] = count.get(m.group(1), 0) + 1
        r["commands_per_host"] = {"max": max(count.values()), "mean": round(statistics.mean(count.values()), 2),
                                  "hosts": len(count)} if count else {}
    if p.returncode:
        log(f"pyinfra rc={p.returncode}:\n{out[-3000:]}")
    return r


def ensure(n: int) -> list[str]:
    hosts = [scale.name(i) for i in range(1, n + 1)]
    state = testbed.read_state().get("hosts", {})
    if all(h in state for h in hosts):
        scale.up(n)  # starts anything stopped; creates nothing that is there
        missing = scale._unconverged(hosts)
    else:
        t0 = time.monotonic()
        scale.up(n)
        log(f"{n} light host(s) up in {time.monotonic() - t0:.0f}s")
        missing = hosts
    if missing:
        t0 = time.monotonic()
        scale.converge(missing)
        log(f"first converge of {len(missing)} light host(s): {time.monotonic() - t0:.0f}s")
    return hosts


def main() -> int:
    sizes = [int(x) for x in os.environ.get("BENCH_SCALE_SIZES", "5,20,50,100").split(",")]
    reps = int(os.environ.get("BENCH_REPS", "3"))
    hosts = ensure(max(sizes))
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores, "
           f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
           "testbed": "light scale hosts (nemofleet_testbed.scale): own systemd, sshd, cron, simulated GPU tools; "
                      "containers in one shared engine", "sizes": {}}
    noop(hosts[:1])  # warm the page cache and the controller's byte-compiled files
    out["gpu_tools_cpu_per_host_s"] = round(gpu_tools_cpu(hosts[0]), 3)
    for n in sizes:
        runs = [noop(hosts[:n]) for _ in range(reps)]
        counted = noop(hosts[:n], verbose=True)
        out["sizes"][str(n)] = {
            "noop_wall_s": statistics.median(r["wall_s"] for r in runs),
            "noop_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "machine_cpu_s": statistics.median(r["machine_cpu_s"] for r in runs),
            "host_cpu_per_host_s": statistics.median(r["host_cpu_per_host_s"] for r in runs),
            "host_cpu_per_host_without_gpu_tools_s": round(statistics.median(r["host_cpu_per_host_s"] for r in runs)
                                                           - out["gpu_tools_cpu_per_host_s"], 3),
            "engine_cpu_per_host_s": round(statistics.median(r["engine_cpu_s"] for r in runs) / n, 3),
            "load1_before": [r["load1_before"] for r in runs],
            "busy_cores_before": [r["busy_cores_before"] for r in runs],
            "changed": any(r["changed"] or r["errors"] or r["rc"] for r in runs + [counted]),
            "remote_commands_per_host": counted.get("commands_per_host", {}), "runs": runs}
        log(json.dumps({n: {k: v for k, v in out["sizes"][str(n)].items() if k != "runs"}}))
    lo, hi = out["sizes"][str(min(sizes))], out["sizes"][str(max(sizes))]
    out["ratio_20_over_5"] = round(out["sizes"]["20"]["noop_wall_s"] / out["sizes"]["5"]["noop_wall_s"], 2) \
        if "20" in out["sizes"] and "5" in out["sizes"] else None
    out["ratio_max_over_min"] = round(hi["noop_wall_s"] / lo["noop_wall_s"], 2)
    if "20" in out["sizes"] and "5" in out["sizes"]:  # what each added host costs the controller
        out["controller_cpu_per_added_host_s"] = round((out["sizes"]["20"]["noop_cpu_s"]
                                                        - out["sizes"]["5"]["noop_cpu_s"]) / 15, 3)
    benchlib.save_json("scale.json", out)
    print(table(out))
    if os.environ.get("BENCH_KEEP") != "1":
        scale.down()
    return 0


def table(out: dict) -> str:
    lines = [f"controller scale, no-op re-run, {out['date']}, {out['machine']}, {out['testbed']}", "",
             "| hosts | no-op wall | controller CPU | machine CPU (all processes) | host CPU per host (without "
             "GPU tools) | shared dockerd per host | remote commands per host | cores busy before (2 s) | "
             "load (1 min) before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, r in out["sizes"].items():
        c = r["remote_commands_per_host"]
        lines.append(f"| {n} | {r['noop_wall_s']:.2f} s | {r['noop_cpu_s']:.2f} s | {r['machine_cpu_s']:.2f} s | "
                     f"{r['host_cpu_per_host_s']:.3f} s ({r['host_cpu_per_host_without_gpu_tools_s']:.3f} s) | "
                     f"{r['engine_cpu_per_host_s']:.3f} s | "
                     f"{c.get('max', '?')} | {', '.join(f'{x:.2f}' for x in r['busy_cores_before'])} | "
                     f"{', '.join(f'{x:.2f}' for x in r['load1_before'])} |")
    lines.append(f"\nsimulated GPU tools per no-op (measured apart): {out['gpu_tools_cpu_per_host_s']:.3f} s per host")
    if out.get("controller_cpu_per_added_host_s") is not None:
        lines.append(f"controller CPU per added host ((CPU at 20 - CPU at 5) / 15): "
                     f"{out['controller_cpu_per_added_host_s']:.3f} s")
    if out.get("ratio_20_over_5"):
        lines.append(f"\n20-host / 5-host no-op wall: {out['ratio_20_over_5']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
