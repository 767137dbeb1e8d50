"""A light scale testbed: up to 100+ test hosts on a small machine, for the controller-scale benchmark only.

    NEMOFLEET_TESTBED_NAME=nf-scale NEMOFLEET_TESTBED_DIR=.testbed-scale python -m nemofleet_testbed.scale up 100
    ... python -m nemofleet_testbed.scale converge     # first converge of every light host
    ... pyinfra -y inventories/testbed.py deploys/nemotron.py      # the real deploy, a no-op now
    ... python -m nemofleet_testbed.scale down

A full test host (nemofleet_testbed) runs its own dockerd and containerd (about 130 MB and 1% of a
core each, idle); 100 of them do not fit 2 cores. A light host is the same host image (Debian
bookworm, systemd as PID 1, sshd, cron, journald, the simulated nvidia-smi / nvidia-ctk / toolkit
hook of the 1x H200 bench profile) with one difference: **no Docker engine of its own**. Its
docker.service only links /run/docker.sock to the socket of one shared engine (a full test host
of its own, `<prefix>engine`, with the same simulated GPU), so the real `docker` CLI on every light
host talks to that one dockerd. What that means, honestly:

- its containers (the vLLM stand-in, the weights download, the GPU probe) run in the shared
  engine; `docker info`, `docker images` show the engine, and the vLLM image is loaded into the
  engine once (the deploy finds it present: it uploads no archive);
- the light hosts and the engine share one network namespace (the engine's): each host's sshd
  listens on its own port (published on 127.0.0.1 like a full host's), and its instance on its
  own port, so nothing collides and `curl 127.0.0.1:PORT` from a host reaches its own instance
  (and, unlike real hosts, another's);
- so that names do not collide in one engine, each host's data (state.json, read by
  inventories/testbed.py like the full testbed's) gives it its own `instance_prefix`
  (`s001-nemotron-`), `port_base`, `models_root` (`/srv/scale-weights/s001`, a directory mounted
  at the same path in the host and the engine, so bind mounts mean the same files) and frontend
  network names (`s001-open-webui`, `s001-dify`): ordinary settings, nothing in the product changes;
- /etc/docker/daemon.json on a light host is the host's own file, merged and validated by the
  deploy as anywhere, but the shared engine does not read it (`systemctl reload docker` is a no-op
  there); the NVML daemon-reload trap is not simulated (the light host's systemd does not manage
  the engine's containers; the bench profile is on the cgroupfs driver, where it does not apply);
- `health_schedule` is daily (00:00) on light hosts so that 100 hosts' minutely health checks do
  not compete for the 2 cores under measurement; haproxy (unused with one instance) is masked.
- The engine has one GPU probe container name (`nemofleet-gpu-probe`) and one weights download
  container name per repo and commit, where a real fleet has one engine per host: so
  `converge()` converges the first light host alone (it downloads the weights through the
  mirror), copies its complete model directory to the others' models_root (as a peer copy would;
  each host's deploy checks it offline as usual), converges the rest together, runs the GPU probe
  host by host (`--parallel 1`) on those whose probe collided, then the main job again on those.

It serves nothing but the benchmark (bench/scale.py, bench/run.py): the e2e tests and `make demo`
use full hosts. A no-op run on a light host sends the same 2 remote commands as on a full host.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nemofleet_testbed as tb

ENGINE = f"{tb.PREFIX}engine"
SOCK_DIR = "/var/lib/nemofleet-engine"  # holds the engine's socket, in the engine and every light host
WEIGHTS = "/srv/scale-weights"  # models_root parent: the same path in the engine and the hosts
SSHD_BASE = 2200  # light host i's sshd listens on SSHD_BASE + i in the shared network namespace
INSTANCE_BASE = 20000  # light host i's instance port
MAX_HOSTS = int(os.environ.get("NEMOFLEET_SCALE_MAX", "100"))
PROFILE = {
    "group": "gpu_h200", "driver": "580.159.04", "cuda": "13.0", "toolkit": "1.18.0",
    "gpus": [{"name": "NVIDIA H200", "memory_mib": 143771, "cc": "9.0", "bus_id": "00000000:00:06.0",
              "uuid": "GPU-ea950d4d-c55e-4fad-740e-b8bae40ede3a", "mig": "Disabled", "persistence": "Enabled",
              "power_limit": 700, "index": 0}]}
LIGHT_DOCKER_UNIT = """[Unit]
Description=Docker of a light scale test host: the shared scale engine's socket (nemofleet_testbed.scale)

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/ln -sfn {sock_dir}/docker.sock /run/docker.sock
ExecReload=/bin/true

[Install]
WantedBy=multi-user.target
""".format(sock_dir=SOCK_DIR)
# what the engine's dockerd gets besides a full host's: a socket the light hosts reach, and
# address pools for 2 frontend networks per light host (Docker's default pools hold 31)
ENGINE_OPTS = f'DOCKER_OPTS="-H unix://{SOCK_DIR}/docker.sock"\n'
ENGINE_DAEMON_JSON = {
    "default-address-pools": [{"base": "10.224.0.0/12", "size": 24}],
    "log-driver": "json-file", "log-opts": {"max-file": "3", "max-size": "100m"},
    "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
}


def name(i: int) -> str:
    return f"s{i:03d}"


def port_base() -> int:
    return int(os.environ.get("NEMOFLEET_TESTBED_PORT_BASE", "23701"))


def host_data(host: str, i: int) -> dict:
    """The settings that keep light hosts apart in one engine (see the module docstring)."""
    return {"instance_prefix": f"{host}-nemotron-", "port_base": INSTANCE_BASE + i,
            "models_root": f"{WEIGHTS}/{host}", "health_schedule": "0 0 * * *",
            "frontends": [{"name": "open-webui", "network": f"{host}-open-webui", "alias": "nemotron", "create": True},
                          {"name": "dify", "network": f"{host}-dify", "alias": "nemotron", "create": True}]}


def _tree(files: dict[str, str], links: dict[str, str]) -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="nf-scale-")
    root = Path(tmp.name)
    for rel, text in files.items():
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(0o600 if "authorized_keys" in rel else 0o644)
    for rel, target in links.items():
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
    return tmp


def _copy_in(container: str, files: dict[str, str], links: dict[str, str] | None = None) -> None:
    with _tree(files, links or {}) as tmp:
        tb.docker("cp", f"{tmp}/.", f"{container}:/")


def _labels() -> list[str]:
    return ["--label", tb.LABEL, "--label", f"{tb.OWNER_LABEL}={tb.owner()}", "--label", f"{tb.DIR_LABEL}={tb.testbed_dir()}"]


def ensure_engine(state: dict) -> None:
    if tb.existing(ENGINE) is not None:
        tb.docker("start", ENGINE, check=False)
        return
    d = tb.testbed_dir()
    (d / "engine").mkdir(parents=True, exist_ok=True)
    (d / "weights").mkdir(parents=True, exist_ok=True)
    vol = f"{ENGINE}-docker"
    tb.docker("volume", "create", "--label", tb.LABEL, vol)
    lo, hi = port_base(), port_base() + MAX_HOSTS - 1
    tb.log(f"starting the shared scale engine {ENGINE} (ports 127.0.0.1:{lo}-{hi} for {MAX_HOSTS} light hosts)")
    tb.docker("create", "--name", ENGINE, "--hostname", "scale-engine", *_labels(), *tb.RUN_FLAGS,
              "-v", f"{vol}:/var/lib/docker", "-v", f"{d / 'engine'}:{SOCK_DIR}", "-v", f"{d / 'weights'}:{WEIGHTS}",
              "--network", tb.NETWORK, "-p", f"127.0.0.1:{lo}-{hi}:{SSHD_BASE + 1}-{SSHD_BASE + MAX_HOSTS}",
              state["host_image"])
    _copy_in(ENGINE, {"/etc/nemofleet-sim/profile.json": json.dumps({k: v for k, v in PROFILE.items() if k != "group"}),
                      "/etc/default/docker": ENGINE_OPTS,
                      "/etc/docker/daemon.json": json.dumps(ENGINE_DAEMON_JSON, indent=4) + "\n"},
             {"/etc/systemd/system/haproxy.service": "/dev/null"})
    tb.docker("start", ENGINE)


def wait_engine(state: dict, timeout: float = 180) -> None:
    """The engine's dockerd answers on the shared socket; the vLLM image is loaded into it once."""
    deadline = time.time() + timeout
    while tb.docker("exec", ENGINE, "docker", "-H", f"unix://{SOCK_DIR}/docker.sock", "info", check=False).returncode:
        if time.time() > deadline:
            raise RuntimeError(f"the scale engine {ENGINE} did not start dockerd in {timeout:.0f}s")
        time.sleep(1)
    image = tb.DEFAULT_IMAGE
    if tb.docker("exec", ENGINE, "docker", "image", "inspect", image, check=False).returncode:
        tb.log(f"loading {image} into the shared engine")
        with open(state["archives"][image], "rb") as f:
            subprocess.run(["docker", "exec", "-i", ENGINE, "docker", "load", "-q"], stdin=f, check=True,
                           capture_output=True)


def ensure_light_host(host: str, i: int, state: dict) -> None:
    c = tb.container(host)
    labels = tb.existing(c)
    if labels is not None and labels.get(tb.OWNER_LABEL) == tb.owner():
        tb.docker("start", c, check=False)
        return
    if labels is not None:
        if labels.get("nemofleet.testbed") != "1":
            raise RuntimeError(f"a container named {c} exists and is not a nemofleet test host; remove it or set "
                               "NEMOFLEET_TESTBED_NAME")
        tb.docker("rm", "-f", c, check=False)
    port = port_base() + i - 1
    tb.forget_host_key(port)
    weights = tb.testbed_dir() / "weights" / host
    weights.mkdir(parents=True, exist_ok=True)
    tb.docker("create", "--name", c, *_labels(), *tb.RUN_FLAGS, "--network", f"container:{ENGINE}",
              "-v", f"{tb.testbed_dir() / 'engine'}:{SOCK_DIR}", "-v", f"{weights}:{WEIGHTS}/{host}",
              state["host_image"])
    pub = Path(str(tb.ensure_key()) + ".pub").read_text()
    _copy_in(c, {"/etc/nemofleet-sim/profile.json": json.dumps({k: v for k, v in PROFILE.items() if k != "group"}),
                 "/root/.ssh/authorized_keys": pub,
                 "/etc/ssh/sshd_config.d/nemofleet-scale.conf": f"Port {SSHD_BASE + i}\n",
                 "/etc/systemd/system/docker.service": LIGHT_DOCKER_UNIT},
             {"/etc/systemd/system/containerd.service": "/dev/null", "/etc/systemd/system/docker.socket": "/dev/null",
              "/etc/systemd/system/haproxy.service": "/dev/null"})
    tb.docker("start", c)


def up(n: int) -> dict:
    if n > MAX_HOSTS:
        raise SystemExit(f"the scale engine publishes ports for {MAX_HOSTS} hosts; set NEMOFLEET_SCALE_MAX")
    tb.ensure_secrets()
    tb.raise_inotify_limit(8192)
    state = tb.read_state()
    state = tb.build(state, {})
    tb.ensure_key()
    tb.ensure_network()
    tb.start_mirror(state)
    ensure_engine(state)
    wait_engine(state)
    hosts = state.get("hosts", {})
    t0 = time.time()
    for i in range(1, n + 1):
        h = name(i)
        ensure_light_host(h, i, state)
        hosts[h] = {"port": port_base() + i - 1, "group": PROFILE["group"], "gpus": 1, "data": host_data(h, i),
                    "light": True}
    state.update(hosts=hosts, profile="scale", key=str(tb.ensure_key()), mirror_url=f"http://{tb.MIRROR_ALIAS}:{tb.MIRROR_PORT}",
                 scale_engine=ENGINE)
    tb.write_state(state)
    for i in range(1, n + 1):
        tb.wait_ssh(name(i), port_base() + i - 1, timeout=max(120, 3 * n))
    tb.log(f"{n} light host(s) up in {time.time() - t0:.0f}s")
    return state


PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
ROOT = Path(__file__).resolve().parents[3]  # the repository (testbed/src/nemofleet_testbed/scale.py)


def _pyinfra(hosts: list[str], deploy: str = "deploys/nemotron.py", extra: tuple = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEMOFLEET_TESTBED_HOSTS=",".join(hosts), PYINFRA_PROGRESS="off")
    return subprocess.run([PYINFRA, "-y", *extra, "inventories/testbed.py", deploy], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def _unconverged(hosts: list[str]) -> list[str]:
    """Hosts without a release record (written last by a converge that got through serving)."""
    return [h for h in hosts if tb.docker("exec", tb.container(h), "test", "-s", "/var/lib/nemofleet/release",
                                          check=False).returncode]


def _seed_weights(source: str, hosts: list[str]) -> None:
    """Copy `source`'s downloaded model directory (complete, with its marker) to each host's
    models_root, as a peer copy would: the engine has one download container name per repo and
    commit, so light hosts cannot download in parallel. Each host's deploy still checks the copy."""
    src = tb.testbed_dir() / "weights" / source
    for h in hosts:
        dst = tb.testbed_dir() / "weights" / h
        for d in src.iterdir():
            if not (dst / d.name).exists():
                subprocess.run(["cp", "-a", str(d), str(dst / d.name)], check=True)


def converge(hosts: list[str] | None = None) -> None:
    """First converge of light hosts by the real deploy: the first host alone (it downloads the
    weights from the mirror), its weights copied to the others (_seed_weights), then the others
    together; the GPU probes that collided in the one engine run again host by host
    (`--parallel 1`), then the main job again on those hosts."""
    hosts = hosts or [h for h, v in tb.read_state().get("hosts", {}).items() if v.get("light")]
    t0 = time.time()
    first, rest = hosts[:1], hosts[1:]
    for part in (first, rest):
        if not part:
            continue
        if part is rest:
            _seed_weights(first[0], rest)
        r = _pyinfra(part)
        bad = _unconverged(part)
        for _ in range(3):
            if not bad:
                break
            tb.log(f"{len(bad)} of {len(part)} host(s) to probe one at a time (one probe container name per engine)")
            _pyinfra(bad, "deploys/gpu_probe.py", ("--parallel", "1"))
            r = _pyinfra(bad)
            bad = _unconverged(bad)
        if bad:
            raise RuntimeError(f"first converge failed on {', '.join(bad)}:\n" + (r.stdout + r.stderr)[-4000:])
        tb.log(f"converged {len(first) + (len(rest) if part is rest else 0)}/{len(hosts)} light host(s) "
               f"({time.time() - t0:.0f}s)")


def down() -> None:
    state = tb.read_state()
    for h, v in list(state.get("hosts", {}).items()):
        tb.docker("rm", "-f", tb.container(h), check=False)
        tb.forget_host_key(v["port"])
    tb.docker("rm", "-f", "-v", ENGINE, tb.MIRROR, check=False)
    tb.docker("volume", "rm", "-f", f"{ENGINE}-docker", check=False)
    tb.docker("network", "rm", tb.NETWORK, check=False)
    # the hosts' weights were written by the engine's containers (root); nothing else is in there
    subprocess.run(["rm", "-rf", str(tb.testbed_dir() / "weights"), str(tb.testbed_dir() / "engine")], check=False)
    state.pop("hosts", None)
    tb.write_state(state)
    tb.log("scale testbed down")


def main(argv: list[str]) -> int:
    if tb.PREFIX == "nf-tb-":
        print("set NEMOFLEET_TESTBED_NAME (e.g. nf-scale) and NEMOFLEET_TESTBED_DIR: the light scale testbed "
              "keeps apart from the demo testbed", file=sys.stderr)
        return 2
    if not argv or argv[0] not in ("up", "converge", "down"):
        print(__doc__.split("\n\n")[1])
        return 2
    if argv[0] == "up":
        up(int(argv[1]) if len(argv) > 1 else 5)
    elif argv[0] == "converge":
        converge()
    else:
        down()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
