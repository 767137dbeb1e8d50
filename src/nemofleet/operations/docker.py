"""Docker image, network and container-network operations (each one fact, zero changes when met)."""

from __future__ import annotations

import json
import os
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, StringCommand, operation

from ..facts.docker import ImageInfo
from . import fail_command


class Networks(FactBase):
    """{name: exists} for each Docker network name."""

    def command(self, names: tuple[str, ...]) -> str:
        q = " ".join(shlex.quote(n) for n in names)
        return (f"for n in {q}; do if docker network inspect \"$n\" >/dev/null 2>&1; then echo \"$n 1\"; "
                "else echo \"$n 0\"; fi; done")

    def process(self, output):
        return {line.split()[0]: line.split()[1] == "1" for line in output if line.strip()}


class ContainerNetworks(FactBase):
    """{container: {"running": bool, "networks": {net: [aliases]}}} (stopped containers too)."""

    def command(self, names: tuple[str, ...]) -> str:
        q = " ".join(shlex.quote(n) for n in names)
        fmt = "{{.Name}} {{.State.Running}} {{json .NetworkSettings.Networks}}"
        return f"for c in {q}; do docker inspect -f '{fmt}' \"$c\" 2>/dev/null || echo \"/$c absent\"; done"

    def process(self, output):
        out = {}
        for line in output:
            parts = line.strip().split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("/"):
                continue  # a container being re-created can print a partial answer
            name, running, *rest = parts
            name = name.lstrip("/")
            if running == "absent":
                out[name] = None
                continue
            try:
                nets = json.loads(rest[0]) if rest else {}
            except ValueError:
                nets = {}
            out[name] = {"running": running == "true",
                         "networks": {k: (v or {}).get("Aliases") or [] for k, v in (nets or {}).items()}}
        return out


@operation(is_idempotent=True)
def image(ref: str, archive: str | None = None):
    """Make `ref` present: `docker load` from a local archive (air-gapped hosts) or `docker pull`
    (through the registry mirror). A present image is never pulled again."""
    if host.get_fact(ImageInfo, ref=ref) is not None:
        host.noop(f"image {ref} is present")
        return
    if archive:
        if not os.path.isfile(archive):
            yield fail_command(f"vllm_image_archive {archive} does not exist on the controller")
            return
        tmp = f"/var/tmp/nemofleet-image-{os.getpid()}.tar"
        yield FileUploadCommand(archive, tmp, remote_temp_filename=tmp)
        yield StringCommand("sh", "-c", shlex.quote(
            f"docker load -q -i {tmp} >/dev/null; rc=$?; rm -f {tmp}; "
            f"[ $rc -eq 0 ] || {{ echo 'docker load of {archive} failed' >&2; exit 1; }}; "
            f"docker image inspect {shlex.quote(ref)} >/dev/null 2>&1 || "
            f"{{ echo 'the archive {os.path.basename(archive)} does not contain {ref}' >&2; exit 1; }}"))
        return
    yield StringCommand("sh", "-c", shlex.quote(
        f"docker pull -q {shlex.quote(ref)} >/dev/null || {{ echo 'docker pull {ref} failed: check registry-mirrors "
        "in /etc/docker/daemon.json and the host network' >&2; exit 1; }"))


@operation(is_idempotent=True)
def networks(wanted: dict[str, bool]):
    """Each frontend network must exist: created when `create` is true, else a clear error."""
    have = host.get_fact(Networks, names=tuple(sorted(wanted)))
    missing = [n for n in sorted(wanted) if not have.get(n)]
    if not missing:
        host.noop("frontend networks exist")
        return
    for n in missing:
        if not wanted[n]:
            yield fail_command(
                f"Docker network {n} does not exist on {host.name}; start its frontend first or set create: true for it")
            return
        yield StringCommand("docker", "network", "create", n)


@operation(is_idempotent=True)
def attached(containers: dict[str, dict[str, str]]):
    """Running containers are on their frontend networks with their aliases (repairs drift;
    the unit declares the networks so restarts keep them). {container: {network: alias}}"""
    state = host.get_fact(ContainerNetworks, names=tuple(sorted(containers)))
    fixes = []
    for name, nets in sorted(containers.items()):
        info = state.get(name)
        if not info or not info["running"]:
            continue
        for net, alias in sorted(nets.items()):
            if net not in info["networks"]:
                fixes.append(StringCommand("docker", "network", "connect", "--alias", alias, net, name))
    if not fixes:
        host.noop("containers are on their networks")
        return
    yield from fixes
