"""Benchmark: controller scale (5 to 100 hosts) and nemofleet vs an equivalent Ansible playbook.

    make bench            # BENCH_SIZES=20 BENCH_REPS=3 by default

First bench/scale.py (its own light scale testbed, nf-scale: no-op wall time, controller CPU and
remote commands per host for BENCH_SCALE_SIZES=5,20,50,100 hosts; torn down after, BENCH_SCALE=0
skips it), then the Ansible comparison below on full test hosts. `BENCH_SIZES=1,5,10,20
BENCH_ANSIBLE_FIRST=5,20` gives the longer comparison (docs/measurements.md, 1, 5 and 10 hosts).

For each fleet size N (fresh hosts of a testbed of its own, 1x H200 profile each):
  (a) first converge: nemofleet on fresh hosts; Ansible on re-created fresh hosts
      (BENCH_ANSIBLE_FIRST sizes), each then checked by the *other* tool for zero changes;
  (b) no-op re-run, alternating nemofleet / Ansible, BENCH_REPS times;
  (c) preflight only, alternating.
Wall time medians, the ratio, and remote commands (SSH exec channels) per host, counted
exactly from each tool's own verbose output. Results: bench/results/bench.json and a table.
Ansible: ansible-core in bench/.venv-ansible, pipelining, gather_facts off, forks = N.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import PYINFRA, ROOT

benchlib.use_testbed("nf-bench", ".testbed-bench", 22401)

import nemofleet_testbed as testbed  # noqa: E402
from nemofleet import settings  # noqa: E402
from nemofleet.facts.weights import check_command  # noqa: E402
from nemofleet.operations.weights import download_script  # noqa: E402
ANSIBLE_VENV = ROOT / "bench" / ".venv-ansible"
ANSIBLE = str(ANSIBLE_VENV / "bin" / "ansible-playbook")
MAX = 20
REPO_DIR = "/srv/nemofleet/models/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def ensure_ansible():
    if not Path(ANSIBLE).exists():
        log("installing ansible-core 2.19.14 into bench/.venv-ansible")
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core==2.19.14"], check=True)


def profile_file() -> Path:
    hosts = {}
    for i in range(1, MAX + 1):
        hosts[f"bench-{i:02d}"] = {
            "group": "gpu_h200", "driver": "580.159.04", "cuda": "13.0", "toolkit": "1.18.0",
            "gpus": [{"name": "NVIDIA H200", "memory_mib": 143771, "cc": "9.0", "bus_id": "00000000:00:06.0",
                      "uuid": "GPU-ea950d4d-c55e-4fad-740e-b8bae40ede3a", "mig": "Disabled",
                      "persistence": "Enabled", "power_limit": 700}]}
    p = testbed.testbed_dir() / "bench-profile.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    import yaml
    p.write_text(yaml.safe_dump({"hosts": hosts}))
    return p


def fresh(n: int):
    state = testbed.read_state()
    for h in list(state.get("hosts", {})):
        testbed.destroy_host(h)
    (testbed.testbed_dir() / "known_hosts").unlink(missing_ok=True)
    state.pop("hosts", None)
    testbed.write_state(state)
    hosts = [f"bench-{i:02d}" for i in range(1, n + 1)]
    t0 = time.time()
    testbed.up(str(profile_file()), only=hosts)
    log(f"{n} fresh host(s) up in {time.time() - t0:.0f}s")
    return hosts


def count_execs_pyinfra(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^\[([^\]]+)\] >>> ", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def nemofleet(hosts, deploy="deploys/nemotron.py", verbose=False):
    """One run; wall time is measured without -vv (printing every command costs time), the
    exec count comes from a -vv run (`verbose=True`)."""
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts))
    t0 = time.monotonic()
    p = subprocess.run([PYINFRA, "-y", *(["-vv"] if verbose else []), "inventories/testbed.py", deploy], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    out = p.stdout + p.stderr
    grand = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    changed = 0 if not grand or grand.group(2) == "-" else int(grand.group(2))
    execs = count_execs_pyinfra(out)
    return {"wall_s": round(wall, 2), "rc": p.returncode, "changed": changed,
            "execs_per_host": round(statistics.mean(execs.values()), 1) if execs else 0}


HOST_FILES = r"""
import glob, json
paths = sorted(glob.glob("/etc/systemd/system/nemofleet-vllm-*.service")) + [
    "/etc/docker/daemon.json", "/etc/nemofleet/vllm.env", "/etc/nemofleet/api-auth.header", "/etc/nemofleet/hf.env",
    "/var/lib/nemofleet/release", "/usr/local/bin/nemofleet-health", "/etc/nemofleet/health.json",
    "/etc/cron.d/nemofleet-health"]
print(json.dumps({p: open(p).read() for p in paths}))
"""


def host_files(host: str) -> dict[str, str]:
    """The files nemofleet rendered on this host (they name the host, so they differ per host)."""
    out = subprocess.run(["docker", "exec", testbed.container(host), "python3", "-c", HOST_FILES], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def ansible_inventory(hosts) -> Path:
    """Inventory + per-host vars: the end state nemofleet rendered for each host, so both tools
    converge the same hosts to the same bytes."""
    state = testbed.read_state()
    image = settings.DEFAULT_IMAGE  # the one pin (settings.py)
    MODEL_DIR = f"{REPO_DIR}@{state['model_revision'][:12]}"  # one directory per repo and commit
    script = download_script("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4", state["model_revision"], MODEL_DIR,
                             image, state["mirror_url"], "/etc/nemofleet/hf.env", [], [], 0)
    script += "\n" + check_command(MODEL_DIR, state["model_revision"], "write")
    common = {"ansible_user": "root", "ansible_ssh_private_key_file": state["key"], "ansible_host": "127.0.0.1",
              "image": image, "image_archive": state["archives"][image], "model_dir": MODEL_DIR,
              "download_script": script, "networks": ["open-webui_default", "dify_default"]}
    per_host = {}
    for h in hosts:
        f = host_files(h)
        per_host[h] = {
            "ansible_port": state["hosts"][h]["port"],
            "daemon_keys": json.loads(f["/etc/docker/daemon.json"]),
            "secret_files": [{"path": p, "content": f[p]} for p in
                             ("/etc/nemofleet/vllm.env", "/etc/nemofleet/api-auth.header", "/etc/nemofleet/hf.env")],
            "units": [{"name": os.path.basename(p), "content": c} for p, c in f.items() if p.endswith(".service")],
            "release_record": f["/var/lib/nemofleet/release"],
            "health_files": [{"path": "/usr/local/bin/nemofleet-health", "content": f["/usr/local/bin/nemofleet-health"], "mode": "0755"},
                             {"path": "/etc/nemofleet/health.json", "content": f["/etc/nemofleet/health.json"], "mode": "0644"},
                             {"path": "/etc/cron.d/nemofleet-health", "content": f["/etc/cron.d/nemofleet-health"], "mode": "0644"}],
        }
    inv = {"all": {"vars": common, "hosts": per_host}}
    # YAML with every string tagged !unsafe: file contents (a health script's `${#x}`) are data,
    # never Jinja2 templates for Ansible to render
    import yaml

    class Unsafe(str):
        pass

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(Unsafe, lambda d, v: d.represent_scalar("!unsafe", str(v), style="|" if "\n" in v else None))

    def mark(v):
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return Unsafe(v) if isinstance(v, str) and any(c in v for c in "{%#") else v

    p = testbed.testbed_dir() / "ansible-inventory.yml"
    p.write_text(yaml.dump(mark(inv), Dumper=Dumper, sort_keys=False))
    return p


def ansible(hosts, inv: Path, tags: str | None = None, verbose=False):
    cmd = [ANSIBLE, "-i", str(inv), "-f", str(len(hosts)), *(["-vvv"] if verbose else []),
           str(ROOT / "bench" / "ansible" / "site.yml")]
    if tags:
        cmd += ["--tags", tags]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "bench" / "ansible" / "ansible.cfg"))
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    out = p.stdout + p.stderr
    ports = {str(testbed.read_state()["hosts"][h]["port"]): h for h in hosts}
    execs: dict[str, int] = {}
    for line in out.splitlines():
        if "SSH: EXEC" in line:
            m = re.search(r"-o Port=(\d+)", line)
            if m and m.group(1) in ports:
                execs[ports[m.group(1)]] = execs.get(ports[m.group(1)], 0) + 1
    changed = sum(int(m) for m in re.findall(r"changed=(\d+)", out.split("PLAY RECAP")[-1])) if "PLAY RECAP" in out else -1
    changed_tasks, task = set(), None
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line[6:line.index("]")]
        elif line.startswith("changed: [") and task:
            changed_tasks.add(task)
    failed = sum(int(m) for m in re.findall(r"failed=(\d+)", out.split("PLAY RECAP")[-1])) if "PLAY RECAP" in out else -1
    if p.returncode:
        log("ansible failed:\n" + out[-3000:])
    return {"wall_s": round(wall, 2), "rc": p.returncode, "changed": changed, "failed": failed,
            "changed_tasks": sorted(changed_tasks),
            "execs_per_host": round(statistics.mean(execs.values()), 1) if execs else 0}


def med(runs):
    return round(statistics.median(r["wall_s"] for r in runs), 2)


def main() -> int:
    sizes = [int(x) for x in os.environ.get("BENCH_SIZES", "20").split(",") if x]
    reps = int(os.environ.get("BENCH_REPS", "3"))
    ansible_first = {int(x) for x in os.environ.get("BENCH_ANSIBLE_FIRST", "").split(",") if x}
    scale_table = ""
    if os.environ.get("BENCH_SCALE", "1") == "1":
        # a process of its own: its testbed (names, ports, directory) is not this one's
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEMOFLEET_TESTBED_")}
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           text=True)
        if p.returncode:
            log(f"bench/scale.py failed (rc={p.returncode})")
            return p.returncode
        scale_table = p.stdout.strip()
        print(scale_table, flush=True)
    ensure_ansible()
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
               "ansible": "ansible-core 2.19.14, pipelining, ControlPersist, gather_facts off, forks=N",
               "sizes": {}}
    previous = ROOT / "bench" / "results" / "bench.json"
    if os.environ.get("BENCH_MERGE") == "1" and previous.exists():
        results["sizes"] = json.loads(previous.read_text())["sizes"]  # add sizes to an earlier run
    for n in sizes:
        hosts = fresh(n)
        r = {"first_converge": {"nemofleet": nemofleet(hosts, verbose=True)}}
        time.sleep(3)
        inv = ansible_inventory(hosts)
        noop = {"nemofleet": [], "ansible": []}
        pre = {"nemofleet": [], "ansible": []}
        for _ in range(reps):
            noop["nemofleet"].append(nemofleet(hosts))
            noop["ansible"].append(ansible(hosts, inv))
        for _ in range(reps):
            pre["nemofleet"].append(nemofleet(hosts, "deploys/preflight.py"))
            pre["ansible"].append(ansible(hosts, inv, tags="preflight"))
        execs = {"nemofleet": {"noop": nemofleet(hosts, verbose=True)["execs_per_host"],
                               "preflight": nemofleet(hosts, "deploys/preflight.py", verbose=True)["execs_per_host"]},
                 "ansible": {"noop": ansible(hosts, inv, verbose=True)["execs_per_host"],
                             "preflight": ansible(hosts, inv, tags="preflight", verbose=True)["execs_per_host"]}}
        r["execs_per_host"] = execs
        r["noop"] = {k: {"median_wall_s": med(v), "runs": v} for k, v in noop.items()}
        r["preflight"] = {k: {"median_wall_s": med(v), "runs": v} for k, v in pre.items()}
        r["noop"]["ratio_ansible_over_nemofleet"] = round(med(noop["ansible"]) / med(noop["nemofleet"]), 1)
        r["preflight"]["ratio_ansible_over_nemofleet"] = round(med(pre["ansible"]) / med(pre["nemofleet"]), 1)
        if n in ansible_first:
            for h in hosts:
                testbed.destroy_host(h)
            (testbed.testbed_dir() / "known_hosts").unlink(missing_ok=True)
            hosts = fresh(n)
            r["first_converge"]["ansible"] = ansible(hosts, inv, verbose=True)
            time.sleep(3)
            r["first_converge"]["nemofleet_noop_after_ansible"] = nemofleet(hosts, verbose=True)
        results["sizes"][str(n)] = r
        save(results)
        log(json.dumps({n: {"noop": {k: v["median_wall_s"] if isinstance(v, dict) else v for k, v in r["noop"].items()}}}))
    state = testbed.read_state()
    if os.environ.get("BENCH_KEEP") != "1":
        for h in list(state.get("hosts", {})):
            testbed.destroy_host(h)
    save(results)
    if scale_table:
        print(scale_table + "\n")
    print(table(results))
    return 0


def save(results) -> None:
    benchlib.save_json("bench.json", results).with_name("bench.md").write_text(table(results) + "\n")


def table(results) -> str:
    lines = [f"nemofleet vs Ansible, {results['date']}, {results['machine']} ({results['ansible']})", "",
             "| hosts | first converge nemofleet | first converge Ansible | no-op nemofleet | no-op Ansible | ratio | "
             "preflight nemofleet | preflight Ansible | execs/host no-op (nemofleet / Ansible) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, r in results["sizes"].items():
        fa = r["first_converge"].get("ansible")
        lines.append(
            f"| {n} | {r['first_converge']['nemofleet']['wall_s']} s | {str(fa['wall_s']) + ' s' if fa else '-'} | "
            f"{r['noop']['nemofleet']['median_wall_s']} s | {r['noop']['ansible']['median_wall_s']} s | "
            f"{r['noop']['ratio_ansible_over_nemofleet']}x | {r['preflight']['nemofleet']['median_wall_s']} s | "
            f"{r['preflight']['ansible']['median_wall_s']} s | {r['execs_per_host']['nemofleet']['noop']} / "
            f"{r['execs_per_host']['ansible']['noop']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
