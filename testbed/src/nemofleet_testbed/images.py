"""Build the testbed's images from Debian with debootstrap + `docker import` (no registry).

- host image: a Debian bookworm GPU host without the GPU: systemd as PID 1, sshd, cron,
  python3, curl, docker.io, plus the simulated nvidia-smi / nvidia-ctk / toolkit hook.
- stand-in vLLM image: Debian minbase + python3 + the real `huggingface_hub` CLI (`hf`)
  + the OpenAI-compatible stand-in server; entrypoint `vllm serve` like vllm/vllm-openai.
  It is saved as a `docker save` archive tagged like the real image, which the deploy
  loads on hosts that lack the image (the air-gapped path: `vllm_image_archive`).

Images are tagged with a hash of everything that goes into them, so they rebuild only
when their recipe changes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import time
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the stand-in imports nemofleet's flag table (vllm_flags.py, standard library only) from its own
# directory in the image: the module file of the installed nemofleet, found without importing it
VLLM_FLAGS = Path(importlib.util.find_spec("nemofleet.vllm_flags").origin)
SUITE = "bookworm"
HOST_PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "cron", "python3", "curl",
                 "ca-certificates", "docker.io", "iproute2", "rsync", "procps", "iptables", "kmod", "sudo",
                 "haproxy"]
STANDIN_PACKAGES = ["python3"]
HF_HUB = "huggingface_hub==2.4.0"


def log(msg: str) -> None:
    print(f"[testbed] {msg}", file=sys.stderr, flush=True)


def run(cmd, what: str | None = None, every: float = 15.0, **kw):
    """subprocess.run(cmd, check=True). With `what`, a build step that takes minutes: a progress
    line with its elapsed time every `every` seconds while it runs, and one when it ends, so a
    first `make demo` is never silent for minutes."""
    if what is None:
        return subprocess.run(cmd, check=True, **kw)
    t0 = time.monotonic()
    with subprocess.Popen(cmd, **kw) as proc:
        while True:
            try:
                proc.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                log(f"  {what}: {time.monotonic() - t0:.0f} s so far")
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    log(f"  {what}: done in {time.monotonic() - t0:.0f} s")
    return subprocess.CompletedProcess(cmd, proc.returncode)


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses (nothing else is reachable)."""
    for path in ["/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"]:
        try:
            text = open(path).read()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s+\S+", text, re.M)
        if m:
            return m.group(1)
    raise RuntimeError("cannot find a Debian mirror in /etc/apt sources; set NEMOFLEET_DEBIAN_MIRROR")


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
                if f.is_file() and "__pycache__" not in f.parts:
                    h.update(f.name.encode() + f.read_bytes())
        else:
            h.update(str(p).encode())
    return h.hexdigest()[:12]


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def debootstrap(dest: Path, packages: list[str], suite: str = SUITE) -> None:
    mirror = os.environ.get("NEMOFLEET_DEBIAN_MIRROR") or debian_mirror()
    log(f"debootstrap {suite} ({len(packages)} packages) into {dest}")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(dest), mirror],
        what=f"debootstrap {suite}", stdout=subprocess.DEVNULL)


def prune(root: Path) -> None:
    for sub in ["var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                "usr/share/info", "usr/share/locale"]:
        p = root / sub
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                elif child.name not in ("lock", "partial"):
                    child.unlink(missing_ok=True)


def docker_import(root: Path, tag: str, changes: list[str]) -> None:
    cmd = ["docker", "import"]
    for c in changes:
        cmd += ["--change", c]
    tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    run(cmd + ["-", tag], what=f"docker import {tag}", stdin=tar.stdout, stdout=subprocess.DEVNULL)
    if tar.wait():
        raise RuntimeError("tar of the rootfs failed")


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    p.chmod(mode)


HOSTKEYS_UNIT = """[Unit]
Description=Generate this host's SSH host keys (a fresh install gets new ones)
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
"""

SIM_UNIT = """[Unit]
Description=Install the simulated GPU tools of this host's hardware profile
Before=docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/nemofleet-sim/nemofleet-sim-setup

[Install]
WantedBy=multi-user.target
"""


# Debian 13 carries Docker 26 (CDI, several --network flags per run), Debian 12 Docker 20.10.
SUITE_PACKAGES = {"bookworm": [], "trixie": ["docker-cli"]}
# systemd 257 boots on a cgroup v1 machine (like this one) only when told to; harmless on v2
SUITE_INIT = {"bookworm": ["/sbin/init"], "trixie": ["/sbin/init", "SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1"]}
# Docker 26 cannot switch IPv6 off inside a nested container's network namespace here
DOCKER_DROPIN = "[Service]\nEnvironment=DOCKER_ALLOW_IPV6_ON_IPV4_INTERFACE=1\n"


def host_image(suite: str = SUITE) -> str:
    sim = HERE / "sim"
    packages = HOST_PACKAGES + SUITE_PACKAGES[suite]
    tag = f"nemofleet/testbed-host:{_hash(suite, packages, sim, HOSTKEYS_UNIT, SIM_UNIT, Path(__file__))}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="nf-host-", dir=os.environ.get("NEMOFLEET_BUILD_DIR")) as tmp:
        root = Path(tmp) / "rootfs"
        debootstrap(root, packages, suite)
        if suite != "bookworm":
            _write(root, "etc/systemd/system/docker.service.d/nemofleet-testbed.conf", DOCKER_DROPIN)
        for f in sim.iterdir():
            dst = root / "opt/nemofleet-sim" / f.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst)
        _write(root, "etc/systemd/system/nemofleet-hostkeys.service", HOSTKEYS_UNIT)
        _write(root, "etc/systemd/system/nemofleet-sim.service", SIM_UNIT)
        gen = root / "etc/systemd/system-generators/nemofleet-sim-nvml-trap"
        gen.parent.mkdir(parents=True, exist_ok=True)
        gen.symlink_to("/opt/nemofleet-sim/nemofleet-sim-nvml-trap")  # runs at every daemon-reload
        _write(root, "etc/ssh/sshd_config.d/nemofleet.conf",
               "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
        for key in root.glob("etc/ssh/ssh_host_*"):
            key.unlink()
        (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
        # units that cannot work in a container
        for unit in ["getty@tty1.service", "console-getty.service", "systemd-udevd.service",
                     "systemd-udev-trigger.service", "systemd-modules-load.service",
                     "systemd-remount-fs.service", "sys-kernel-config.mount", "sys-kernel-debug.mount",
                     "systemd-firstboot.service", "apt-daily.timer", "apt-daily-upgrade.timer"]:
            link = root / "etc/systemd/system" / unit
            if not link.exists():
                link.symlink_to("/dev/null")
        run(["chroot", str(root), "systemctl", "enable", "nemofleet-hostkeys.service", "nemofleet-sim.service",
             "ssh.service", "cron.service", "docker.service"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prune(root)
        log(f"importing {tag}")
        docker_import(root, tag, [f"CMD {json.dumps(SUITE_INIT[suite])}", "ENV container=docker"])
    return tag


VLLM_WRAPPER = '#!/bin/sh\nexec python3 /opt/standin/vllm_standin.py "$@"\n'
HF_WRAPPER = '#!/bin/sh\nPYTHONPATH=/opt/hf exec python3 -m huggingface_hub.cli.hf "$@"\n'


def standin_image() -> str:
    standin = HERE / "standin"
    flags = VLLM_FLAGS
    tag = f"nemofleet/vllm-standin:{_hash(SUITE, STANDIN_PACKAGES, HF_HUB, standin, flags, Path(__file__))}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="nf-standin-", dir=os.environ.get("NEMOFLEET_BUILD_DIR")) as tmp:
        root = Path(tmp) / "rootfs"
        debootstrap(root, STANDIN_PACKAGES)
        log(f"pip install {HF_HUB} into the image (the real hf CLI)")
        run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check",
             "--target", str(root / "opt/hf"), HF_HUB], what=f"pip install {HF_HUB}", stdout=subprocess.DEVNULL)
        shutil.rmtree(root / "opt/hf/bin", ignore_errors=True)
        (root / "opt/standin").mkdir(parents=True)
        shutil.copy(standin / "vllm_standin.py", root / "opt/standin/vllm_standin.py")
        shutil.copy(flags, root / "opt/standin/vllm_flags.py")
        _write(root, "usr/local/bin/vllm", VLLM_WRAPPER, 0o755)
        _write(root, "usr/local/bin/hf", HF_WRAPPER, 0o755)
        prune(root)
        shutil.rmtree(root / "usr/lib/python3.11/test", ignore_errors=True)
        log(f"importing {tag}")
        docker_import(root, tag, [
            'ENTRYPOINT ["vllm", "serve"]',
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV CUDA_VERSION=12.8.1",
            "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.8",
            "ENV STANDIN_VLLM_VERSION=0.27.1",
        ])
    return tag


def save_as(src_tag: str, repo_tag: str, dest: Path, env: dict[str, str] | None = None) -> Path:
    """`docker save` src_tag into dest, re-tagged as repo_tag (e.g. the pinned vllm/vllm-openai tag).

    With `env`, a thin layer-less variant is made first (docker commit --change ENV ...).
    """
    if dest.exists() and dest.stat().st_size and dest.with_suffix(".src").exists() and \
            dest.with_suffix(".src").read_text() == f"{src_tag} {repo_tag} {sorted((env or {}).items())}":
        return dest
    tag = src_tag
    if env:
        tag = f"{src_tag}-{hashlib.sha1(repr(sorted(env.items())).encode()).hexdigest()[:8]}"
        cid = subprocess.run(["docker", "create", src_tag], check=True, capture_output=True, text=True).stdout.strip()
        try:
            cmd = ["docker", "commit"]
            for k, v in env.items():
                cmd += ["--change", f"ENV {k}={v}"]
            cmd += ["--change", 'ENTRYPOINT ["vllm", "serve"]', cid, tag]
            run(cmd, stdout=subprocess.DEVNULL)
        finally:
            subprocess.run(["docker", "rm", cid], capture_output=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    raw = subprocess.run(["docker", "save", tag], check=True, capture_output=True).stdout
    _retag_archive(raw, repo_tag, dest)
    dest.with_suffix(".src").write_text(f"{src_tag} {repo_tag} {sorted((env or {}).items())}")
    return dest


def _retag_archive(raw: bytes, repo_tag: str, dest: Path) -> None:
    repo, tag = repo_tag.rsplit(":", 1)
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(dest, "w") as out:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name == "manifest.json":
                manifest = json.loads(data)
                for m in manifest:
                    m["RepoTags"] = [repo_tag]
                data = json.dumps(manifest).encode()
                member.size = len(data)
            elif member.name == "repositories":
                img_id = next(iter(next(iter(json.loads(data).values())).values()))
                data = json.dumps({repo: {tag: img_id}}).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data) if data is not None else None)

