"""Docker image, network and container-network operations (each one fact, zero changes when met)."""

from __future__ import annotations

import os

from pyinfra import host
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, operation

from ..facts.docker import ContainerNetworks, ImageInfo, Networks
from ..facts.weights import MARKER
from ..facts.prefetch import fact
from .. import shell
from . import cmd, fail_command, reads_with, weights


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


ARCHIVE = "image.tar"


def _verified(sha: str, directory: str) -> str:
    """A shell condition: the archive in `directory` matches its SHA-256 (then marked: a source for others)."""
    return f"{{ {shell.sha256_ok(f'{directory}/{ARCHIVE}', sha)} && touch {shell.quote(directory + '/' + MARKER)}; }}"


def archive_unless_copied(state, host, name: str, src, sha: str, directory: str) -> bool:
    """The bundle's image archive from the controller only when no peer's copy left it here."""
    return weights.unless_verified(host, _verified(sha, directory), archive_commands(name, src, sha, directory))


def archive_commands(name: str, src, sha: str, directory: str) -> list:
    """A bundle's image archive into `directory` (under the models root, where the fleet seed key's
    read-only rsync reaches it), checked there against its SHA-256, then marked as a verified copy."""
    tar = f"{directory}/{ARCHIVE}"
    return [cmd("mkdir", "-p", "--", directory), cmd("rm", "-f", "--", f"{directory}/{MARKER}"),
            FileUploadCommand(src, tar),
            StringCommand("sh", "-c", shell.quote(shell.sha256_check(tar, sha, f"the bundle's part {name}")
                                                  + " && touch " + shell.quote(f"{directory}/{MARKER}")))]


@reads_with(lambda ref, **_: image_reads(ref))
@operation(is_idempotent=True)
def image(ref: str, archive: str | None = None, part: tuple | None = None):
    """Make `ref` present: `docker load` from a local archive (air-gapped hosts) or from a part of
    a signed bundle, `part` = (name, file, SHA-256, directory, sources), or `docker pull` (through
    the registry mirror). A present image is never pulled again. A bundle's archive reaches one
    host of the run from the controller (weights.bundle_received); `sources()` says at execution
    whether this host is that one, else the peers it copies the archive from (rsync with the fleet
    seed key, waiting for a source still copying, as the weights do: docs/fanout.md); the
    controller's copy is the last resort. Each copy is checked against the SHA-256 and kept in
    `directory` for the hosts after it until the deploy prunes it."""
    if fact(*image_reads(ref)) is not None:
        host.noop(f"image {ref} is present")
        return
    q = shell.quote
    if part:
        name, src, sha, directory, *sources = part
        first, peers = sources[0]() if sources else (False, None)
        if not first:
            if peers:
                yield StringCommand("sh", "-c", q("\n".join([f"mkdir -p {q(directory)}", *weights.seed_lines(
                    peers, directory, "", verified=_verified(sha, directory))])))
            yield FunctionCommand(archive_unless_copied, (name, src, sha, directory), {})
        yield _load(ref, f"{directory}/{ARCHIVE}", name)
        return
    if archive:
        archive = os.path.expanduser(archive)  # a controller path: settings take ~ (HOME_PATH)
        if not os.path.isfile(archive):
            yield fail_command(f"vllm_image_archive {archive} does not exist on the controller")
            return
        # one name per archive (the deploy lock keeps two runs off one host), removed either way
        tmp = f"/var/tmp/nemofleet-image-{os.path.basename(archive)}"
        yield FileUploadCommand(archive, tmp, remote_temp_filename=tmp)
        yield _load(ref, tmp, archive, f"rm -f {q(tmp)}; ")
        return
    yield StringCommand("sh", "-c", q(
        f"timeout {PULL_TIMEOUT} docker pull -q {q(ref)} >/dev/null; rc=$?; "
        f"[ $rc -ne 124 ] || {shell.fail(f'docker pull {ref} did not finish within {PULL_TIMEOUT} s: check the registry mirror')}; "
        f"[ $rc -eq 0 ] || "
        + shell.fail(f"docker pull {ref} failed: check registry-mirrors in /etc/docker/daemon.json and the host network")))


def _load(ref: str, path: str, what: str, then: str = "") -> StringCommand:
    """`docker load` of the archive at `path` on the host (`then` runs after it either way)."""
    q = shell.quote
    return StringCommand("sh", "-c", q(
        f"timeout {LOAD_TIMEOUT} docker load -q -i {q(path)} >/dev/null; rc=$?; {then}"
        f"[ $rc -ne 124 ] || {shell.fail(f'docker load of {what} did not finish within {LOAD_TIMEOUT} s')}; "
        f"[ $rc -eq 0 ] || {shell.fail(f'docker load of {what} failed')}; "
        f"timeout 30 docker image inspect {q(ref)} >/dev/null 2>&1 || "
        f"{shell.fail(f'the archive {os.path.basename(what)} does not contain {ref}')}"))


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
