"""`nemofleet bundle create|verify|show`: the bundle of nemofleet.bundle made from the plans of an
inventory's hosts, decided as `nemofleet plan` decides them (docs/air-gap.md).

The controller fetches each part as it can reach it: the image from the inventory's
vllm_image_archives or its own Docker (`docker save`), the weights from bundle_hf_endpoint (default
hf_endpoint), the toolkit's .deb files from bundle_apt_repo (default container_toolkit_repo),
HAProxy with `apt-get download` from its own apt sources. The parts are staged in FILE.parts/
(a re-run keeps each part it already verified), then written into one tar behind the signed
manifest, and the staging removed.

Layer: fleet (it reads the hosts' plans); the CLI hands it the specs and facts.
"""
from __future__ import annotations

import hashlib
import http.client
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

from . import driver
from ..bundle import CHUNK, FORMAT, MAX_MANIFEST, Bundle, BundleError, _sha256, _size, allowed_signers, show, weights_part, write

HTTP_TIMEOUT = 60  # seconds without a byte from the mirror before a fetch fails


def _plans(inventory: str, specs: dict, facts: dict, from_file: bool, say) -> dict:
    """{host: (Desired, Settings)} as `nemofleet plan` decides them; a refused host stops create."""
    from .. import inputs
    from ..desired import decide
    from ..spec import to_resolve

    commits = {} if from_file else (driver.resolve_commits(inventory, {h: to_resolve(sp) for h, sp in specs.items()
                                                                        if h in facts}) or {})
    hosts = [h for h in specs if h in facts and not specs[h].gateway]
    missing = [h for h in specs if h not in facts and not specs[h].gateway]
    if missing:
        raise BundleError(f"no facts for {', '.join(missing)} (unreachable, or not in the facts file): a bundle is "
                          "made for every host of the inventory")
    out: dict[str, tuple] = {}
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
        say(f"{h}: {d.plan.model.key if d.plan else '?'} on {d.image}")
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
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, cut short, a bad URL
        raise BundleError(f"could not fetch {url}: {getattr(exc, 'reason', None) or exc or type(exc).__name__}") from None


def _git_blob_sha1(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.sha1(b"blob %d\0" % os.path.getsize(path))).hexdigest()


class _Stage:
    """The parts as files under FILE.parts/ (kept until the bundle is written: a re-run reuses each
    part whose SHA-256 it recorded when it verified it)."""

    def __init__(self, out: str, say):
        self.dir, self.say = out + ".parts", say
        self.parts: dict[str, dict] = {}
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
        self.parts[name] = {"path": name, "size": os.path.getsize(p), "sha256": sha, **meta,
                            "serves": sorted(set(serves) | set(old["serves"] if old else ()))}


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
            member = t.extractfile("manifest.json")
            manifest = json.load(member) if member is not None else []
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


def create(inventory: str, out: str, specs: dict, facts: dict, from_file: bool = False, say=print) -> dict:
    """Collect, sign and write the bundle; returns its manifest. `specs`/`facts`: {host: HostSpec}
    and {host: HostFacts} of every host (read from the hosts, or a facts file when `from_file`)."""
    from ..bootstrap import TOOLKIT_PACKAGES

    t0 = time.monotonic()
    plans = _plans(inventory, specs, facts, from_file, say)
    key = next((s.bundle_signing_key_file for _, s in plans.values() if s.bundle_signing_key_file), None)
    if not key or not os.path.isfile(os.path.expanduser(key)):
        raise BundleError(f"bundle_signing_key_file {key or '(not set)'} is not a file: set it in group data to the "
                          "SSH private key that signs bundles (ssh-keygen -t ed25519)")
    images: dict[tuple, set] = {}
    weights: dict[tuple, set] = {}
    debs: dict[tuple, set] = {}
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


def main(a, read_facts, read_specs) -> int:
    """`nemofleet bundle create|verify|show`; a refusal is one sentence and exit 1. `read_facts`,
    `read_specs`: the CLI's readers of an inventory's facts (or --facts file) and specs."""
    try:
        if a.action == "create":
            specs = read_specs(a.inventory)
            create(a.inventory, a.output, specs, read_facts(a.inventory, a.facts), bool(a.facts),
                   say=lambda line: print(line, flush=True))
            return 0
        b = Bundle(a.file)
        if a.action == "show":
            print("\n".join(show(b)))
            return 0
        specs = read_specs(a.inventory) if a.inventory else None
        who = b.check_signature(allowed_signers(a.allowed_signers, specs))
        print(f"signature: good, by {who}")
        b.check_parts(say=lambda line: print(f"  {line}", flush=True))
        print(f"bundle {a.file}: every part matches the signed manifest")
        return 0
    except (BundleError, driver.FleetError) as exc:
        print(f"nemofleet bundle {a.action}: {exc}", file=sys.stderr)
        return 1
