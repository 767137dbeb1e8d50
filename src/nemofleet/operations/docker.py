"""Docker image, network and container-network operations (each one fact, zero changes when met)."""

from __future__ import annotations

import os

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from ..facts.docker import ContainerNetworks, ImageInfo, Networks
from ..facts.prefetch import fact
from .. import shell
from . import cmd, fail_command, reads_with


# A vLLM image is ~10-20 GB: an hour covers a slow mirror; past that the pull is stuck, and a
# run that waits forever holds the deploy lock for the whole fleet.
PULL_TIMEOUT = 3600
LOAD_TIMEOUT = 1800  # `docker load` of a local archive: disk speed only


def image_reads(ref: str) -> tuple:
    """The facts image(), networks() and attached() read (deploy.py reads them ahead)."""
    return ImageInfo, {"ref": ref}


def networks_reads(wanted) -> tuple:
    return Networks, {"names": tuple(sorted(wanted))}


def attached_reads(containers) -> tuple:
    return ContainerNetworks, {"names": tuple(sorted(containers))}


@reads_with(lambda ref, **_: image_reads(ref))
@operation(is_idempotent=True)
def image(ref: str, archive: str | None = None, part: tuple | None = None):
    """Make `ref` present: `docker load` from a local archive (air-gapped hosts) or from a part of
    a signed bundle, `part` = (name, file, SHA-256), checked on the host before it is loaded, or
    `docker pull` (through the registry mirror). A present image is never pulled again."""
    if fact(*image_reads(ref)) is not None:
        host.noop(f"image {ref} is present")
        return
    q = shell.quote
    if part or archive:
        archive = os.path.expanduser(archive) if archive else None  # a controller path: settings take ~ (HOME_PATH)
        if not part and not os.path.isfile(archive or ""):
            yield fail_command(f"vllm_image_archive {archive} does not exist on the controller")
            return
        name, src, sha = part or (archive, archive, None)
        archive = name  # as the sentences below name it
        # one name per archive (the deploy lock keeps two runs off one host), removed either way
        tmp = f"/var/tmp/nemofleet-image-{os.path.basename(archive)}"
        yield FileUploadCommand(src, tmp, remote_temp_filename=tmp)
        if sha:
            yield StringCommand("sh", "-c", q(shell.sha256_check(tmp, sha, f"the bundle's part {name}")))
        yield StringCommand("sh", "-c", q(
            f"timeout {LOAD_TIMEOUT} docker load -q -i {q(tmp)} >/dev/null; rc=$?; rm -f {q(tmp)}; "
            f"[ $rc -ne 124 ] || {shell.fail(f'docker load of {archive} did not finish within {LOAD_TIMEOUT} s')}; "
            f"[ $rc -eq 0 ] || {shell.fail(f'docker load of {archive} failed')}; "
            f"timeout 30 docker image inspect {q(ref)} >/dev/null 2>&1 || "
            f"{shell.fail(f'the archive {os.path.basename(archive)} does not contain {ref}')}"))
        return
    yield StringCommand("sh", "-c", q(
        f"timeout {PULL_TIMEOUT} docker pull -q {q(ref)} >/dev/null; rc=$?; "
        f"[ $rc -ne 124 ] || {shell.fail(f'docker pull {ref} did not finish within {PULL_TIMEOUT} s: check the registry mirror')}; "
        f"[ $rc -eq 0 ] || "
        + shell.fail(f"docker pull {ref} failed: check registry-mirrors in /etc/docker/daemon.json and the host network")))


@reads_with(lambda wanted, **_: networks_reads(wanted))
@operation(is_idempotent=True)
def networks(wanted: dict[str, bool]):
    """Each frontend network must exist: created when `create` is true, else a clear error."""
    have = fact(*networks_reads(wanted))
    missing = [n for n in sorted(wanted) if not have.get(n)]
    if not missing:
        host.noop("frontend networks exist")
        return
    for n in missing:
        if not wanted[n]:
            yield fail_command(
                f"Docker network {n} does not exist on {host.name}; start its frontend first or set create: true for it")
            return
        yield cmd("timeout", 60, "docker", "network", "create", "--", n)


@reads_with(lambda containers, **_: attached_reads(containers))
@operation(is_idempotent=True)
def attached(containers: dict[str, dict[str, str]]):
    """Running containers are on their frontend networks with their aliases (repairs drift;
    the unit declares the networks so restarts keep them). {container: {network: alias}}"""
    state = fact(*attached_reads(containers))
    fixes = []
    for name, nets in sorted(containers.items()):
        info = state.get(name)
        if not info or not info["running"]:
            continue
        for net, alias in sorted(nets.items()):
            if net not in info["networks"]:
                fixes.append(cmd("timeout", 60, "docker", "network", "connect", "--alias", alias, "--", net, name))
    if not fixes:
        host.noop("containers are on their networks")
        return
    yield from fixes
