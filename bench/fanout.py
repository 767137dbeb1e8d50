"""Weights fan-out: bytes the origin serves and time to serving, with and without fan-out.

    flock /work/testbed.lock .venv/bin/python bench/fanout.py   # BENCH_FAN_SIZES=8,4,1 BENCH_FAN_GB=1.1

BENCH_FAN_MODE=fresh (the default): the main job on fresh hosts. For each size N and fan-out off
and on, N full test hosts are created fresh (never converged: no image, no weights, no units) and
converged by `pyinfra inventories/testbed.py deploys/nemotron.py` (one run over the N hosts, the
generated model given with --data; `weights_fanout=false` for off) with the mirror's uplink bounded
to BENCH_FAN_RATE; time to serving is that run's wall time (it ends when every instance answers
ready); origin bytes and the verified markers as below.

BENCH_FAN_MODE=rollout: the rollout of a new model commit to serving hosts, below.

On full test hosts of a testbed of its own (nf-fan, ports 23901+; 1x H200 profile each, own
dockerd, sshd, systemd), converged once with the testbed's tiny model (set-up, not measured).
Then a generated model of BENCH_FAN_GB GB (4 valid safetensors shards of random bytes, served by
the testbed's mirror under the Lightning NVFP4 repo id at a commit of its own) is rolled out to N
fresh-for-that-model hosts (`nemofleet rollout --batch 100%`, the model given with --data) with
the mirror's uplink bounded to BENCH_FAN_RATE bytes/s (50 MB/s), once with the fan-out off
(`weights_fanout=false`: every host fetches from the mirror) and once on, side by side:

- origin bytes: the bytes of file downloads the mirror served during the run (its `.bytes` log;
  API calls are not counted), against the model's own bytes;
- time to serving: the rollout's wall time, from start until every host passed the health gate;
- every host's weights verified: the completion marker of the commit, written by the weights
  check on the host after the copy.

Before each run the model's directory is removed on every host (the tiny model's stays: the
hosts are otherwise converged, as after a release of a new model commit). Then a no-op re-run
of the same hosts with this checkout and with the main checkout (BENCH_MAIN_ROOT, /work/main):
controller CPU and each host's own CPU (its container's cgroup: sshd, its dockerd and docker CLI,
python, the simulated GPU tools, whose share is measured apart). Results: bench/results/fanout.json
and a table. BENCH_FAN_KEEP=1 keeps the testbed up afterwards. BENCH_FAN_KILL=1 runs only the
killed-source drill (killed_source: 3 hosts, a source's rsync senders killed mid-copy).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import PYINFRA, ROOT, gpu_tools_cpu

benchlib.use_testbed("nf-fan", ".testbed-fan", 23901)

import nemofleet_testbed as testbed  # noqa: E402
from nemofleet.models import host_dir_name  # noqa: E402
from nemofleet_testbed import tinymodel  # noqa: E402
from nemofleet.facts.weights import CHECK_SCRIPT as CHECK  # noqa: E402
INVENTORY = "inventories/testbed.py"
MODELS = "/srv/nemofleet/models"
PROFILE = {"group": "gpu_h200", "driver": "580.159.04", "cuda": "13.0", "toolkit": "1.18.0",
           "gpus": [{"name": "NVIDIA H200", "memory_mib": 143771, "cc": "9.0", "bus_id": "00000000:00:06.0",
                     "uuid": "GPU-ea950d4d-c55e-4fad-740e-b8bae40ede3a", "mig": "Disabled",
                     "persistence": "Enabled", "power_limit": 700}]}


def log(msg):
    print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def profile_file(n: int) -> Path:
    import yaml

    p = testbed.testbed_dir() / "fan-profile.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump({"hosts": {f"fan-{i}": PROFILE for i in range(1, n + 1)}}))
    return p


def pyinfra(hosts: list[str], *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts))
    return subprocess.run([PYINFRA, "-y", *args, INVENTORY, "deploys/nemotron.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def ensure(n: int) -> list[str]:
    hosts = [f"fan-{i}" for i in range(1, n + 1)]
    t0 = time.time()
    testbed.up(str(profile_file(n)), only=hosts)
    todo = [h for h in hosts if on(h, "test -s /var/lib/nemofleet/release").returncode]
    if todo:
        r = pyinfra(todo)
        bad = [h for h in todo if on(h, "test -s /var/lib/nemofleet/release").returncode]
        if bad:
            raise SystemExit(f"first converge failed on {', '.join(bad)}:\n{(r.stdout + r.stderr)[-3000:]}")
    log(f"{n} host(s) up and converged with the tiny model in {time.time() - t0:.0f}s")
    return hosts


def on(host: str, cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", testbed.container(host), "sh", "-c", cmd], capture_output=True, text=True)


def big_model(gb: float) -> tuple[str, int]:
    """A generated model of `gb` GB: 4 valid safetensors shards of random bytes (os.urandom: fast to make,
    incompressible, so rsync and HTTP move every byte), published as a commit of the testbed's repo."""
    state = testbed.read_state()
    want = int(gb * 1e9)
    if state.get("fan_model", {}).get("bytes") == want:
        return state["fan_model"]["sha"], state["fan_model"]["weight_bytes"]
    t0 = time.time()
    files, weight_map, total, shards = {}, {}, 0, 4
    for i in range(1, shards + 1):
        n = want // shards // 2 * 2
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tname = f"backbone.layers.{i - 1}.mixer.weight"
        files[name] = tinymodel.safetensors_bytes({tname: ([n // 2], os.urandom(n))})
        weight_map[tname] = name
        total += n
    files["model.safetensors.index.json"] = json.dumps({"metadata": {"total_size": total},
                                                        "weight_map": weight_map}).encode()
    files["config.json"] = json.dumps({"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                                       "max_position_embeddings": 1048576, "nemofleet_tiny": "fan-bench"}).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}).encode()
    files["tokenizer_config.json"] = b"{}"
    repos = testbed.testbed_dir() / "hf" / "repos"
    refs = repos / testbed.MODEL_REPO / "refs.json"
    old = json.loads(refs.read_text()) if refs.exists() else {}
    sha = tinymodel.publish(str(repos), testbed.MODEL_REPO, files)
    refs.write_text(json.dumps({**old, "fan-bench": sha}))  # main stays the tiny model's commit
    weight_bytes = sum(len(v) for v in files.values())
    state["fan_model"] = {"sha": sha, "bytes": want, "weight_bytes": weight_bytes}
    testbed.write_state(state)
    log(f"generated model {sha[:12]}: {weight_bytes / 1e9:.2f} GB in {time.time() - t0:.0f}s")
    return sha, weight_bytes


def mirror_bytes(sha: str) -> int:
    path = testbed.testbed_dir() / "hf" / "requests.log.bytes"
    if not path.exists():
        return 0
    return sum(int(line.split()[0]) for line in path.read_text().splitlines() if sha in line)


def set_rate(rate: int | None) -> None:
    path = testbed.testbed_dir() / "hf" / "uplink-rate"
    if rate:
        path.write_text(str(rate))
    else:
        path.unlink(missing_ok=True)


def one_run(hosts: list[str], sha: str, fan: bool, rate: int) -> dict:
    from nemofleet.fleet import rollout

    wdir = f"{MODELS}/{host_dir_name(testbed.MODEL_REPO, sha)}"
    for h in hosts:  # fresh for this model: its directory gone
        on(h, f"rm -rf '{wdir}' '{wdir}.nemofleet-link'")
    set_rate(rate)
    before = mirror_bytes(sha)
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": sha}
    data = {"model": json.dumps(model), **({} if fan else {"weights_fanout": "false"})}
    lines: list[str] = []
    t0 = time.monotonic()
    o = rollout.rollout(INVENTORY, batch="100%", window=600, limit=hosts, data=data, log=lines.append)
    wall = time.monotonic() - t0
    served = mirror_bytes(sha) - before
    verified = [h for h in hosts if on(h, f"grep -qs '\"revision\": \"{sha}\"' '{wdir}/.nemofleet-complete'").returncode == 0]
    r = {"hosts": len(hosts), "fanout": fan, "rate_bytes_s": rate, "time_to_serving_s": round(wall, 1),
         "origin_bytes": served, "ok": o.ok, "verified": len(verified),
         "results": {x.host: x.result for x in o.results},
         "tree": [ln.strip() for ln in lines if ln.strip().startswith("weights:")]}
    if not o.ok:
        r["table"] = o.table()
        r["log_tail"] = lines[-20:]
    log(json.dumps({k: v for k, v in r.items() if k not in ("tree", "log_tail")}))
    return r


def fresh_hosts(n: int) -> list[str]:
    """N full test hosts created fresh (the ones before destroyed): never converged."""
    state = testbed.read_state()
    for h in list(state.get("hosts", {})):
        testbed.destroy_host(h)
    (testbed.testbed_dir() / "known_hosts").unlink(missing_ok=True)
    state = testbed.read_state()
    state.pop("hosts", None)
    testbed.write_state(state)
    hosts = [f"fan-{i}" for i in range(1, n + 1)]
    t0 = time.time()
    testbed.up(str(profile_file(n)), only=hosts)
    log(f"{n} fresh host(s) up in {time.time() - t0:.0f}s")
    return hosts


def fresh_run(n: int, sha: str, fan: bool, rate: int) -> dict:
    """The main job on N fresh hosts, one pyinfra run, the mirror bounded to `rate`."""
    hosts = fresh_hosts(n)
    wdir = f"{MODELS}/{host_dir_name(testbed.MODEL_REPO, sha)}"
    set_rate(rate)
    before = mirror_bytes(sha)
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": sha}
    args = ["--data", f"model={json.dumps(model)}", *([] if fan else ["--data", "weights_fanout=false"])]
    t0 = time.monotonic()
    r = pyinfra(hosts, *args)
    wall = time.monotonic() - t0
    served = mirror_bytes(sha) - before
    set_rate(None)
    verified = [h for h in hosts if on(h, f"grep -qs '\"revision\": \"{sha}\"' '{wdir}/.nemofleet-complete'").returncode == 0]
    serving = [h for h in hosts if on(h, "test -s /var/lib/nemofleet/release").returncode == 0]
    out = r.stdout + r.stderr
    res = {"mode": "fresh", "hosts": n, "fanout": fan, "rate_bytes_s": rate, "time_to_serving_s": round(wall, 1),
           "origin_bytes": served, "ok": r.returncode == 0 and len(serving) == n, "verified": len(verified),
           "serving": len(serving),
           "tree": sorted({ln.split("warning: ", 1)[-1].strip() for ln in out.splitlines() if "weights: copied" in ln})}
    if r.returncode:
        res["log_tail"] = out[-3000:]
    log(json.dumps({k: v for k, v in res.items() if k not in ("tree", "log_tail")}))
    return res


def container_cpu(host: str) -> float:
    """CPU seconds the full test host's container has used (benchlib.container_cpu)."""
    name = testbed.container(host)
    return benchlib.container_cpu([name]).get(name, float("nan"))


def noop_cpu(hosts: list[str], sha: str, root: str, reps: int = 3) -> dict:
    """A no-op re-run of `hosts` (the model of the last run given as --data) with the checkout at
    `root` (its sources, deploy, inventory and group data): controller CPU and each host's own
    CPU (median of `reps`), changes counted."""
    import re
    import resource
    import statistics

    model = json.dumps({"catalog": "nemotron-3.5-lightning-nvfp4", "revision": sha})
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts), PYTHONPATH=f"{root}/src")
    runs = []
    for _ in range(reps):
        time.sleep(3)  # the hosts settle (their health checks run every minute)
        cpu0 = {h: container_cpu(h) for h in hosts}
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "--data", f"model={model}", INVENTORY,
                            "deploys/nemotron.py"], cwd=root, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        per_host = [container_cpu(h) - cpu0[h] for h in hosts]
        grand = re.search(r"Grand total\s+(\d+)\s+(\S+)", p.stdout + p.stderr)
        runs.append({"wall_s": round(wall, 2), "controller_cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 2),
                     "host_cpu_per_host_s": round(statistics.mean(per_host), 3), "rc": p.returncode,
                     "changed": bool(grand and grand.group(2) != "-")})
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "controller_cpu_s", "host_cpu_per_host_s")}
    return {**med, "changed": any(r["changed"] or r["rc"] for r in runs), "runs": runs}


def noop_ab(hosts: list[str], sha: str) -> dict:
    """Host-side CPU per no-op, this branch against the main checkout, on the same full hosts."""
    pyinfra(hosts, "--data", "model=" + json.dumps({"catalog": "nemotron-3.5-lightning-nvfp4", "revision": sha}))
    out = {"hosts": len(hosts), "gpu_tools_cpu_per_host_s": round(gpu_tools_cpu(hosts[0]), 3)}
    for label, root in (("main", os.environ.get("BENCH_MAIN_ROOT", "/work/main")), ("branch", str(ROOT))):
        out[label] = noop_cpu(hosts, sha, root)
        out[label]["host_cpu_without_gpu_tools_s"] = round(out[label]["host_cpu_per_host_s"]
                                                           - out["gpu_tools_cpu_per_host_s"], 3)
        log(f"no-op {label}: " + json.dumps({k: v for k, v in out[label].items() if k != "runs"}))
    return out


def senders(host: str) -> list[int]:
    """PIDs of the rsync senders serving a weights copy on `host` (processes this bench's rollout
    started there, found by their command line and ended by PID)."""
    out = on(host, "ps -eo pid=,args=").stdout.splitlines()
    return [int(ln.split()[0]) for ln in out if "rsync --server --sender" in ln]


def killed_source(sha: str) -> dict:
    """3 hosts, fan-out on, each copy bounded to 20 MB/s (weights_peer_bwlimit) so it can be hit
    mid-copy: once a copy from fan-1 is under way, every rsync sender on fan-1 is killed. The
    hosts that copied from fan-1 go on to their next source (a spare, which may still be fetching:
    waited for) or the origin; every copy must still end verified and nothing half-written marked."""
    from nemofleet.fleet import rollout

    hosts = ["fan-1", "fan-2", "fan-3"]
    wdir = f"{MODELS}/{host_dir_name(testbed.MODEL_REPO, sha)}"
    for h in hosts:
        on(h, f"rm -rf '{wdir}' '{wdir}.nemofleet-link'")
    set_rate(None)
    before = mirror_bytes(sha)
    # the killer is a shell loop of its own (no thread in this process: pyinfra's gevent patches
    # threading on import); it ends, by PID, every rsync sender on fan-1 once a copy passed 200 MB
    c1, c2, c3 = (testbed.container(h) for h in hosts)
    script = (f"end=$(( $(date +%s) + 600 )); while [ $(date +%s) -lt $end ]; do "
              f"pids=$(docker exec {c1} ps -eo pid=,args= | awk '/rsync --server --sender/ {{print $1}}'); "
              f"got=$( (docker exec {c2} du -sb '{wdir}'; docker exec {c3} du -sb '{wdir}') 2>/dev/null "
              "| awk 'BEGIN {m = 0} $1 > m {m = $1} END {print m}'); "
              "if [ -n \"$pids\" ] && [ \"$got\" -gt 200000000 ]; then "
              f"for p in $pids; do docker exec {c1} kill $p; done; echo \"killed $pids at $got\"; exit 0; fi; "
              "sleep 1; done")
    killer = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": sha}
    lines: list[str] = []
    t0 = time.monotonic()
    o = rollout.rollout(INVENTORY, batch="100%", window=600, limit=hosts, log=lines.append,
                        data={"model": json.dumps(model), "weights_peer_bwlimit": "20M"})
    wall = time.monotonic() - t0
    if killer.poll() is None:
        killer.terminate()
    killed = (killer.communicate()[0] or "").strip()
    verified = [h for h in hosts if on(h, f"grep -qs '\"revision\": \"{sha}\"' '{wdir}/.nemofleet-complete'").returncode == 0]
    checked = [h for h in hosts if '"complete": true' in on(h, f"python3 -c {shlex.quote(CHECK)} '{wdir}' '{sha}' check").stdout]
    r = {"hosts": 3, "killed": killed or "nothing (no copy from fan-1 passed 200 MB)", "time_to_serving_s": round(wall, 1), "origin_bytes": mirror_bytes(sha) - before,
         "ok": o.ok, "verified": len(verified), "complete_by_recheck": len(checked),
         "results": {x.host: x.result for x in o.results},
         "tree": [ln.strip() for ln in lines if ln.strip().startswith("weights:")]}
    log(json.dumps(r))
    return r


def main() -> int:
    if os.environ.get("BENCH_FAN_KILL") == "1":  # only the killed-source run
        os.chdir(ROOT)
        ensure(3)
        sha, weight_bytes = big_model(float(os.environ.get("BENCH_FAN_GB", "1.1")))
        r = killed_source(sha)
        benchlib.save_json("fanout-killed.json", {**r, "model_bytes": weight_bytes})
        if os.environ.get("BENCH_FAN_KEEP") != "1":
            testbed.down()
        return 0
    sizes = [int(x) for x in os.environ.get("BENCH_FAN_SIZES", "8,4,1").split(",")]
    gb = float(os.environ.get("BENCH_FAN_GB", "1.1"))
    rate = int(float(os.environ.get("BENCH_FAN_RATE", "50e6")))
    os.chdir(ROOT)
    if os.environ.get("BENCH_FAN_MODE", "fresh") == "fresh":
        fresh_hosts(1)
        sha, weight_bytes = big_model(gb)
        out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores", "mode": "fresh",
               "model_bytes": weight_bytes, "mirror_rate_bytes_s": rate, "runs": []}
        for n in sizes:
            for fan in (False, True):
                out["runs"].append(fresh_run(n, sha, fan, rate))
                benchlib.save_json("fanout-fresh.json", out)
        print(table(out))
        if os.environ.get("BENCH_FAN_KEEP") != "1":
            testbed.down()
        return 0
    hosts = ensure(max(sizes))
    sha, weight_bytes = big_model(gb)
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores",
           "model_bytes": weight_bytes, "mirror_rate_bytes_s": rate, "runs": []}
    for n in sizes:
        for fan in (False, True):
            out["runs"].append(one_run(hosts[:n], sha, fan, rate))
            benchlib.save_json("fanout.json", out)
    set_rate(None)
    if os.environ.get("BENCH_FAN_NOOP", "1") == "1":
        out["noop"] = noop_ab(hosts, sha)
        benchlib.save_json("fanout.json", out)
    print(table(out))
    if os.environ.get("BENCH_FAN_KEEP") != "1":
        testbed.down()
    return 0


def table(out: dict) -> str:
    mb = out["model_bytes"]
    what = "fresh hosts, one converge" if out.get("mode") == "fresh" else "rollout to serving hosts"
    lines = [f"weights fan-out ({what}), {out['date']}, {out['machine']}, model {mb / 1e9:.2f} GB, mirror uplink "
             f"{out['mirror_rate_bytes_s'] / 1e6:.0f} MB/s", "",
             "| hosts | fan-out | origin bytes | x model | time to serving | verified |", "|---|---|---|---|---|---|"]
    for r in out["runs"]:
        lines.append(f"| {r['hosts']} | {'on' if r['fanout'] else 'off'} | {r['origin_bytes'] / 1e9:.2f} GB | "
                     f"{r['origin_bytes'] / mb:.2f} | {r['time_to_serving_s']:.0f} s | {r['verified']}/{r['hosts']} |")
    n = out.get("noop")
    if n:
        lines += ["", f"no-op on the same {n['hosts']} full hosts (medians of 3; simulated GPU tools "
                  f"{n['gpu_tools_cpu_per_host_s']:.3f} s per host, measured apart):", "",
                  "| code | wall | controller CPU | host CPU per host | without GPU tools | changed |", "|---|---|---|---|---|---|"]
        for label in ("main", "branch"):
            r = n[label]
            lines.append(f"| {label} | {r['wall_s']:.2f} s | {r['controller_cpu_s']:.2f} s | {r['host_cpu_per_host_s']:.3f} s | "
                         f"{r['host_cpu_without_gpu_tools_s']:.3f} s | {r['changed']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
