"""One signed file that takes an air-gapped fleet to serving (docs/air-gap.md).

    nemofleet bundle create INVENTORY -o FILE [--facts FILE]   what the hosts' plans need, signed
    nemofleet bundle verify FILE [INVENTORY] [--allowed-signers F]
    nemofleet bundle show FILE

A bundle is an uncompressed tar: `manifest.json` first, `manifest.json.sig` (ssh-keygen -Y sign,
namespace NAMESPACE) second, then the parts, each listed in the manifest with its size, SHA-256,
purpose and the hosts it serves. The signature covers the manifest, the manifest covers every
byte: a reader checks the signature over a few KB, then each part's hash as it reads the part
(`verify` reads them all; the deploy checks each on the host it lands on, and reads nothing of a
part a host already has). Tar keeps each part's bytes contiguous at a known offset, so the deploy
streams a part to a host straight from the file (`Part`), never extracting it on the controller.

Parts: `images/<id>.tar` (a `docker save` archive, identity: its image ID), `weights/<dir>/<file>`
(huggingface_hub's local-dir layout with its `.cache/huggingface/download/*.metadata`, so the
host's own weights check confirms the commit and writes the completion marker), `debs/<file>.deb`.
Parts of other purposes (kernel wheels, compile caches) are carried and verified the same way and
ignored by the deploy (docs/air-gap.md says how to add them by hand).

Layer: controller, above desired/inputs (it plans hosts as `nemofleet plan` does).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request

NAMESPACE = "nemofleet-bundle"
FORMAT = "nemofleet-bundle/1"
DEFAULT_SIGNERS = "~/.config/nemofleet/allowed_signers"
CHUNK = 1 << 20
HTTP_TIMEOUT = 60  # seconds without a byte from the mirror before a fetch fails
SSH_KEYGEN_TIMEOUT = 60
MAX_MANIFEST = 64 << 20


class BundleError(Exception):
    """One sentence for the operator."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _size(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


# ---------------------------------------------------------------------------- reading


class Part(io.RawIOBase):
    """The bytes of one part inside the bundle, as a file (pyinfra uploads it as it would a file):
    opened at the first read, never before, so a host that needs nothing reads nothing."""

    def __init__(self, path: str, offset: int, size: int):
        super().__init__()
        self.path, self.offset, self.size, self.pos, self.f = path, offset, size, 0, None

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
        if self.f is None:
            self.f = open(self.path, "rb")
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        self.f.seek(self.offset + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        super().close()


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
            self.parts = {p["path"]: p for p in self.manifest["parts"]}
        except (ValueError, KeyError, TypeError):
            raise BundleError(f"the bundle {path} has a manifest that is not nemofleet's JSON") from None
        if self.manifest.get("format") != FORMAT:
            raise BundleError(f"the bundle {path} is of format {self.manifest.get('format')!r}; this nemofleet "
                              f"reads {FORMAT}")

    def read(self, name: str) -> bytes:
        offset, size = self.members[name]
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(size)

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
        for name, p in self.parts.items():
            if name not in self.members or self.members[name][1] != p["size"]:
                raise BundleError(f"the bundle {self.path} lacks its part {name} (or it has another size): refused")
            h = hashlib.sha256()
            with self.part(name) as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    h.update(chunk)
            if h.hexdigest() != p["sha256"]:
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


def needs(want, s) -> list[tuple[str, dict]]:
    """[(what, manifest match)] of the parts this host's Desired takes from a bundle."""
    out = [(f"the image {want.image}", {"purpose": "image", "image": want.image})]
    out += [(f"the weights {d.repo}@{d.revision[:12]}", {"purpose": "weights", "repo": d.repo, "revision": d.revision})
            for d in want.downloads]
    if s.install_container_toolkit:
        from .bootstrap import TOOLKIT_PACKAGES

        out += [(f"the package {n} {s.container_toolkit_version}",
                 {"purpose": "package", "package": n, "version": s.container_toolkit_version}) for n in TOOLKIT_PACKAGES]
    if want.front_door:
        out.append(("the package haproxy", {"purpose": "package", "package": "haproxy"}))
    return out


def refusals(b: Bundle, want, s) -> list[str]:
    """One sentence per part this host's plan needs that the bundle lacks (the deploy's preflight)."""
    if s.install_nvidia_driver:
        return ["install_nvidia_driver is set: a bundle does not carry the NVIDIA driver yet (its kernel headers "
                "and DKMS); install the driver first, or deploy this host without the bundle setting"]
    return [f"the bundle {b.path} lacks {what}, which this host's plan needs: make a new bundle from this inventory "
            "(nemofleet bundle create)" for what, match in needs(want, s) if not b.find(**match)]


# ---------------------------------------------------------------------------- create


def _plans(inventory: str, facts_file: str | None, say) -> dict:
    """{host: (Desired, Settings)} as `nemofleet plan` decides them; a refused host stops create."""
    from . import cli, inputs
    from .desired import decide
    from .fleet import driver
    from .spec import to_resolve

    facts = cli._facts_file(facts_file) if facts_file else cli.gather_facts(inventory, [])
    specs = cli.host_specs(inventory, [])
    commits = {} if facts_file else (driver.resolve_commits(inventory, {h: to_resolve(sp) for h, sp in specs.items()
                                                                         if h in facts}) or {})
    hosts = [h for h in specs if h in facts and not specs[h].gateway]
    missing = [h for h in specs if h not in facts and not specs[h].gateway]
    if missing:
        raise BundleError(f"no facts for {', '.join(missing)} (unreachable, or not in the facts file): a bundle is "
                          "made for every host of the inventory")
    out = {}
    every = inputs.gather(specs, facts, hosts=hosts, commits=commits, operator=driver.operator())
    for h, i in every.items():
        if i.settings is not None and i.settings.install_nvidia_driver:
            raise BundleError(f"{h} sets install_nvidia_driver: a bundle does not carry the NVIDIA driver yet (its "
                              "kernel headers and DKMS); install the driver first or leave the host out")
        d = decide(i)
        if not d.ok:
            raise BundleError(f"{h} is refused by its plan ({'; '.join(d.refusals)[:300]}): fix it first "
                              "(nemofleet plan), a bundle carries what a plan that can run needs")
        out[h] = (d, i.settings)
        say(f"{h}: {d.plan.model.key} on {d.image}")
    # the gateway's hosts need HAProxy too
    for h, sp in specs.items():
        if sp.gateway and sp.settings is not None:
            out[h] = (None, sp.settings)
    return out


def _get(url: str, dest: str | None = None):
    """GET `url` (to `dest` when given, else the body); one sentence when it cannot be fetched."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "nemofleet"}),
                                    timeout=HTTP_TIMEOUT) as r:
            if dest is None:
                return r.read(MAX_MANIFEST)
            with open(dest + ".part", "wb") as f:
                shutil.copyfileobj(r, f, CHUNK)
            os.replace(dest + ".part", dest)
    except OSError as exc:
        raise BundleError(f"could not fetch {url}: {getattr(exc, 'reason', None) or exc}") from None


def _git_blob_sha1(path: str) -> str:
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class _Stage:
    """The parts as files under FILE.parts/ (kept until the bundle is written: a re-run reuses each
    part whose SHA-256 it recorded when it verified it)."""

    def __init__(self, out: str, say):
        self.dir, self.say, self.parts = out + ".parts", say, {}
        os.makedirs(self.dir, exist_ok=True)

    def path(self, name: str) -> str:
        p = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def done(self, name: str) -> bool:
        """The part is here from an earlier run, its bytes matching the hash recorded then."""
        p, rec = self.path(name), self.path(name) + ".sha256"
        if os.path.isfile(p) and os.path.isfile(rec) and open(rec).read().strip() == _sha256(p):
            self.say(f"  {name}: already here (resumed)")
            return True
        return False

    def add(self, name: str, serves: set, **meta) -> None:
        p = self.path(name)
        sha = _sha256(p)
        with open(p + ".sha256", "w") as f:
            f.write(sha)
        old = self.parts.get(name)
        serves = sorted(set(serves) | set(old["serves"] if old else ()))
        self.parts[name] = {"path": name, "size": os.path.getsize(p), "sha256": sha, **meta, "serves": serves}


def _image(stage: _Stage, ref: str, archive: str | None, hosts: set) -> None:
    """The image as a `docker save` archive (the inventory's vllm_image_archives entry when it has
    one, else `docker save` from this controller's Docker); its identity is its image ID."""
    tmp = stage.path(f"images/.{ref.replace('/', '_').replace(':', '_')}.tar")
    if not (archive and os.path.isfile(os.path.expanduser(archive))):
        stage.say(f"  docker save {ref}")
        with open(tmp, "wb") as f:
            r = subprocess.run(["docker", "save", ref], stdout=f, stderr=subprocess.PIPE, timeout=3600)
        if r.returncode:
            raise BundleError(f"docker save {ref} failed on this controller ({r.stderr.decode(errors='replace').strip()[:200]}): "
                              "pull the image here first, or name its archive in vllm_image_archives")
        archive = tmp
    archive = os.path.expanduser(archive)
    try:
        with tarfile.open(archive, "r:") as t:
            manifest = json.load(t.extractfile("manifest.json"))
        image_id = "sha256:" + os.path.basename(manifest[0]["Config"]).removesuffix(".json")
        tags = [tag for m in manifest for tag in m.get("RepoTags") or []]
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError, IndexError):
        raise BundleError(f"{archive} is not a `docker save` archive (no readable manifest.json)") from None
    if ref not in tags:
        raise BundleError(f"the archive {archive} does not hold {ref} (it holds {', '.join(tags) or 'no tag'})")
    name = f"images/{image_id.split(':')[1][:16]}.tar"
    if not stage.done(name):
        stage.say(f"  {name}: {ref} ({image_id[:19]})")
        shutil.copyfile(archive, stage.path(name))
    if archive == tmp:
        os.unlink(tmp)
    stage.add(name, hosts, purpose="image", image=ref, image_id=image_id)


def _weights(stage: _Stage, endpoint: str, repo: str, rev: str, directory: str, hosts: set) -> None:
    """Every file of repo@rev from the mirror, each verified as the deploy verifies it (an LFS
    file's SHA-256, any other's git blob id, against the mirror's tree), with huggingface_hub's
    local-dir metadata (commit, etag), so the host's weights check accepts it as this commit."""
    base = endpoint.rstrip("/")
    q = urllib.parse.quote
    try:
        tree = json.loads(_get(f"{base}/api/models/{repo}/tree/{q(rev)}?recursive=true"))
        files = [(e["path"], e["size"], (e.get("lfs") or {}).get("oid"), e["oid"]) for e in tree if e.get("type") == "file"]
    except (ValueError, KeyError, TypeError):
        raise BundleError(f"{base} answered the file list of {repo}@{rev[:12]} with something other than the Hub's "
                          "JSON") from None
    for rel, size, sha256, oid in files:
        name = weights_part(directory, rel)
        if not stage.done(name):
            stage.say(f"  {name} ({_size(size)})")
            _get(f"{base}/{repo}/resolve/{rev}/{q(rel)}", stage.path(name))
            got = _sha256(stage.path(name)) if sha256 else _git_blob_sha1(stage.path(name))
            if got != (sha256 or oid):
                raise BundleError(f"{rel} of {repo}@{rev[:12]} from {base} does not match its hash in the mirror's "
                                  "file list: not bundled (run again to fetch it anew)")
        stage.add(name, hosts, purpose="weights", repo=repo, revision=rev, file=rel)
        meta = weights_part(directory, f".cache/huggingface/download/{rel}.metadata")
        with open(stage.path(meta), "w") as f:
            f.write(f"{rev}\n{sha256 or oid}\n{time.time()}\n")
        stage.add(meta, hosts, purpose="weights", repo=repo, revision=rev, file=f".cache/huggingface/download/{rel}.metadata")


def _debs(stage: _Stage, repo: str, names: list[str], version: str, hosts: set) -> None:
    """The toolkit's .deb files at `version` from its flat apt repository, each checked against the
    SHA256 of the repository's Packages index."""
    base = repo.replace("$(ARCH)", "amd64").rstrip("/")
    index = _get(f"{base}/Packages").decode(errors="replace")
    stanzas = [dict(line.split(": ", 1) for line in block.splitlines() if ": " in line) for block in index.split("\n\n")]
    for n in names:
        found = [st for st in stanzas if st.get("Package") == n and st.get("Version") == version]
        if not found:
            raise BundleError(f"{base} has no package {n} at version {version}: check container_toolkit_version")
        name = f"debs/{os.path.basename(found[0]['Filename'])}"
        if not stage.done(name):
            stage.say(f"  {name}")
            _get(f"{base}/{found[0]['Filename'].removeprefix('./')}", stage.path(name))
            if _sha256(stage.path(name)) != found[0].get("SHA256"):
                raise BundleError(f"{name} from {base} does not match the SHA256 of the repository's index")
        stage.add(name, hosts, purpose="package", package=n, version=version)


def _apt_download(stage: _Stage, package: str, hosts: set) -> None:
    """A distribution package (HAProxy) with `apt-get download` from this controller's own sources."""
    with tempfile.TemporaryDirectory(prefix="nemofleet-deb-") as tmp:
        r = subprocess.run(["timeout", "600", "apt-get", "download", "-q", package], cwd=tmp, capture_output=True)
        debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
        if r.returncode or not debs:
            raise BundleError(f"apt-get download {package} failed on this controller: give this controller a "
                              "Debian mirror, or add the .deb by hand (docs/air-gap.md)")
        name = f"debs/{debs[0]}"
        shutil.move(os.path.join(tmp, debs[0]), stage.path(name))
    stage.add(name, hosts, purpose="package", package=package, version=debs[0].split("_")[1])


def create(inventory: str, out: str, facts_file: str | None, say=print) -> dict:
    """Collect, sign and write the bundle; returns its manifest."""
    from .bootstrap import TOOLKIT_PACKAGES

    t0 = time.monotonic()
    plans = _plans(inventory, facts_file, say)
    key = next((s.bundle_signing_key_file for _, s in plans.values() if s.bundle_signing_key_file), None)
    if not key or not os.path.isfile(os.path.expanduser(key)):
        raise BundleError(f"bundle_signing_key_file {key or '(not set)'} is not a file: set it in group data to the "
                          "SSH private key that signs bundles (ssh-keygen -t ed25519)")
    images, weights, debs = {}, {}, {}
    for h, (d, s) in plans.items():
        if d is not None:
            images.setdefault((d.image, s.vllm_image_archive or s.vllm_image_archives.get(d.image)), set()).add(h)
            for w in d.downloads:
                ep = s.bundle_hf_endpoint or s.hf_endpoint or "https://huggingface.co"
                weights.setdefault((ep, w.repo, w.revision, w.directory), set()).add(h)
        if s.install_container_toolkit:
            debs.setdefault(("toolkit", s.bundle_apt_repo or s.container_toolkit_repo, s.container_toolkit_version),
                            set()).add(h)
        if d is None or d.front_door:
            debs.setdefault(("haproxy", None, None), set()).add(h)
    stage = _Stage(out, say)
    say(f"collecting {len(images)} image(s), {len(weights)} model(s), {len(debs)} package set(s) in {stage.dir}")
    for (ref, archive), hosts in images.items():
        _image(stage, ref, archive, hosts)
    for (ep, repo, rev, directory), hosts in weights.items():
        _weights(stage, ep, repo, rev, directory, hosts)
    for (what, repo, version), hosts in debs.items():
        if what == "toolkit":
            _debs(stage, repo, TOOLKIT_PACKAGES, version, hosts)
        else:
            _apt_download(stage, what, hosts)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "inventory": os.path.basename(inventory),
                "plans": {h: {"model": f"{d.plan.model.repo}@{d.downloads[0].revision if d.downloads else ''}",
                              "image": d.image, "vllm": d.plan.vllm_version,
                              "gpu": ", ".join(sorted({i.gpu_label for i in d.plan.instances}))}
                          if d is not None else {"gateway": True} for h, (d, _) in plans.items()},
                "parts": sorted(stage.parts.values(), key=lambda p: p["path"])}
    write(out, manifest, stage.dir, key, say)
    say(f"bundle {out}: {len(manifest['parts'])} parts, {_size(os.path.getsize(out))}, "
        f"made in {time.monotonic() - t0:.1f} s")
    shutil.rmtree(stage.dir)
    return manifest


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
                                        f"{p['model']} on {p['image']} (vLLM {p['vllm']}, {p['gpu']})"))
    for p in m["parts"]:
        if "/.cache/" in p["path"]:
            continue
        what = p.get("image") or (f"{p.get('repo')}@{p.get('revision', '')[:12]}" if p["purpose"] == "weights"
                                  else f"{p.get('package')} {p.get('version')}" if p["purpose"] == "package" else "")
        lines.append(f"  {p['purpose']:<8} {p['path']} {_size(p['size'])} sha256:{p['sha256'][:16]} {what} "
                     f"(serves {', '.join(p['serves'])})")
    return lines


def main(a) -> int:
    """`nemofleet bundle create|verify|show`; a refusal is one sentence and exit 1."""
    try:
        if a.action == "create":
            if not a.output:
                raise BundleError("bundle create needs -o FILE: where to write the bundle")
            create(a.inventory, a.output, a.facts, say=lambda line: print(line, flush=True))
            return 0
        b = Bundle(a.file)
        if a.action == "show":
            print("\n".join(show(b)))
            return 0
        from .fleet import driver

        specs = driver.host_specs(a.inventory, []) if a.inventory else None
        who = b.check_signature(allowed_signers(a.allowed_signers, specs))
        print(f"signature: good, by {who}")
        b.check_parts(say=lambda line: print(f"  {line}", flush=True))
        print(f"bundle {a.file}: every part matches the signed manifest")
        return 0
    except BundleError as exc:
        print(f"nemofleet bundle {a.action}: {exc}", file=sys.stderr)
        return 1
