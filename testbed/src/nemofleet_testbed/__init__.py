"""The local testbed: simulated GPU hosts as systemd containers reachable over real SSH.

Each test host is a container of the host image running systemd as PID 1, its own dockerd
(a volume on /var/lib/docker), sshd published only on 127.0.0.1:<port>, cron, and the
simulated GPU tools of its hardware profile. A Hugging Face mirror container serves a tiny
generated model to the hosts over the testbed's own Docker network.

State (ports, generated SSH key, mirror URL, model revision) is kept in .testbed/, which
inventories/testbed.py reads. Nothing in .testbed/ is ever committed.

This package (nemofleet-testbed, testbed/ in the nemofleet repository) is a test rig, not part of
the nemofleet wheel: `make venv` installs it next to nemofleet, and `nemofleet testbed` runs it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from nemofleet import settings

from . import aptrepo, images, tinymodel

PREFIX = os.environ.get("NEMOFLEET_TESTBED_NAME", "nf-tb") + "-"
NETWORK = f"{PREFIX}net"
MIRROR = f"{PREFIX}hf-mirror"
MIRROR_ALIAS = "hf-mirror"
MIRROR_PORT = 8090
PKG_MIRROR = f"{PREFIX}pkg-mirror"
PKG_MIRROR_ALIAS = "pkg-mirror"
PKG_MIRROR_PORT = 8091
LABEL = "nemofleet.testbed=1"
# which testbed a test host belongs to: the fingerprint of the SSH key it authorises, and the
# testbed directory (for the sentence). Another checkout's host of the same name refuses our key.
OWNER_LABEL = "nemofleet.testbed.owner"
DIR_LABEL = "nemofleet.testbed.dir"
DEFAULT_IMAGE = settings.DEFAULT_IMAGE
MODEL_REPO = "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
# Extra releases of the stand-in image, for rollout tests: a newer tag, and one told to fail.
RELEASES = {
    DEFAULT_IMAGE: {},
    f"{DEFAULT_IMAGE}-nf2": {"STANDIN_RELEASE": "nf2"},
    f"{DEFAULT_IMAGE}-broken": {"STANDIN_FAIL": "start", "STANDIN_RELEASE": "broken"},
    # for the canary gate (issue 38): healthy by every health check, but worse at serving
    f"{DEFAULT_IMAGE}-slow": {"STANDIN_LATENCY_SECONDS": "1.0", "STANDIN_RELEASE": "slow"},  # 5x the 0.2 s
    f"{DEFAULT_IMAGE}-flaky": {"STANDIN_FAIL_EVERY": "20", "STANDIN_RELEASE": "flaky"},  # every 20th: 500
}
RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3",
    # `systemctl reboot` ends the container's systemd; Docker starts it again: a real reboot
    # (fresh /run, same disks), which nemofleet's driver install relies on
    "--restart", "unless-stopped",
    # a host's /dev/shm (vLLM units run with --ipc=host, which makes --shm-size moot): Docker's
    # 64 MiB default stops the real vLLM engine ("Insufficient space in /dev/shm")
    "--shm-size", "2g",
]


def testbed_dir() -> Path:
    return Path(os.environ.get("NEMOFLEET_TESTBED_DIR") or Path.cwd() / ".testbed").resolve()


def log(msg: str) -> None:
    images.log(msg)


def docker(*args, check=True, capture=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=check, capture_output=capture, text=True, **kw)


def load_profiles(name: str = "default") -> dict:
    import yaml  # the profiles are YAML (pyyaml, this package's dependency); read only here

    path = Path(name) if name.endswith(".yaml") else Path(__file__).parent / "profiles" / f"{name}.yaml"
    hosts = yaml.safe_load(path.read_text())["hosts"]
    out = {}
    for host, spec in hosts.items():
        gpus = []
        repeat = spec.get("gpus_repeat", 1)
        for n in range(repeat):
            for g in spec["gpus"]:
                g = {k: (v.format(N=n) if isinstance(v, str) else v) for k, v in g.items()}
                g["index"] = len(gpus)
                gpus.append(g)
        out[host] = {**{k: v for k, v in spec.items() if k not in ("gpus", "gpus_repeat")}, "gpus": gpus}
    return out


def state_path() -> Path:
    return testbed_dir() / "state.json"


def read_state() -> dict:
    try:
        return json.loads(state_path().read_text())
    except (OSError, ValueError):
        return {}


def write_state(state: dict) -> None:
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(state, indent=2, sort_keys=True))


def parse_outer(info: str, fs_type: str = "") -> dict:
    """The outer host from `docker info -f '{{.ServerVersion}}|{{.CgroupDriver}}|{{.CgroupVersion}}'`
    (an engine older than 20.10 prints no cgroup version: then the type of /sys/fs/cgroup says it)."""
    version, _, rest = info.strip().partition("|")
    driver, _, cgroup = rest.partition("|")
    if cgroup.strip() not in ("1", "2"):
        cgroup = "2" if fs_type.strip() == "cgroup2fs" else "1"
    return {"cgroup": f"v{cgroup.strip()}", "engine": version or "unknown", "driver": driver or "unknown"}


def outer_host() -> dict:
    """What the machine that runs the testbed decides of its behaviour: its cgroup version (the test
    hosts share its cgroup tree, so their systemd, Docker and the simulated NVML trap run on it) and
    its Docker engine."""
    r = docker("info", "-f", "{{.ServerVersion}}|{{.CgroupDriver}}|{{.CgroupVersion}}", check=False)
    fs = subprocess.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout
    return parse_outer(r.stdout if r.returncode == 0 else "", fs)


def describe_outer(outer: dict | None = None) -> str:
    """One line: "cgroup v1, Docker 20.10.24+dfsg1 (cgroupfs driver)"."""
    o = outer or read_state().get("outer") or outer_host()
    return f"cgroup {o['cgroup']}, Docker {o['engine']} ({o['driver']} driver)"


def ensure_key() -> Path:
    key = testbed_dir() / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nemofleet-testbed", "-f", str(key)],
                       check=True)
    return key


def ensure_network() -> None:
    if docker("network", "inspect", NETWORK, check=False).returncode:
        docker("network", "create", "--label", LABEL, NETWORK)


def build(state: dict, profiles: dict | None = None) -> dict:
    """Images, archives and the mirror's model repo; cached by content."""
    t0 = time.time()
    host_tag = images.host_image()
    suites = {spec.get("suite", images.SUITE) for spec in (profiles or {}).values()}
    host_images = {suite: host_tag if suite == images.SUITE else images.host_image(suite) for suite in sorted(suites)}
    standin_tag = images.standin_image()
    archives = {}
    for ref, env in RELEASES.items():
        fname = ref.replace("/", "_").replace(":", "_") + ".tar"
        archives[ref] = str(images.save_as(standin_tag, ref, testbed_dir() / "images" / fname, env))
    repos = testbed_dir() / "hf" / "repos"
    revision = tinymodel.build(str(repos), MODEL_REPO)
    apt = aptrepo.build(testbed_dir() / "apt")
    base = f"http://{PKG_MIRROR_ALIAS}:{PKG_MIRROR_PORT}"
    state.update(apt_key_file=apt["key_file"], apt_repo_url=f"{base}/stable/deb/$(ARCH)",
                 apt_driver_repo_url=f"{base}/cuda/deb/$(ARCH)")
    state.update(host_image=host_tag, host_images={**state.get("host_images", {}), **host_images},
                 standin_image=standin_tag, archives=archives, model_repo=MODEL_REPO,
                 model_revision=revision, build_seconds=round(time.time() - t0, 1))
    return state


def _reuse_mirror(name: str, source: Path) -> bool:
    """Start an existing mirror container only when it serves this testbed's own directory; one
    left by another checkout (same name, other files and keys) is replaced."""
    r = docker("inspect", "-f", "{{range .Mounts}}{{.Source}} {{end}}", name, check=False)
    if r.returncode:
        return False
    if str(source) in r.stdout.split():
        docker("start", name, check=False)
        return True
    log(f"{name} serves another testbed's files ({r.stdout.strip()}); replacing it")
    docker("rm", "-f", name, check=False)
    return False


def start_mirror(state: dict) -> None:
    hf = testbed_dir() / "hf"
    (hf / "requests.log").touch()
    if _reuse_mirror(MIRROR, hf):
        return
    src = Path(__file__).parent / "hfmirror.py"
    docker("run", "-d", "--name", MIRROR, "--label", LABEL, "--network", NETWORK, "-p", f"127.0.0.1:{local_port(1)}:{MIRROR_PORT}",
           "--network-alias", MIRROR_ALIAS, "-v", f"{hf}:/srv/hf", "-v", f"{src}:/opt/hfmirror.py:ro",
           state["host_image"], "python3", "/opt/hfmirror.py", "--root", "/srv/hf/repos",
           "--port", str(MIRROR_PORT), "--log", "/srv/hf/requests.log")


def start_pkg_mirror(state: dict) -> None:
    """The simulated NVIDIA apt repository (signed, flat), as a package mirror would serve it."""
    if _reuse_mirror(PKG_MIRROR, testbed_dir() / "apt" / "repo"):
        return
    docker("run", "-d", "--name", PKG_MIRROR, "--label", LABEL, "--network", NETWORK,
           "-p", f"127.0.0.1:{local_port(2)}:{PKG_MIRROR_PORT}", "--network-alias", PKG_MIRROR_ALIAS, "-v", f"{testbed_dir() / 'apt' / 'repo'}:/srv/repo:ro",
           state["host_image"], "python3", "-m", "http.server", str(PKG_MIRROR_PORT), "--directory", "/srv/repo")


def local_port(n: int) -> int:
    """The controller's port of mirror `n` (1: the Hub, 2: packages): fixed, 25 + n above this
    testbed's port base (its hosts take the ports from the base up), so that a mirror stopped and
    started again by a test keeps the URL the group data names (an ephemeral port changes on every
    start: test_9_bundle's bundle create then found nothing on the port test_2 had left in the state)."""
    return int(os.environ.get("NEMOFLEET_TESTBED_PORT_BASE", "22201")) + 25 + n


def local_url(name: str, port: int) -> str | None:
    """The controller's URL of a mirror, published on 127.0.0.1 (for `nemofleet bundle create`):
    None for one started before it was published."""
    out = docker("port", name, f"{port}/tcp", check=False).stdout.split()
    return f"http://{out[0]}" if out and out[0].startswith("127.0.0.1:") else None


def start_mirrors() -> None:
    """Start the stopped Hub and package mirrors again; their published ports are new, so the
    state records them again."""
    docker("start", MIRROR, PKG_MIRROR, check=False)
    state = read_state()
    state.update(mirror_local_url=local_url(MIRROR, MIRROR_PORT), apt_local_url=local_url(PKG_MIRROR, PKG_MIRROR_PORT))
    write_state(state)


def stop_mirror() -> None:
    docker("stop", "-t", "1", MIRROR, check=False)


def container(host: str) -> str:
    return f"{PREFIX}{host}"


def forget_host_key(port: int) -> None:
    """A (re)created test host has a new SSH host key: drop the old one explicitly, here,
    because the testbed knows it made a new host (pyinfra itself rejects a changed key)."""
    known = testbed_dir() / "known_hosts"
    if known.exists():
        subprocess.run(["ssh-keygen", "-q", "-R", f"[127.0.0.1]:{port}", "-f", str(known)], capture_output=True)


def owner() -> str:
    """This testbed's identity: sha256 of its SSH public key (16 hex digits)."""
    pub = (Path(str(ensure_key()) + ".pub")).read_text().split()
    return hashlib.sha256(" ".join(pub[:2]).encode()).hexdigest()[:16]


def existing(name: str) -> dict | None:
    """The labels of the container `name` ({} when it has none), or None when there is none."""
    r = docker("inspect", "-f", "{{json .Config.Labels}}", name, check=False)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout.strip() or "null") or {}
    except ValueError:
        return {}


def authorized_keys(name: str) -> str | None:
    r = docker("exec", name, "cat", "/root/.ssh/authorized_keys", check=False)
    return r.stdout if r.returncode == 0 else None


def reuse_decision(name: str, labels: dict | None, mine: str, my_pub: str, authorized: str | None = None,
                   here: str = "") -> tuple[str, str | None]:
    """What `up` does with the container `name`: ("create"|"reuse"|"replace"|"refuse", sentence).

    A test host of this testbed (owner label = our key's fingerprint; or, made before the label
    existed, one that authorises our key) is reused. A test host of another checkout (labelled
    nemofleet.testbed=1, another or no owner) would refuse our SSH key, so it is replaced. Any
    other container of that name is not ours to remove: refuse, saying how to fix it."""
    if labels is None:
        return "create", None
    if labels.get(OWNER_LABEL) == mine:
        return "reuse", None
    key, value = LABEL.split("=")
    if labels.get(key) != value:
        return "refuse", (f"a container named {name} exists and is not a nemofleet test host; remove it "
                          f"(docker rm -f {name}) or choose another prefix with NEMOFLEET_TESTBED_NAME")
    if OWNER_LABEL not in labels and authorized is not None and " ".join(my_pub.split()[:2]) in authorized:
        return "reuse", None
    where = labels.get(DIR_LABEL) or "an older checkout"
    return "replace", (f"{name} is a test host of another testbed ({where}) that does not accept this "
                       f"testbed's SSH key ({here or 'this checkout'}); replacing it (set NEMOFLEET_TESTBED_NAME "
                       "to keep both)")


def ensure_host(host: str, spec: dict, port: int, state: dict) -> None:
    """Create, start or replace the container of `host` (see reuse_decision)."""
    name = container(host)
    labels = existing(name)
    pub = Path(str(ensure_key()) + ".pub").read_text()
    auth = authorized_keys(name) if labels is not None and OWNER_LABEL not in labels else None
    action, sentence = reuse_decision(name, labels, owner(), pub, auth, str(testbed_dir()))
    if action == "refuse":
        raise RuntimeError(sentence)
    if action == "reuse":
        docker("start", name, check=False)
        return
    if action == "replace":
        log(sentence)
        destroy_host(host)
    what = f"{len(spec['gpus'])}x {spec['gpus'][0]['name']}" if spec["gpus"] else "no GPU"
    log(f"starting {host} ({what}) on 127.0.0.1:{port}")
    create_host(host, spec, port, state)


def create_host(host: str, spec: dict, port: int, state: dict, forget_key: bool = True) -> None:
    name = container(host)
    if forget_key:
        forget_host_key(port)
    vol = f"{name}-docker"
    docker("volume", "create", "--label", LABEL, vol)
    docker("create", "--name", name, "--hostname", host, "--label", LABEL,
           "--label", f"{OWNER_LABEL}={owner()}", "--label", f"{DIR_LABEL}={testbed_dir()}", *RUN_FLAGS,
           "-v", f"{vol}:/var/lib/docker", "--network", NETWORK, "-p", f"127.0.0.1:{port}:22",
           state.get("host_images", {}).get(spec.get("suite", images.SUITE), state["host_image"]))
    tmp = testbed_dir() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    simdir = tmp / host / "nemofleet-sim"
    simdir.mkdir(parents=True, exist_ok=True)
    (simdir / "profile.json").write_text(json.dumps({k: v for k, v in spec.items() if k != "group"}, indent=2))
    docker("cp", str(simdir), f"{name}:/etc/")
    if spec.get("daemon_json"):
        # the host's Docker as its OS installs it (e.g. the systemd cgroup driver of Ubuntu 22.04+)
        dj = tmp / host / "docker"
        dj.mkdir(parents=True, exist_ok=True)
        (dj / "daemon.json").write_text(json.dumps(spec["daemon_json"], indent=2) + "\n")
        docker("cp", str(dj), f"{name}:/etc/")
    pub = tmp / "authorized_keys"
    shutil.copy(str(ensure_key()) + ".pub", pub)
    pub.chmod(0o600)
    docker("cp", str(pub), f"{name}:/root/.ssh/authorized_keys")
    docker("start", name)


def destroy_host(host: str) -> None:
    name = container(host)
    docker("rm", "-f", "-v", name, check=False)
    docker("volume", "rm", "-f", f"{name}-docker", check=False)


def wait_ssh(host: str, port: int, timeout: float = 120) -> None:
    key = ensure_key()
    deadline = time.time() + timeout
    while True:
        r = subprocess.run(["ssh", "-q", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                            "-o", "ConnectTimeout=3", "root@127.0.0.1",
                            "systemctl is-active docker >/dev/null && docker info >/dev/null 2>&1"],
                           capture_output=True)
        if r.returncode == 0:
            return
        if time.time() > deadline:
            raise RuntimeError(not_up_sentence(host, port, key, timeout))
        time.sleep(1)


def not_up_sentence(host: str, port: int, key: Path, timeout: float) -> str:
    """Why a test host is not reachable: a refused key says so (not "failed units")."""
    r = subprocess.run(["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                        "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=3", "root@127.0.0.1", "true"],
                       capture_output=True, text=True)
    if "Permission denied" in r.stderr:
        return (f"test host {host} on 127.0.0.1:{port} refuses this testbed's SSH key {key} (it was made by another "
                f"checkout or testbed): run `nemofleet testbed recreate {host}`, or `nemofleet testbed down` then up")
    logs = docker("exec", container(host), "systemctl", "--failed", "--no-legend", check=False).stdout
    return f"test host {host} did not come up with sshd and dockerd in {timeout:.0f}s; failed units: {logs}"


def ensure_secrets() -> None:
    """Per-testbed API key and HF token (0600, never committed; tests grep logs for them)."""
    import secrets

    for name, prefix in (("api-key", "sk-nf-"), ("hf-token", "hf_nf")):
        path = testbed_dir() / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(prefix + secrets.token_hex(16) + "\n")
            path.chmod(0o600)
    seed = testbed_dir() / "seed_ed25519"
    if not seed.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nemofleet-weights-seed",
                        "-f", str(seed)], check=True)
    # the key `nemofleet bundle create` signs with, and the allowed signers file that trusts it alone
    sign = testbed_dir() / "bundle_ed25519"
    if not sign.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nemofleet-testbed-bundle",
                        "-f", str(sign)], check=True)
    pub = (testbed_dir() / "bundle_ed25519.pub").read_text().split()
    (testbed_dir() / "allowed_signers").write_text(f'testbed@nemofleet namespaces="nemofleet-bundle" {pub[0]} {pub[1]}\n')


def raise_inotify_limit(want: int = 1024) -> None:
    """Each systemd test host takes inotify instances; the kernel default of 128 per user stops
    the 15th or so host from booting (sysinit waits forever). Raise it when we may."""
    path = Path("/proc/sys/fs/inotify/max_user_instances")
    try:
        if int(path.read_text()) < want:
            path.write_text(str(want))
    except (OSError, ValueError):
        log(f"could not raise fs.inotify.max_user_instances to {want}; large testbeds may not boot")


def up(profile: str = "default", only: list[str] | None = None, demo: bool = False) -> dict:
    """Build what is missing and start the hosts: those named in `only`; else the whole profile,
    optional hosts (e.g. bare-1) only if already up; with `demo`, also without the hosts only the
    tests use (`demo: false` in the profile: broken-1, which the demo's inventory leaves out)."""
    profiles = load_profiles(profile)
    ensure_secrets()
    raise_inotify_limit()
    state = read_state()
    running = state.get("hosts", {})
    wanted = {h: p for h, p in profiles.items()
              if (only and h in only)
              or (not only and (not p.get("optional") or h in running)
                  and not (demo and p.get("demo") is False and h not in running))}
    state = build(state, wanted)
    ensure_key()
    # an empty known_hosts before the first connection: pyinfra then adds each host's key
    # (accept-new) without first printing that it failed to load the file
    (testbed_dir() / "known_hosts").touch(exist_ok=True)
    ensure_network()
    start_mirror(state)
    start_pkg_mirror(state)
    base = int(os.environ.get("NEMOFLEET_TESTBED_PORT_BASE", "22201"))
    hosts = state.get("hosts", {})
    for i, (host, spec) in enumerate(profiles.items()):
        if host not in wanted:
            continue
        port = hosts.get(host, {}).get("port", base + i)
        ensure_host(host, spec, port, state)
        hosts[host] = {"port": port, "group": spec.get("group"), "gpus": len(spec["gpus"]), "data": spec.get("data") or {},
                       **({"serving_group": spec["serving_group"]} if spec.get("serving_group") else {})}
    state.update(hosts=hosts, profile=profile, key=str(ensure_key()), outer=outer_host(),
                 mirror_url=f"http://{MIRROR_ALIAS}:{MIRROR_PORT}", mirror_local_url=local_url(MIRROR, MIRROR_PORT),
                 apt_local_url=local_url(PKG_MIRROR, PKG_MIRROR_PORT))
    write_state(state)
    waiting = [host for host in hosts if (not only or host in only) and host in profiles]
    for host in waiting:  # they boot in parallel; allow for a large fleet on a small machine
        wait_ssh(host, hosts[host]["port"], timeout=max(120, 15 * len(waiting)))
    log(f"testbed up: {', '.join(hosts)} on {describe_outer(state['outer'])} (state in {state_path()})")
    return state


def recreate(host: str) -> dict:
    """Disaster drill: destroy the host and its volumes, bring it back bare (new SSH host key,
    which the controller's known_hosts does not know: `nemofleet rebuild` must handle it)."""
    state = read_state()
    spec = load_profiles(state.get("profile", "default"))[host]
    destroy_host(host)
    create_host(host, spec, state["hosts"][host]["port"], state, forget_key=False)
    wait_ssh(host, state["hosts"][host]["port"])
    return state


def remove(host: str) -> None:
    """Take one host (e.g. the optional bare-1) out of the testbed."""
    state = read_state()
    destroy_host(host)
    port = state.get("hosts", {}).pop(host, {}).get("port")
    if port:
        forget_host_key(port)
    write_state(state)


def down() -> None:
    state = read_state()
    for host in state.get("hosts", {}):
        destroy_host(host)
    docker("rm", "-f", MIRROR, PKG_MIRROR, check=False)
    docker("network", "rm", NETWORK, check=False)
    (testbed_dir() / "known_hosts").unlink(missing_ok=True)
    state.pop("hosts", None)
    write_state(state)
    log("testbed down")


GPU_FAULT_KINDS = ("xid79", "xid48", "remap-pending", "remap-failure", "ecc-uncorrectable", "pcie-degraded", "fabric-manager-down",
                   "clear")


def gpu_fault(host: str, gpu: str, kind: str) -> tuple[int, str]:
    """Fault drill (docs/gpu-health.md): the simulated nvidia-smi and kernel log of `host` show
    `kind` on GPU `gpu` (index or UUID), and the stand-in on it fails requests as vLLM would;
    `clear` removes it and records a GPU reset. (exit code, one line to print)."""
    if kind not in GPU_FAULT_KINDS:
        return 2, f"unknown GPU fault {kind!r}; one of {', '.join(GPU_FAULT_KINDS)}"
    r = docker("exec", container(host), "/usr/local/sbin/nemofleet-sim-fault", gpu, kind, check=False)
    if r.returncode:
        why = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"docker exec exit {r.returncode}"]
        return r.returncode, f"gpu-fault on {host} failed: {why[0]}"
    return 0, f"{host}: {r.stdout.strip()}"


def status() -> list[dict]:
    state = read_state()
    rows = []
    for host, h in state.get("hosts", {}).items():
        r = docker("inspect", "-f", "{{.State.Status}}", container(host), check=False)
        rows.append({"host": host, "port": h["port"], "gpus": h["gpus"], "group": h["group"],
                     "container": r.stdout.strip() or "absent"})
    return rows
