"""`make test`'s end-to-end stage: the e2e modules in shards that run at the same time, each shard
against a testbed of its own (its own containers, network, ports and state directory), so a
failing test in one shard can never make a test of another fail, and the real vLLM server's test
beside them on its own testbed too.

Most of an end-to-end test is waiting on a host (a canary's bake window, a rollout's health gate,
a reboot, a front door draining), which two shards overlap on two cores. The shards are balanced
by the modules' measured durations (docs/measurements.md, make test); a module stays whole (its
fixtures bring up and take down the hosts it needs).

Usage: python tests/run_shards.py [--real-server]   (exit 0 when every shard passed)
Each shard's whole output goes to .testlogs/<shard>.log; its stage lines ([make test] ...) are
printed as they come, its failures and summary at its end.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".testlogs"

# seconds each module took alone on the 2-core machine (docs/measurements.md): the greedy split below
# puts the longest first on the least loaded shard
WEIGHT = {
    "test_1_deploy.py": 240, "test_2_gpu_access.py": 18, "test_2_weights_and_docker.py": 29,
    "test_3_canary.py": 348, "test_3_lock.py": 137, "test_3_rollout_and_rebuild.py": 379,
    "test_4_bootstrap.py": 38, "test_5_cdi.py": 121, "test_6_faults.py": 115, "test_6_payloads.py": 250,
    "test_7_metrics.py": 6, "test_8_front_door.py": 258, "test_9_gateway.py": 55, "test_9_gateway_rollout.py": 290,
    "test_9_gpu_health.py": 121, "test_9_multinode.py": 238, "test_9_bundle.py": 81,
}
SHARDS = int(os.environ.get("NEMOFLEET_E2E_SHARDS", "2"))


def split(modules: list[str], n: int) -> list[list[str]]:
    """The modules in n shards of about equal measured time; each shard keeps file order (the
    session's first converge is test_1's, and a module never depends on another's)."""
    load = [0] * n
    shards: list[list[str]] = [[] for _ in range(n)]
    for m in sorted(modules, key=lambda m: -WEIGHT.get(m, 100)):
        k = load.index(min(load))
        shards[k].append(m)
        load[k] += WEIGHT.get(m, 100)
    return [sorted(s) for s in shards if s]


def prebuild() -> int:
    """The images every shard would otherwise build at once (cached by content in Docker's store)."""
    code = ("import nemofleet_testbed.images as i; i.host_image(); i.host_image('trixie'); i.standin_image()")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode


class Job(threading.Thread):
    def __init__(self, name: str, argv: list[str], env: dict):
        super().__init__(daemon=True)
        self.name_, self.argv, self.env, self.rc, self.lines = name, argv, env, None, []
        self.proc: subprocess.Popen | None = None

    def run(self) -> None:
        LOGS.mkdir(exist_ok=True)
        with open(LOGS / f"{self.name_}.log", "w") as log:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.lines.append(line)
                if line.startswith("[make test]"):
                    print(f"[make test] {self.name_}:{line[len('[make test]'):].rstrip()}", flush=True)
            self.rc = self.proc.wait()

    def report(self) -> str:
        """Its failures (pytest's FAILURES/ERRORS sections) and its summary, or the last lines."""
        text = "".join(self.lines)
        for mark in ("= FAILURES =", "= ERRORS =", "= short test summary info ="):
            at = text.find(mark)
            if at >= 0:
                return text[text.rfind("\n", 0, at) + 1:]
        return "".join(self.lines[-15:])


def main(argv: list[str]) -> int:
    modules = sorted(p.name for p in (ROOT / "tests" / "e2e").glob("test_*.py"))
    pytest = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=5", "-p", "no:cacheprovider"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("NEMOFLEET_TESTBED_")}
    t0 = time.monotonic()
    if prebuild() != 0:
        print("[make test] e2e: building the testbed images failed (output above)", flush=True)
        return 1
    print(f"[make test] e2e: images ready in {time.monotonic() - t0:.0f} s", flush=True)
    jobs = []
    for k, shard in enumerate(split(modules, SHARDS)):
        env = dict(base, NEMOFLEET_TESTBED_NAME=f"nf-test{k}", NEMOFLEET_TESTBED_DIR=str(ROOT / f".testbed-test{k}"),
                   NEMOFLEET_TESTBED_PORT_BASE=str(22301 + 30 * k))
        jobs.append(Job(f"e2e-{k}", pytest + [f"tests/e2e/{m}" for m in shard], env))
        print(f"[make test] e2e-{k}: {', '.join(shard)}", flush=True)
    if "--real-server" in argv:
        jobs.append(Job("real-server", pytest[:3] + ["-s", "-rs", "-p", "no:cacheprovider",
                                                     "tests/real_vllm/test_server.py"], base))
    for j in jobs:
        j.start()
    try:
        for j in jobs:
            j.join()
    except KeyboardInterrupt:  # end the shards we started, by their PIDs
        for j in jobs:
            if j.proc is not None and j.proc.poll() is None:
                j.proc.terminate()
        raise
    failed = [j for j in jobs if j.rc != 0]
    for j in jobs:
        print(f"\n===== {j.name_} (exit {j.rc}, whole log in {LOGS.relative_to(ROOT)}/{j.name_}.log)\n{j.report()}",
              flush=True)
    print(f"[make test] e2e: {len(jobs) - len(failed)} of {len(jobs)} shards passed in {time.monotonic() - t0:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
