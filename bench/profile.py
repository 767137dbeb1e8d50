"""Where the controller's time goes on a no-op run (issue: controller scale).

    .venv/bin/python bench/profile.py [HOST,HOST,...]     # default: every host of the testbed

Runs `pyinfra -y inventories/testbed.py deploys/nemotron.py` twice (the first converges, the
second is the no-op being measured) under cProfile, and buckets every function's own time
(cProfile's tottime, which sums to the run's total; a builtin's time goes to its callers) by
what it is doing:

    startup        imports and byte-compiling (once per run, not per host)
    ssh wait       gevent/paramiko/socket time: waiting on the hosts, encryption, framing
    nemofleet      the deploy deciding and generating operations (desired, render, settings,
                   plan, operations/*), split out: fact parsing (facts/*) and jinja2 rendering
    pyinfra        pyinfra's own bookkeeping (operation registration, call-location lookup via
                   inspect, argument type hints, state, output)
    other          the rest of the standard library

and prints them per run and per host, with the remote command count per host (from a -vv run).
The numbers go in the closing notes and docs/measurements.md, not in timed tests.
"""
from __future__ import annotations

import io
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PYINFRA_PROGRESS"] = "off"

BUCKETS = [  # (name, regex on the profiled function's file name), first match wins
    ("startup", r"<frozen importlib|importlib/|marshal|\{built-in method builtins.compile\}|pkgutil|zipimport"),
    ("ssh wait", r"gevent/|paramiko/|socket|ssl|select|selectors|cryptography|nacl|bcrypt"),
    ("nemofleet: facts", r"nemofleet/facts/"),
    ("nemofleet: jinja2", r"jinja2/|markupsafe/"),
    ("nemofleet: decide + operations", r"nemofleet/"),
    ("pyinfra", r"pyinfra(_cli)?/|click/|inspect\.py|typing\.py"),
    ("other", r""),
]


def bucket(filename: str, func: str) -> str:
    where = f"{filename}:{func}"
    for name, rx in BUCKETS:
        if re.search(rx, where):
            return name
    return "other"


def profile_run(hosts: list[str]) -> tuple[float, dict[str, float]]:
    env = dict(os.environ)
    if hosts:
        env["NEMOFLEET_TESTBED_HOSTS"] = ",".join(hosts)
    fd, name = tempfile.mkstemp(suffix=".prof")
    os.close(fd)
    out = Path(name)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "pyinfra", "-y", "inventories/testbed.py",
                    "deploys/nemotron.py"], cwd=ROOT, env=env, check=True, capture_output=True)
    wall = time.monotonic() - t0
    stats = pstats.Stats(str(out), stream=io.StringIO())
    totals: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tottime, _ct, callers) in stats.stats.items():
        if filename == "~" and callers and not re.search(BUCKETS[0][1], func):
            # a builtin (hasattr, isinstance, stat...): its time belongs to whoever called it
            # (inspect.getmodule's hasattr loop is pyinfra's call-location lookup, not "other")
            spent = sum(c[2] for c in callers.values()) or 1.0
            for (cfile, _cl, cfunc), c in callers.items():
                b = bucket(cfile, cfunc)
                totals[b] = totals.get(b, 0.0) + tottime * c[2] / spent
            continue
        b = bucket(filename, func)
        totals[b] = totals.get(b, 0.0) + tottime
    out.unlink(missing_ok=True)
    return wall, totals


def commands_per_host(hosts: list[str]) -> dict[str, int]:
    env = dict(os.environ)
    if hosts:
        env["NEMOFLEET_TESTBED_HOSTS"] = ",".join(hosts)
    r = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "-y", "-vv", "inventories/testbed.py",
                        "deploys/nemotron.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    count: dict[str, int] = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"^\[([^\]]+)\] >>> ", line)
        if m:
            count[m.group(1)] = count.get(m.group(1), 0) + 1
    return count


def main(argv: list[str]) -> int:
    hosts = [h for h in (argv[0].split(",") if argv else []) if h]
    subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/testbed.py",
                    "deploys/nemotron.py"], cwd=ROOT, capture_output=True,
                   env=dict(os.environ, **({"NEMOFLEET_TESTBED_HOSTS": ",".join(hosts)} if hosts else {})))
    wall, totals = profile_run(hosts)
    cmds = commands_per_host(hosts)
    n = max(len(cmds), 1)
    total = sum(totals.values())
    print(f"no-op run of {n} host(s): {wall:.2f} s wall under cProfile, {total:.2f} s profiled")
    print(f"{'bucket':<32} {'s/run':>8} {'s/host':>8} {'share':>7}")
    for name, _ in BUCKETS:
        t = totals.get(name, 0.0)
        print(f"{name:<32} {t:8.3f} {t / n:8.3f} {t / total:7.1%}")
    print("remote commands per host: " + ", ".join(f"{h} {c}" for h, c in sorted(cmds.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
