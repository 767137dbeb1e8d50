"""One signed file that takes an air-gapped fleet to serving (docs/air-gap.md).

    nemofleet bundle create INVENTORY -o FILE [--facts FILE]   what the hosts' plans need, signed
    nemofleet bundle verify FILE [INVENTORY] [--allowed-signers F]
    nemofleet bundle show FILE

A bundle is an uncompressed tar: `manifest.json` first, `manifest.json.sig` (ssh-keygen -Y sign,
namespace NAMESPACE) second, then the parts, each listed in the manifest with its size, SHA-256,
purpose and the hosts it serves. The signature covers the manifest, the manifest covers every
byte: a reader checks the signature over a few KB, then each part's hash as it reads the part
(`verify` reads them all; the deploy reads an image or a model's weights once per run, streaming
it to the first host that takes it, hashing it on the way and again on that host, before anything
changes on any host: `Staging`; the other hosts copy it from a peer. A part a host already has is
never read). Tar keeps each part's bytes contiguous at a known offset, so the deploy
streams a part to a host straight from the file (`Part`), never extracting it on the controller.

Parts: `images/<id>.tar` (a `docker save` archive, identity: its image ID), `weights/<dir>/<file>`
(huggingface_hub's local-dir layout with its `.cache/huggingface/download/*.metadata`, so the
host's own weights check confirms the commit and writes the completion marker), `debs/<file>.deb`.
Parts of other purposes (kernel wheels, compile caches) are carried and verified the same way and
ignored by the deploy (docs/air-gap.md says how to add them by hand).

Reading, verifying and writing live here (the deploy's preflight and operations use them);
`nemofleet bundle create`, which plans the hosts, is nemofleet.fleet.bundle.

Layer: below the stages (no pyinfra import); the toolkit's package names come from the caller.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
from typing import BinaryIO

from .valuetypes import Refusal, shown

NAMESPACE = "nemofleet-bundle"
FORMAT = "nemofleet-bundle/1"
DEFAULT_SIGNERS = "~/.config/nemofleet/allowed_signers"
CHUNK = 1 << 20
SSH_KEYGEN_TIMEOUT = 60
MAX_MANIFEST = 64 << 20


class BundleError(Exception):
    """One sentence for the operator."""


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _size(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


# ---------------------------------------------------------------------------- reading


class Part(io.RawIOBase):
    """The bytes of one part inside the bundle, as a file (pyinfra uploads it as it would a file):
    opened at the first read, never before, so a host that needs nothing reads nothing. Read from
    its start to its end, it knows its SHA-256 (`sha256`): the upload is the check, no extra pass."""

    def __init__(self, path: str, offset: int, size: int):
        super().__init__()
        self.path, self.offset, self.size, self.pos, self.hashed = path, offset, size, 0, 0
        self.f: BinaryIO | None = None
        self.h = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, min(self.size, pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        f = self.f = self.f or open(self.path, "rb")
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        f.seek(self.offset + self.pos)
        data = f.read(n)
        if self.pos == self.hashed:  # the bytes in order from the start: hashed as they go
            self.h.update(data)
            self.hashed += len(data)
        self.pos += len(data)
        return data

    def sha256(self) -> str | None:
        """The SHA-256 of the bytes read, once every byte was read in order (else None)."""
        return self.h.hexdigest() if self.hashed == self.size else None

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        super().close()


_TEXT = (str, type(None))
_PART_TEXT = ("image", "image_id", "repo", "revision", "package", "version", "file")


def manifest_problem(m: dict) -> str | None:
    """Why a manifest read from a file is not of the shape `create` writes (every field a reader
    takes: a part's path a plain relative name, its size a count, its SHA-256 64 hex digits), or
    None. The manifest is read before its signature is checked (show), so nothing trusts it."""
    if not isinstance(m.get("created"), str) or not isinstance(m.get("inventory"), _TEXT):
        return "created and inventory must be text"
    plans, parts = m.get("plans", {}), m.get("parts")
    if not isinstance(plans, dict) or not all(isinstance(h, str) and isinstance(p, dict)
                                              and all(isinstance(v, (str, bool)) for v in p.values())
                                              for h, p in plans.items()):
        return "plans must map host names to their plan's text fields"
    if not isinstance(parts, list):
        return "parts must be a list"
    seen = set()
    for p in parts:
        if not isinstance(p, dict):
            return f"a part is {type(p).__name__}, not a mapping"
        name = p.get("path")
        if (not isinstance(name, str) or name in seen or name.startswith("/") or ".." in name.split("/")
                or any(c < " " or c == "\x7f" for c in name) or name in ("manifest.json", "manifest.json.sig")):
            return f"the part path {shown(name)} is not a plain relative name listed once"
        seen.add(name)
        if not (isinstance(p.get("size"), int) and not isinstance(p["size"], bool) and 0 <= p["size"] < 1 << 50):
            return f"the part {shown(name)} has the size {shown(p.get('size'))}, not a count of bytes"
        if not (isinstance(p.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", p["sha256"])):
            return f"the part {shown(name)} has no SHA-256 of 64 hex digits"
        if not isinstance(p.get("purpose"), str) or not all(isinstance(p.get(k), _TEXT) for k in _PART_TEXT):
            return f"the part {shown(name)} has a purpose or description that is not text"
        if not (isinstance(p.get("serves", []), list) and all(isinstance(h, str) for h in p.get("serves", []))):
            return f"the part {shown(name)} serves must list host names"
    return None


class Bundle:
    """A bundle's manifest, signature and the place of each member (headers only are read)."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise BundleError(f"the bundle {path} does not exist (or is not a regular file): give the file "
                              "`nemofleet bundle create` wrote")
        try:
            with tarfile.open(path, "r:") as t:
                self.members = {m.name: (m.offset_data, m.size) for m in t.getmembers() if m.isfile()}
                first = t.getmembers()[:2]
        except (tarfile.TarError, OSError) as exc:
            raise BundleError(f"the bundle {path} is not a nemofleet bundle (not a readable tar: {exc})") from None
        if [m.name for m in first] != ["manifest.json", "manifest.json.sig"]:
            raise BundleError(f"the bundle {path} does not begin with manifest.json and its signature: it is not "
                              "a file `nemofleet bundle create` wrote")
        if self.members["manifest.json"][1] > MAX_MANIFEST:
            raise BundleError(f"the bundle {path} has a manifest larger than {MAX_MANIFEST} bytes")
        self.manifest_bytes = self.read("manifest.json")
        self.signature = self.read("manifest.json.sig")
        try:
            self.manifest = json.loads(self.manifest_bytes)
        except (ValueError, RecursionError):
            raise BundleError(f"the bundle {path} has a manifest that is not nemofleet's JSON") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            got = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise BundleError(f"the bundle {path} is of format {shown(got)}; this nemofleet reads {FORMAT}")
        why = manifest_problem(self.manifest)
        if why:  # read before the signature is checked (show, verify): its shape is refused, never trusted
            raise BundleError(f"the bundle {path} has a manifest that is not nemofleet's: {why}")
        self.parts = {p["path"]: p for p in self.manifest["parts"]}

    def read(self, name: str) -> bytes:
        with self.part(name) as f:
            return f.read()

    def part(self, name: str) -> Part:
        offset, size = self.members[name]
        return Part(self.path, offset, size)

    def check_signature(self, allowed: str) -> str:
        """The signer's principal, after ssh-keygen verified the manifest against `allowed`."""
        full = os.path.expanduser(allowed)
        if not os.path.isfile(full):
            raise BundleError(f"the allowed signers file {allowed} does not exist: give --allowed-signers (or set "
                              "bundle_allowed_signers_file) to the file of keys you trust (ssh-keygen ALLOWED SIGNERS)")
        with tempfile.TemporaryDirectory(prefix="nemofleet-bundle-") as tmp:
            sig = os.path.join(tmp, "manifest.json.sig")
            with open(sig, "wb") as f:
                f.write(self.signature)
            found = _keygen(["-Y", "find-principals", "-s", sig, "-f", full])
            who = found.stdout.decode(errors="replace").split()
            if found.returncode or not who:
                raise BundleError(f"the bundle {self.path} is signed by a key that {allowed} does not trust (or its "
                                  "signature is damaged): refused")
            ok = _keygen(["-Y", "verify", "-f", full, "-I", who[0], "-n", NAMESPACE, "-s", sig], self.manifest_bytes)
            if ok.returncode:
                raise BundleError(f"the bundle {self.path} has a manifest that does not match its signature (changed "
                                  "after it was signed): refused")
        return who[0]

    def check_parts(self, say=lambda line: None) -> None:
        """Every part present with its size and SHA-256, and nothing that the manifest does not list."""
        extra = sorted(set(self.members) - set(self.parts) - {"manifest.json", "manifest.json.sig"})
        if extra:
            raise BundleError(f"the bundle {self.path} holds {extra[0]}, which its manifest does not list: refused")
        self.check_parts_named(self.parts, say)

    def check_parts_named(self, names, say=lambda line: None) -> None:
        for name in names:
            p = self.parts[name]
            if name not in self.members or self.members[name][1] != p["size"]:
                raise BundleError(f"the bundle {self.path} lacks its part {name} (or it has another size): refused")
            with self.part(name) as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != p["sha256"]:
                raise BundleError(f"the bundle's part {name} does not match its SHA-256 in the signed manifest "
                                  "(a changed or damaged byte): refused")
            say(f"ok {name} ({_size(p['size'])})")

    def find(self, purpose: str, **match) -> list[dict]:
        return [p for p in self.manifest["parts"] if p.get("purpose") == purpose
                and all(p.get(k) == v for k, v in match.items())]


def _keygen(args: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, timeout=SSH_KEYGEN_TIMEOUT)
    except FileNotFoundError:
        raise BundleError("ssh-keygen is not installed on this controller (OpenSSH 8.9 or later signs and "
                          "verifies bundles)") from None
    except subprocess.TimeoutExpired:
        raise BundleError(f"ssh-keygen did not answer within {SSH_KEYGEN_TIMEOUT} s") from None


def allowed_signers(given: str | None, specs: dict | None) -> str:
    """--allowed-signers, else the inventory's bundle_allowed_signers_file, else DEFAULT_SIGNERS."""
    if given:
        return given
    for sp in (specs or {}).values():
        if sp.settings is not None and sp.settings.bundle_allowed_signers_file:
            return sp.settings.bundle_allowed_signers_file
    return DEFAULT_SIGNERS


# ---------------------------------------------------------------------------- what a host needs


def weights_part(directory: str, rel: str) -> str:
    return f"weights/{os.path.basename(directory.rstrip('/'))}/{rel}"


def needs(want, s, toolkit=()) -> list[tuple[str, dict]]:
    """[(what, manifest match)] of the parts this host's Desired takes from a bundle (`toolkit`: the
    toolkit's package names, bootstrap.TOOLKIT_PACKAGES)."""
    out = [(f"the image {want.image}", {"purpose": "image", "image": want.image})]
    out += [(f"the weights {d.repo}@{d.revision[:12]}", {"purpose": "weights", "repo": d.repo, "revision": d.revision})
            for d in want.downloads]
    if s.install_container_toolkit:
        out += [(f"the package {n} {s.container_toolkit_version}",
                 {"purpose": "package", "package": n, "version": s.container_toolkit_version}) for n in toolkit]
    if want.front_door:
        out.append(("the package haproxy", {"purpose": "package", "package": "haproxy"}))
    return out


def refusals(b: Bundle, want, s, toolkit=()) -> list[str]:
    """One sentence per part this host's plan needs that the bundle lacks (the deploy's preflight)."""
    if s.install_nvidia_driver:
        return ["install_nvidia_driver is set: a bundle does not carry the NVIDIA driver yet (its kernel headers "
                "and DKMS); install the driver first, or deploy this host without the bundle setting"]
    return [f"the bundle {b.path} lacks {what}, which this host's plan needs: make a new bundle from this inventory "
            "(nemofleet bundle create)" for what, match in needs(want, s, toolkit) if not b.find(**match)]


# the hosts' preflights run side by side (pyinfra's greenlets; ssh-keygen's wait lets another run):
# one checks the signature or hashes a part, the others wait for its answer
_HASHING = threading.Lock()


@functools.lru_cache(maxsize=16)
def _checked(path: str, allowed: str) -> tuple[Bundle | None, str | None]:
    """(the bundle, None) once its signature is good, else (None, the sentence); once per run."""
    try:
        b = Bundle(path)
        b.check_signature(allowed)
        return b, None
    except BundleError as exc:
        return None, str(exc)


def for_host(s) -> tuple[Bundle | None, str | None]:
    """The bundle this host's settings name (signature checked), or the sentence why not."""
    if s is None or not s.bundle:
        return None, None
    with _HASHING:  # one check (and one Bundle) per run: the hosts' preflights run side by side
        return _checked(os.path.expanduser(s.bundle), s.bundle_allowed_signers_file or DEFAULT_SIGNERS)


@functools.lru_cache(maxsize=4096)
def _hashed(b: Bundle, name: str) -> str | None:
    try:
        b.check_parts_named([name])
    except BundleError as exc:
        return str(exc)
    return None


def preflight(want, s, facts, toolkit=(), dry: bool = False) -> tuple[Bundle | None, list[Refusal], list[str]]:
    """The deploy's bundle refusals for one host, before anything changes: a bad signature or
    signer, a part its plan needs that the bundle lacks, or a toolkit .deb this host is about to
    take whose bytes do not match the signed manifest (hashed once per run; with `dry`, the
    image and weights too, as nothing will be uploaded to check them). Returns (the bundle, the
    refusals, each with the code "bundle", and the image and weights parts this host is about to
    take: its image absent, its weights incomplete). A converged host reads no part."""
    b, why = for_host(s)
    if why or b is None:
        return None, [Refusal(why, "bundle")] if why else [], []
    out = refusals(b, want, s, toolkit)
    if out:
        return None, [Refusal(r, "bundle") for r in out], []
    takes = [p["path"] for p in b.find("image", image=want.image)[:1]] if facts.image is None else []
    for d in want.downloads:
        m = facts.models.get(os.path.basename(d.directory.rstrip("/")))
        if not (m and m.complete):
            takes += [p["path"] for p in b.find("weights", repo=d.repo, revision=d.revision)]
    names = list(takes) if dry else []
    if s.install_container_toolkit and (facts.toolkit.version or "") != (s.container_toolkit_version or "").split("-")[0]:
        names += [p["path"] for p in b.find("package", version=s.container_toolkit_version)]
    with _HASHING:  # one host hashes at a time; _hashed keeps each part's answer for the run
        problems = [why for why in (_hashed(b, n) for n in names) if why]
    return b, [Refusal(why, "bundle") for why in problems][:1], takes


class Staging:
    """Which host of a run receives each image and each model's weights from the controller, and
    what came of it. `takers`: {key: hosts about to take it}, from their preflights (a key is an
    image part's name, or "weights REPO@COMMIT"; a host that copies from no peer has keys of its
    own); `verdicts`: {key: (the host that received it, None or the sentence why it was refused)}.
    The first host of the run that takes a key receives it (`first`), before anything changes on
    any host; the others wait for its verdict and copy from a peer later (docs/air-gap.md)."""

    def __init__(self) -> None:
        self.takers: dict = {}
        self.started: set = set()  # the hosts that began receiving or waiting
        self.verdicts: dict = {}

    def take(self, host: str, keys) -> None:
        for k in keys:
            self.takers.setdefault(k, set()).add(host)

    def first(self, key, order, gone=()) -> str | None:
        """The host that receives `key`: the first of `order` (the run's hosts) taking it that is
        not `gone` (finished without a verdict: it failed before it could receive it)."""
        return next((h for h in order if h in self.takers.get(key, ()) and h not in gone), None)


def upload(b: Bundle, name: str) -> tuple[Part, str]:
    """(the part's bytes as a file to upload, its SHA-256 in the signed manifest)."""
    return b.part(name), b.parts[name]["sha256"]


def debs(b: Bundle, packages, version: str | None = None) -> list[str]:
    """The names of the .deb parts of `packages` (at `version` when given)."""
    return [p["path"] for n in packages for p in b.find("package", package=n, **({"version": version} if version else {}))]


def write(out: str, manifest: dict, parts_dir: str, key: str, say=print) -> None:
    """The tar: manifest.json, its signature, then each part from `parts_dir`; the size is said first."""
    raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
    total = sum(p["size"] for p in manifest["parts"]) + len(raw)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(out))).free
    say(f"writing {out}: {_size(total)} ({free // 1024**3} GiB free there)")
    if total > free:
        raise BundleError(f"{out} needs {_size(total)} and its disk has {_size(free)} free: write it elsewhere")
    with tempfile.TemporaryDirectory(prefix="nemofleet-sign-") as tmp:
        m = os.path.join(tmp, "manifest.json")
        with open(m, "wb") as f:
            f.write(raw)
        r = _keygen(["-q", "-Y", "sign", "-n", NAMESPACE, "-f", os.path.expanduser(key), m])
        if r.returncode:
            raise BundleError(f"ssh-keygen could not sign with {key} ({r.stderr.decode(errors='replace').strip()[:200]})")
        with tarfile.open(out + ".tmp", "w", format=tarfile.PAX_FORMAT) as t:
            t.add(m, "manifest.json")
            t.add(m + ".sig", "manifest.json.sig")
            for p in manifest["parts"]:
                t.add(os.path.join(parts_dir, p["path"]), p["path"])
        os.replace(out + ".tmp", out)


def show(b: Bundle) -> list[str]:
    """What a person reads before carrying the bundle in."""
    m = b.manifest
    lines = [f"bundle {b.path}: {m['format']}, made {m['created']} from {m.get('inventory')}, "
             f"{len(m['parts'])} parts, {_size(sum(p['size'] for p in m['parts']))}"]
    for h, p in sorted(m.get("plans", {}).items()):
        lines.append(f"  host {h}: " + ("gateway (HAProxy)" if p.get("gateway") else
                                        f"{p.get('model')} on {p.get('image')} (vLLM {p.get('vllm')}, {p.get('gpu')})"))
    for p in m["parts"]:
        if "/.cache/" in p["path"]:
            continue
        what = p.get("image") or (f"{p.get('repo')}@{(p.get('revision') or '')[:12]}" if p["purpose"] == "weights"
                                  else f"{p.get('package')} {p.get('version')}" if p["purpose"] == "package" else "")
        lines.append(f"  {p['purpose']:<8} {p['path']} {_size(p['size'])} sha256:{p['sha256'][:16]} {what} "
                     f"(serves {', '.join(p.get('serves', []))})")
    return lines


