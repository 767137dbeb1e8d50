"""Pinned apt packages from a signed repository: the NVIDIA Container Toolkit and the driver.

One operation owns a repository's keyring, its source list and an apt pin, installs the
packages at the pinned version and holds them (apt_preferences(5), apt-mark(8)). A host that already has
them at that version, held, with the same files, changes nothing and costs two reads.
`apt-get update` refreshes only this repository's list (no other source is contacted).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from ..facts.packages import AptPackages
from ..facts.prefetch import fact
from .. import shell
from . import atomic_put, cmd, predicts, reads_with
from .files import FilesDigest

APT_UPDATE_TIMEOUT = 300  # seconds for one repository's lists
APT_INSTALL_TIMEOUT = 1800  # seconds for an install (a driver's DKMS build takes minutes)
# bounded: a dead mirror times out per request and in all
APT_UPDATE = f"timeout {APT_UPDATE_TIMEOUT} apt-get update -q -o Acquire::http::Timeout=30 -o Acquire::Retries=2"


def apt_script(update: str, install_opts: str, names: str, update_failed: str, install_failed: str) -> str:
    """`update`, then `apt-get install` of `names`, each bounded; a failure prints apt's last lines
    (or its E: lines) and one sentence, and exits 1. A dpkg lock held by unattended-upgrades is
    waited for when `install_opts` has DPkg::Lock::Timeout (apt >= 1.9.11)."""
    return ("export DEBIAN_FRONTEND=noninteractive; "
            f"out=$({update} 2>&1) || {{ printf '%s\\n' \"$out\" | tail -5 >&2; {shell.say(update_failed)}; exit 1; }}; "
            f"out=$(timeout {APT_INSTALL_TIMEOUT} apt-get install -y -q {install_opts} {names} 2>&1) || "
            f"{{ printf '%s\\n' \"$out\" | grep -E '^E:' | head -3 >&2; {shell.say(install_failed)}; exit 1; }}")


DEB_DIR = "/var/tmp/nemofleet-debs"


def from_debs(debs: list, install_opts: str, label: str):
    """Install .deb files of a signed bundle, [(name, bytes, SHA-256)]: each checked on arrival,
    then `apt-get install ./x.deb` (no repository, no index: the hosts have no tools to build one)."""
    if not debs:
        yield StringCommand("sh", "-c", shell.quote(shell.fail(f"the bundle holds no .deb for {label}")))
        return
    yield cmd("mkdir", "-p", "--", DEB_DIR)
    files = [f"{DEB_DIR}/{name.rsplit('/', 1)[-1]}" for name, _, _ in debs]
    for (name, src, sha), path in zip(debs, files):
        yield FileUploadCommand(src, path)
        yield StringCommand("sh", "-c", shell.quote(shell.sha256_check(path, sha, f"the bundle's part {name}")))
    q = shell.quote
    yield StringCommand("sh", "-c", q(
        f"export DEBIAN_FRONTEND=noninteractive; out=$(timeout {APT_INSTALL_TIMEOUT} apt-get install -y -q "
        f"{install_opts} {' '.join(q(p) for p in files)} 2>&1); rc=$?; rm -rf {DEB_DIR}; [ $rc -eq 0 ] || "
        f"{{ printf '%s\\n' \"$out\" | grep -E '^E:' | head -3 >&2; "
        f"{shell.say(f'apt could not install {label} from the bundle (a dependency the host lacks?)')}; exit 1; }}"))


def dearmor(key: bytes) -> bytes:
    """An ASCII-armored OpenPGP key as the binary keyring apt's signed-by= reads (.gpg)."""
    text = key.decode("ascii", "replace")
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
        return key
    body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].split("-----END PGP PUBLIC KEY BLOCK-----", 1)[0]
    lines = body.strip().splitlines()
    while lines and ":" in lines[0]:  # armor headers (Version:, Comment:)
        lines.pop(0)
    data = [line.strip() for line in lines if line.strip() and not line.startswith("=")]
    try:
        return base64.b64decode("".join(data), validate=True)
    except ValueError:  # binascii.Error: a character outside base64, or its padding
        raise ValueError("its armoured body is not base64") from None


def matches(installed: str | None, version: str) -> bool:
    """'1.18.0-1' matches exactly; a glob such as '580.*' matches a driver branch."""
    return installed is not None and fnmatch.fnmatchcase(installed, version)


def off_version(have: dict, names: list[str], version: str) -> list[str]:
    """Packages of `names` not installed at `version` (`have`: AptPackages): what pinned() installs."""
    return [n for n in names if not matches((have.get(n) or {}).get("version"), version)]


def unmet(have: dict, names: list[str], version: str) -> list[str]:
    """Packages of `names` not installed at `version` or not held (`have`: AptPackages)."""
    off = set(off_version(have, names, version))
    return [n for n in names if n in off or not (have.get(n) or {}).get("held")]


@operation(is_idempotent=True)
def pinned(packages: list[str], version: str, pin_file: str, label: str, source: dict | None = None,
           conflicting: list[str] | None = None, after_install: str | None = None, debs: list | None = None):
    """`packages` installed at `version` (exact, or a glob like '580.*'), pinned and held.

    source: {"list": path, "line": "deb [signed-by=KEYRING] URL /", "keyring": path, "key": bytes}
    (None: the host's own apt sources). conflicting: old source lists that make apt fail
    ("Conflicting values set for option Signed-By"), removed. after_install runs only when
    packages were installed or changed. debs: [(name, bytes, SHA-256)]
    of a signed bundle, installed from the files instead of any repository (source is then None).
    """
    files: dict[str, bytes] = {pin_file: (f"# Managed by nemofleet: pin {label} to {version}\n"
                                          f"Package: {' '.join(packages)}\n"
                                          f"Pin: version {version}\nPin-Priority: 1001\n").encode()}
    if source:
        files[source["keyring"]] = source["key"]
        files[source["list"]] = (f"# Managed by nemofleet: {label}\n{source['line']}\n").encode()
    watched = tuple(sorted(set(files) | set(conflicting or [])))
    current = host.get_fact(FilesDigest, paths=watched)
    stale = [p for p, data in sorted(files.items())
             if current.get(p) != ("644", hashlib.sha256(data).hexdigest())]
    gone = [p for p in sorted(conflicting or []) if current.get(p) is not None]
    have = host.get_fact(AptPackages, names=tuple(packages))
    wrong = off_version(have, packages, version)
    if not (stale or gone or unmet(have, packages, version)):
        host.noop(f"{label} {version} is installed and held")
        return
    if gone:
        yield cmd("rm", "-f", "--", *gone)
    for path in stale:
        yield from atomic_put(files[path], path, "0644")
    if wrong or (stale and source and source["list"] in stale):
        q = shell.quote
        update = APT_UPDATE
        if source:  # only this repository: no other source is contacted, and it is fast
            update += (f" -o Dir::Etc::sourcelist={q(source['list'])} -o Dir::Etc::sourceparts=-"
                       " -o APT::Get::List-Cleanup=0")
        exact = not any(c in version for c in "*?[")
        names = " ".join(q(f"{p}={version}" if exact else p) for p in packages)
        where = source["line"].split("]")[-1].strip() if source else "the host's apt sources"
        opts = ("--allow-downgrades --allow-change-held-packages -o DPkg::Lock::Timeout=120 "
                "-o Acquire::http::Timeout=30 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")
        if debs is not None:
            yield from from_debs(debs, opts, f"{label} {version}")
        else:
            yield StringCommand("sh", "-c", q(apt_script(
                update, opts, names,
                f"apt-get update failed for {label} ({where}, or took over {APT_UPDATE_TIMEOUT} s); nothing was installed",
                f"apt could not install {label} {version} from {where} (or it took over {APT_INSTALL_TIMEOUT} s)")))
        if after_install:
            yield StringCommand("sh", "-c", q(after_install))
    yield StringCommand(shell.join(["timeout", 120, "apt-mark", "hold", *packages]), ">/dev/null")


def installed_reads(packages) -> tuple:
    """The fact installed() reads (read ahead by deploy.py)."""
    return AptPackages, {"names": tuple(packages)}


@predicts(lambda packages, **_: list(packages))
def will_install(packages: list[str]) -> list[str]:
    """The packages installed(packages=...) will install (from its fact, read ahead)."""
    have = fact(*installed_reads(packages))
    return [p for p in packages if not (have.get(p) or {}).get("version")]


@reads_with(lambda packages, **_: installed_reads(packages))
@operation(is_idempotent=True)
def installed(packages: list[str], debs: list | None = None):
    """The distribution's packages installed (any version; e.g. haproxy for the front door). One
    fact, read ahead with the rest; when one is missing: apt-get update then install, both bounded
    (with `debs` of a signed bundle: from those files, see from_debs)."""
    missing = will_install(packages)
    if not missing:
        host.noop(f"{', '.join(packages)} installed")
        return
    if debs is not None:
        yield from from_debs(debs, "--no-install-recommends -o DPkg::Lock::Timeout=120", ", ".join(missing))
        return
    names = " ".join(shell.quote(p) for p in missing)
    yield StringCommand("sh", "-c", shell.quote(apt_script(
        APT_UPDATE, "--no-install-recommends -o DPkg::Lock::Timeout=120", names,
        f"apt-get update failed (or took over {APT_UPDATE_TIMEOUT} s); {names} not installed",
        f"apt could not install {names}")))


def check_pin(setting: str, value) -> str | None:
    """A refusal sentence for a pinned version setting that is missing or malformed."""
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        return f"{setting} must be a pinned package version such as '1.18.0-1' (got {value!r})"
    return None
